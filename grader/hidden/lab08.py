"""Lab 08: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab08`.
"""

from __future__ import annotations

from grader.registry import hidden
from grader.trtllm_legacy import RENAMED
from grader.trtllm_legacy import legacy_to_llm_api as _REF_LEGACY
from lab_utils.grading.checks import close, frac_wrong, partial
from lab_utils.grading.questions.lab08 import PROJS as _PROJS
from lab_utils.grading.questions.lab08 import _check_group, _plain
from lab_utils.trtllm.plan import concurrent_sequences as _REF_SEQS

GiB = 1 << 30


PREDICT_RTOL = 1e-3


def _ref_group(w, bits, g):
    import torch

    qmax = 2 ** (bits - 1) - 1
    wg = w.reshape(w.shape[0], -1, g)
    scale = (wg.abs().amax(dim=2, keepdim=True) / qmax).clamp(min=1e-12)
    q = torch.clamp(torch.round(wg / scale), -qmax, qmax)
    return (q * scale).reshape(w.shape)


def _group_case(fn, w, bits, g) -> bool:
    """True when fn quantizes w validly and as accurately as the absmax scale."""
    import torch

    if _check_group(fn, w, bits, g) is not None:
        return False
    q, scale = fn(w.clone(), bits, g)
    q, scale = torch.as_tensor(q).double(), torch.as_tensor(scale).double()
    out, inp = w.shape
    w_hat = (q.reshape(out, -1, g) * scale.unsqueeze(-1)).reshape(out, inp)
    mse = float((w.double() - w_hat).pow(2).mean())
    ref = float((w.double() - _ref_group(w, bits, g).double()).pow(2).mean())
    return mse <= ref * 1.01 + 1e-15


def _ref_bytes(inp, out, fmt, g=128):
    n = inp * out
    if fmt == "fp16":
        return 2 * n
    if fmt == "fp8":
        return n
    if fmt == "int4":
        return -(-n // 2) + out * -(-inp // g) * 2
    if fmt == "nvfp4":
        return -(-n // 2) + -(-n // 16) + 4
    raise ValueError(fmt)


def _ref_predict(w, bits, g):
    """Uniform rounding over each group's step, every value weighted the same (short last group too)."""
    import torch

    qmax = 2 ** (bits - 1) - 1
    out, inp = w.shape
    pad = -inp % g
    wp = torch.nn.functional.pad(w.double(), (0, pad)) if pad else w.double()
    scale = wp.reshape(out, -1, g).abs().amax(dim=2) / qmax  # (out, groups)
    sizes = torch.full((scale.shape[1],), float(g), dtype=torch.float64)
    sizes[-1] = g - pad
    return float(((scale.pow(2) * sizes).sum() / (12 * out * inp)).sqrt())


@hidden("08.group_quantize")
def _(group_quantize, rng, scenario):
    import torch

    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    wrong, n = 0, 16
    for _ in range(n):
        g = rng.choice([8, 16, 32, 64, 128])
        w = torch.randn(rng.randint(1, 40), g * rng.randint(1, 8), generator=gen) * rng.choice(
            [0.01, 1.0, 30.0]
        )
        if rng.random() < 0.5:  # an outlier somewhere
            w[rng.randrange(w.shape[0]), rng.randrange(w.shape[1])] *= 50
        try:
            wrong += not _group_case(group_quantize, w, rng.choice([2, 3, 4, 8]), g)
        except Exception:
            wrong += 1
    frac_wrong(wrong, n, "unseen random matrices")


@hidden("08.matrix_bytes")
def _(matrix_bytes, rng, scenario):
    wrong, n = 0, 24
    for _ in range(n):
        fmt = rng.choice(["fp16", "fp8", "int4", "nvfp4"])
        inp, out, g = (
            rng.choice([576, 1536, 4096, 5120, 14336, 3000]),
            rng.randint(1, 20000),
            rng.choice([32, 64, 128]),
        )
        wrong += int(matrix_bytes(inp, out, fmt, g)) != _ref_bytes(inp, out, fmt, g)
    frac_wrong(wrong, n)


def _spec(scen):
    from lab_utils.memory import ModelSpec

    return ModelSpec(**scen["model"])


def _scenario_inputs(scen):
    """(gpu bytes, weight bytes, other bytes, kv bytes per token) for the scenario, computed here."""
    from lab_utils.memory import GPUS

    spec = _spec(scen)
    rest = (spec.embedding_params + spec.small_params) * 2
    mats = [(i, o) for i, o in spec.linear_shapes()]
    if scen["weights"] == "fp16":
        w = spec.num_params * 2
    elif scen["weights"] == "fp8":
        w = spec.linear_params + rest
    elif scen["weights"] == "nvfp4":
        w = rest + spec.num_layers * sum(_ref_bytes(i, o, "nvfp4") for i, o in mats)
    else:  # int4_awq as lab 01 counts it: packed values, FP16 scale and 4-bit zero per group of 128 rows

        def awq(i, o):
            groups = -(-i // 128)
            return -(-i * o // 2) + groups * o * 2 + -(-groups * o // 2)

        w = rest + spec.num_layers * sum(awq(i, o) for i, o in mats)
    per_token = (
        2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * (1 if scen["kv_dtype"] == "fp8" else 2)
    )
    return GPUS[scen["gpu"]].memory_bytes, w, int(scen["other_gib"] * GiB), per_token


def _random_gpu(rng) -> tuple[int, int, int, int]:
    """An unseen case's memory: GPU bytes, weight bytes, other bytes, KV bytes per token."""
    per_token = 2 * rng.randint(1, 80) * rng.choice([1, 2, 8]) * 128 * rng.choice([1, 2])
    return (
        rng.choice([24, 48, 80, 141]) * GiB,
        rng.randint(1, 60) * GiB // 2,
        rng.randint(1, 4) * GiB,
        per_token,
    )


def _hidden_scenarios(rng, n):
    from lab_utils.grading import lab_scenario

    return [lab_scenario("08", rng.randrange(10**9)) for _ in range(n)]


def _scenario_want(scen) -> int:
    gpu, w, other, per_token = _scenario_inputs(scen)
    return _REF_SEQS(gpu, w, other, scen["fraction"], per_token, scen["seq_len"], scen["tokens_per_block"])


@hidden("08.max_sequences")
def _(max_sequences, scenario_sequences, rng, scenario):
    wrong, n = 0, 20
    for _ in range(n):
        gpu, weights, other, per_token = _random_gpu(rng)
        fraction = rng.choice([0.5, 0.7, 0.9, 0.95])
        case = (gpu, weights, other, fraction, per_token, rng.randint(100, 40_000), rng.choice([16, 32, 64]))
        wrong += int(max_sequences(*case)) != _REF_SEQS(*case)
    frac_wrong(wrong, n)
    scens = [dict(scenario)] + _hidden_scenarios(rng, 11)
    passed = 0
    for scen in scens:
        try:
            passed += int(scenario_sequences(dict(scen))) == _scenario_want(scen)
        except Exception:
            pass
    return partial(passed, len(scens), "scenarios (scenario_sequences)")


def _ref_fraction(gpu, weights, other, per_token, seq_len, tpb, n_seq):
    for k in range(1, 101):
        if _REF_SEQS(gpu, weights, other, k / 100, per_token, seq_len, tpb) >= n_seq:
            return k / 100
    return None


@hidden("08.fraction_needed")
def _(fraction_needed, rng, scenario):
    wrong, n = 0, 20
    for _ in range(n):
        case = (*_random_gpu(rng), rng.randint(100, 40_000), rng.choice([16, 32, 64]), rng.randint(1, 300))
        want, got = _ref_fraction(*case), fraction_needed(*case)
        wrong += (want is None) != (got is None) or (want is not None and not close(got, want, 1e-9))
    frac_wrong(wrong, n)


_DROPPED = (  # a few of grader.trtllm_legacy.LEGACY_DROPPED, drawn into random flag sets
    "use_gpt_attention_plugin",
    "use_gemm_plugin",
    "use_rmsnorm_plugin",
    "enable_context_fmha",
    "use_paged_context_fmha",
    "remove_input_padding",
    "paged_kv_cache",
    "multiple_profiles",
)


def _random_flags(rng):
    flags = {}
    for k in rng.sample(sorted(RENAMED), rng.randint(2, 7)):
        if k == "kv_cache_free_gpu_mem_fraction":
            flags[k] = rng.choice([0.5, 0.8, 0.9])
        elif k in ("enable_kv_cache_reuse", "enable_chunked_context"):
            flags[k] = rng.choice([True, False])
        elif k == "dtype":
            flags[k] = rng.choice(["float16", "bfloat16"])
        elif k == "kv_cache_dtype":
            flags[k] = "fp8"
        else:
            flags[k] = rng.choice([1, 2, 4, 8, 32, 64, 256, 4096, 8192])
    for k in rng.sample(_DROPPED, rng.randint(0, 3)):
        flags[k] = rng.choice(["float16", "enable", True])
    if "max_seq_len" not in flags and rng.random() < 0.5:
        flags["max_input_len"], flags["max_output_len"] = rng.choice([512, 2048]), rng.choice([128, 1024])
    return flags


@hidden("08.legacy_to_llm_api")
def _(legacy_to_llm_api, rng, scenario):
    cases = [dict(scenario["legacy_flags"])] + [_random_flags(rng) for _ in range(15)]
    wrong = sum(_plain(legacy_to_llm_api(dict(c))) != _plain(_REF_LEGACY(c)) for c in cases)
    frac_wrong(wrong, len(cases), "flag sets (the scenario's and unseen ones)")


def _course_matrix(layer: int, proj: str):
    from safetensors import safe_open

    from lab_utils.models import course_model_path

    with safe_open(str(course_model_path(verify=False) / "model.safetensors"), "pt") as f:
        return f.get_tensor(f"model.layers.{layer}.{proj}.weight").float()


@hidden("08.predicted_rms")
def _(predict_rms_error, rng, scenario):
    import torch

    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    wrong, n = 0, 12
    for i in range(n):
        g = rng.choice([8, 16, 32, 64])
        inp = g * rng.randint(1, 6) + (rng.randint(1, g - 1) if i % 2 else 0)  # half with a short last group
        w = torch.randn(rng.randint(1, 30), inp, generator=gen) * rng.choice([0.02, 1.0])
        bits = rng.choice([3, 4, 8])
        wrong += not close(predict_rms_error(w, bits, g), _ref_predict(w, bits, g), 1e-6)
    # the course model's own matrices, at group sizes the notebook never tried (128 leaves a short group)
    for layer, proj, g in [(scenario["layer"], scenario["proj"], scenario["group_sizes"][0])] + [
        (rng.randrange(30), rng.choice(_PROJS), rng.choice([24, 48, 128, 160])) for _ in range(2)
    ]:
        w = _course_matrix(layer, proj)
        n += 1
        wrong += not close(predict_rms_error(w, 4, g), _ref_predict(w, 4, g), PREDICT_RTOL)
    frac_wrong(wrong, n, "unseen matrices (random ones and the course model's)")


def _ref_best(results, max_bytes, min_agreement):
    best, best_nll = None, None
    for r in results:
        if r["bits"] != 4 or r["weight_bytes"] > max_bytes:
            continue
        if sum(r["agreement_bits"]) / len(r["agreement_bits"]) < min_agreement:
            continue
        mean_nll = sum(r["nll"]) / len(r["nll"])
        if best is None or mean_nll < best_nll:
            best, best_nll = r["scheme"], mean_nll
    return best


def _random_results(rng) -> list[dict]:
    """Results of an unseen quantisation run: schemes, sizes, raw agreement bits and per-token NLLs."""
    out = []
    n_bits = rng.choice([16, 48, 96])
    n_tok = rng.choice([40, 160, 300])
    names = ["float32", "int8 per-tensor", "int8 per-channel", "int4 per-channel"]
    groups = sorted(rng.sample([16, 32, 64, 96, 128, 192, 256], rng.randint(1, 4)))
    names += [f"int4 g{g}" for g in groups] + [f"int4 g{groups[-1]} + AWQ"]
    for name in names:
        bits = None if name == "float32" else int(name[3])
        quality = {None: 0.0, 8: 0.05, 4: 0.4}[bits] * rng.uniform(0.3, 1.5)
        mb = {None: 270.0, 8: 163.0, 4: 110.0}[bits] + (rng.uniform(0, 14) if bits == 4 else 0)
        length = n_tok if rng.random() < 0.7 else rng.choice([40, 120, 500])  # some runs were cut short
        nll = [max(0.0, rng.gauss(2.0 + quality, 1.2)) for _ in range(length)]
        agree = [int(rng.random() < 1 - quality) for _ in range(n_bits)]
        out.append(
            {
                "scheme": name,
                "bits": bits,
                "weight_bytes": int(mb * 1e6),
                "agreement_bits": agree,
                "nll": [round(x, 4) for x in nll],
            }
        )
    rng.shuffle(out)
    return out


@hidden("08.quant_run")
def _(best_int4, rng, scenario):
    wrong, n = 0, 20
    for _ in range(n):
        results = _random_results(rng)
        sizes = sorted(r["weight_bytes"] for r in results if r["bits"] == 4)
        budget = rng.choice([sizes[0] - 1, sizes[len(sizes) // 2], sizes[-1] + 1, 10**12])
        agree = rng.choice([0.0, 0.3, 0.5, 0.7])
        want = _ref_best(results, budget, agree)
        got = best_int4([dict(r) for r in results], budget, agree)
        wrong += (got is None) != (want is None) or (want is not None and str(got) != want)
    frac_wrong(wrong, n, "unseen quantisation runs")
