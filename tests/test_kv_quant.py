"""The quantized KV cache (engine/kv_quant.py), its quality measurement (engine/kv_quality.py) and
the accuracy gate (lab_utils/accuracy_gate.py).

Exact behaviour on tiny configs: int8's round-trip bound, fp8's rounding and saturation, bytes per
token with scales, exactly twice the blocks of bf16 for fp8 at one budget, the fast path equal to
the readable one on a quantized cache, prefix caching and copy-on-write carrying the scales, and
exact binomial intervals checked against closed forms. The course model's agreement is slow.
"""

from __future__ import annotations

import json
import math

import pytest

from lab_utils.accuracy_gate import clopper_pearson, gate_agreement, gate_paired, paired_bootstrap
from lab_utils.engine import EngineConfig, LLMEngine, SamplingParams
from lab_utils.engine.kv_quant import (
    KV_CACHE_DTYPES,
    dequantize_kv,
    engine_kv_bytes_per_token,
    kv_cache_dtype,
    quantize_kv,
)
from lab_utils.engine.llama import AttentionMetadata, LlamaConfig, LlamaModel
from lab_utils.engine.model_runner import ModelRunner

torch = pytest.importorskip("torch")

QUANTIZED = ["fp8_e4m3", "fp8_e5m2", "int8"]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 2-layer Llama with random weights: head_dim 32, 4 query heads sharing 2 KV heads."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tiny_llama_kvq")
    hidden, heads, kv_heads, dim, inter, vocab, layers = 128, 4, 2, 32, 256, 512, 2
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": dim,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "eos_token_id": 0,
    }
    (folder / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=0.08):
        return torch.randn(*shape, generator=gen) * scale

    weights = {
        "model.embed_tokens.weight": rand(vocab, hidden, scale=1.0),
        "model.norm.weight": 1 + rand(hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": 1 + rand(hidden),
            p + "post_attention_layernorm.weight": 1 + rand(hidden),
            # larger K/Q weights than test_engine_fast's: attention that is not uniform, so
            # rounding K changes something
            p + "self_attn.q_proj.weight": rand(heads * dim, hidden, scale=0.3),
            p + "self_attn.k_proj.weight": rand(kv_heads * dim, hidden, scale=0.3),
            p + "self_attn.v_proj.weight": rand(kv_heads * dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * dim),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
        }
    save_file(weights, str(folder / "model.safetensors"))
    return folder


class Ids:
    """A tokenizer stand-in: the prompts are token ids already."""

    def encode(self, text):
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _engine(folder, **kw):
    args = dict(tokenizer=Ids(), dtype="float32", device="cpu", max_num_seqs=4, max_num_batched_tokens=64)
    return LLMEngine(folder, **(args | kw))


def _greedy(eng, prompts, n=12):
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return [o.outputs[0].token_ids for o in eng.generate(prompts, params)]


def _prompts(seed=2, lengths=(3, 40, 17, 70, 8)):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 512, (n,), generator=gen).tolist() for n in lengths]


# --- storage: round trips and bytes -----------------------------------------------------------


def test_int8_round_trip_error_is_at_most_half_a_step_per_token_and_head():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, 64, generator=gen) * torch.logspace(-3, 2, 50).view(50, 1, 1)
    x[7, 1] = 0  # an all-zero head vector must come back as zeros, not NaN
    kvd = kv_cache_dtype("int8")
    q, scale = quantize_kv(x, kvd)
    assert q.dtype == torch.int8 and q.shape == x.shape and scale.shape == (50, 3)
    back = dequantize_kv(q, scale, kvd, torch.float32)
    step = x.abs().amax(-1) / 127  # (T, Hkv)
    assert torch.all((back - x).abs() <= step.unsqueeze(-1) / 2 * (1 + 1e-5) + 1e-12)
    assert torch.equal(back[7, 1], torch.zeros(64))
    assert torch.all(q.abs().amax(-1)[step > 0] == 127)  # every nonzero vector's peak maps to +-127


@pytest.mark.parametrize(("name", "mantissa_bits", "top"), [("fp8_e4m3", 3, 448.0), ("fp8_e5m2", 2, 57344.0)])
def test_fp8_rounds_to_its_mantissa_and_saturates(name, mantissa_bits, top):
    kvd = kv_cache_dtype(name)
    x = torch.linspace(0.05, 20, 1000).view(10, 2, 50)  # normal numbers of both formats
    q, scale = quantize_kv(x, kvd)
    assert scale is None and q.element_size() == 1
    rel = ((dequantize_kv(q, None, kvd, torch.float32) - x).abs() / x).max()
    assert rel <= 2.0 ** -(mantissa_bits + 1) + 1e-6  # round to nearest: half a step
    assert rel > 2.0 ** -(mantissa_bits + 3)  # and it really is that coarse
    big = torch.tensor([[[1e6, -1e6]]])
    assert dequantize_kv(quantize_kv(big, kvd)[0], None, kvd, torch.float32).tolist() == [[[top, -top]]]


def test_kv_cache_dtype_names_resolve_like_vllm():
    assert kv_cache_dtype("fp8").name == "fp8_e4m3"  # vLLM: fp8 means e4m3
    assert kv_cache_dtype("auto", torch.bfloat16).name == "bfloat16"
    assert kv_cache_dtype("auto").name == "float32"
    assert [kv_cache_dtype(n).quantized for n in ("float32", "bfloat16", *QUANTIZED)] == [False] * 2 + [
        True
    ] * 3
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        kv_cache_dtype("int4")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineConfig(kv_cache_dtype="fp4")
    assert set(KV_CACHE_DTYPES) >= {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8"}


def test_bytes_per_token_of_the_course_models_shape():
    """SmolLM2-135M: 30 layers, 3 KV heads of 64. int8 pays a float32 scale per token and head."""
    cfg = LlamaConfig(30, 576, 9, 3, 64, 1536, 49152, 1e-5, 1e5, 8192, True)
    got = {n: engine_kv_bytes_per_token(cfg, kv_cache_dtype(n)) for n in ("float32", "bfloat16", *QUANTIZED)}
    assert got == {
        "float32": 46080,
        "bfloat16": 23040,
        "fp8_e4m3": 11520,
        "fp8_e5m2": 11520,
        "int8": 2 * 30 * 3 * (64 + 4),  # 12240
    }
    assert got["float32"] == cfg.kv_bytes_per_token(4)  # the model's own count, unchanged


@pytest.mark.parametrize("fast", [False, True])
def test_fp8_holds_exactly_twice_the_blocks_of_bf16_at_one_budget(tiny_model, fast):
    """Tiny model: 2 layers x 2 KV heads x 32: bf16 512 B/token, fp8 256, int8 288 (scales)."""
    budget_gib = 1 / 1024  # 1 MiB
    blocks = {
        n: _engine(tiny_model, kv_cache_dtype=n, kv_cache_gib=budget_gib, block_size=16, fast=fast).num_blocks
        for n in ("float32", "bfloat16", "fp8", "fp8_e5m2", "int8")
    }
    assert blocks == {
        "float32": 64,
        "bfloat16": 128,
        "fp8": 256,
        "fp8_e5m2": 256,
        "int8": 2**20 // (288 * 16),
    }
    assert blocks["fp8"] == 2 * blocks["bfloat16"] and blocks["int8"] == 227


# --- the engine with a quantized cache ---------------------------------------------------------


def test_float32_kv_gives_the_unchanged_engines_tokens(tiny_model):
    """kv_cache_dtype "auto" (the default) and "float32" store what they always stored."""
    prompts = _prompts()
    auto = _greedy(_engine(tiny_model, fast=False, block_size=4, num_kv_blocks=256), prompts)
    f32 = _greedy(
        _engine(tiny_model, fast=False, block_size=4, num_kv_blocks=256, kv_cache_dtype="float32"), prompts
    )
    assert auto == f32
    eng = _engine(tiny_model, fast=False, block_size=4, num_kv_blocks=256)
    assert eng.model_runner.model.k_cache[0].dtype == torch.float32 and eng.model_runner.model.k_scale == []


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_cache_stores_its_dtype_and_agrees_on_most_tokens(tiny_model, name):
    prompts = _prompts()
    base = _greedy(_engine(tiny_model, fast=False, block_size=4, num_kv_blocks=256), prompts)
    eng = _engine(tiny_model, fast=False, block_size=4, num_kv_blocks=256, kv_cache_dtype=name)
    model = eng.model_runner.model
    assert model.k_cache[0].dtype == kv_cache_dtype(name).torch_dtype()
    assert (model.k_scale != []) == (name == "int8")
    got = _greedy(eng, prompts)
    same = sum(a == b for x, y in zip(base, got) for a, b in zip(x, y))
    total = sum(len(x) for x in base)
    assert same / total >= 0.75, (name, same, total)


@pytest.mark.parametrize("name", QUANTIZED)
def test_fast_path_attends_a_quantized_cache_like_the_readable_path(tiny_model, name):
    """Same logits within float32 rounding, block size 16 (where the fast path would use vLLM's kernel)."""
    from lab_utils.engine.request import Request
    from lab_utils.engine.scheduler import SchedulerOutput

    runners = []
    for fast in (False, True):
        r = ModelRunner(tiny_model, device="cpu", dtype=torch.float32, fast=fast, kv_cache_dtype=name)
        r.initialize_kv_cache(16, 16)
        runners.append(r)
    assert not runners[1].model.paged_kernel  # quantized: the readable layout and attention
    prompts = _prompts(seed=3, lengths=(21, 9))
    reqs = {f"r{i}": Request(f"r{i}", p, SamplingParams(temperature=0)) for i, p in enumerate(prompts)}
    tables = {"r0": [1, 2], "r1": [3]}
    for step in range(3):
        plan = {rid: (len(req.prompt_token_ids) if step == 0 else 1) for rid, req in reqs.items()}
        so = SchedulerOutput(
            num_scheduled_tokens=plan,
            req_ids=list(plan),
            num_computed_tokens={r: reqs[r].num_computed_tokens for r in plan},
            block_tables=tables,
        )
        logits = []
        for runner in runners:
            inputs = runner.prepare_inputs(so, reqs)
            with torch.inference_mode():
                logits.append(runner.model.forward(*inputs[:4]))
        torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)
        for rid, tok in zip(inputs[4], logits[0].argmax(-1).tolist()):
            reqs[rid].num_computed_tokens += plan[rid]
            reqs[rid].append_output_token(tok)


def test_fast_and_readable_engines_give_the_same_tokens_with_int8(tiny_model):
    prompts = _prompts()
    outs = [
        _greedy(_engine(tiny_model, fast=f, block_size=16, num_kv_blocks=64, kv_cache_dtype="int8"), prompts)
        for f in (False, True)
    ]
    assert outs[0] == outs[1]


@pytest.mark.parametrize("name", ["fp8_e4m3", "int8"])
def test_prefix_cache_hits_read_the_same_quantized_blocks(tiny_model, name):
    """Cached blocks are read back with their scales: caching on or off, the same tokens."""
    prompts = _prompts()
    prompts.append(prompts[3][:64] + [7, 8])  # 4 full blocks of 16 shared with prompt 3
    outs = {}
    for caching in (False, True):
        eng = _engine(tiny_model, fast=False, block_size=16, num_kv_blocks=64, kv_cache_dtype=name,
                      enable_prefix_caching=caching, max_num_seqs=1)  # fmt: skip
        outs[caching] = _greedy(eng, prompts)
    assert outs[True] == outs[False]


def test_copy_blocks_copies_the_int8_scales(tiny_model):
    model = LlamaModel(tiny_model, kv_cache_dtype="int8")
    model.allocate_kv_cache(4, 4)
    gen = torch.Generator().manual_seed(4)
    k, v = (torch.randn(4, 2, 32, generator=gen) for _ in range(2))
    meta = AttentionMetadata(torch.arange(4, 8), [0, 4], [4], torch.tensor([[1]]), 0)
    model._write_kv(k, v, 0, meta)  # block 1
    model.copy_blocks([(1, 3)])
    for cache in (model.k_cache, model.v_cache, model.k_scale, model.v_scale):
        assert torch.equal(cache[0][3], cache[0][1]) and cache[0][1].abs().sum() > 0
    got_k, got_v = model._read_kv(0, torch.tensor([3]), 4)
    torch.testing.assert_close(got_k, k, atol=k.abs().max() / 127, rtol=0)


# --- quality on a text --------------------------------------------------------------------------


def test_teacher_forced_compare_is_zero_for_the_same_cache_and_positive_for_int8(tiny_model):
    from lab_utils.engine.kv_quality import compare, teacher_forced

    model = LlamaModel(tiny_model)
    ids = _prompts(seed=5, lengths=(120,))[0]
    ref = teacher_forced(model, ids)
    again = compare(model, ref, teacher_forced(model, ids, "float32"), ids, lens_points=8)
    assert again.perplexity == again.reference_perplexity and again.argmax_agreement == 1.0
    assert max(again.logit_error_per_position) == 0 and max(again.logit_error_per_layer) == 0
    rep = compare(model, ref, teacher_forced(model, ids, "int8"), ids, lens_points=8)
    assert len(rep.logit_error_per_layer) == 2 and len(rep.logit_error_per_position) == 120
    assert len(rep.lens_positions) == 8 and rep.lens_positions[-1] == 119
    # random weights give huge logits (embeddings of scale 1, tied): the error is small beside them
    assert 0 < max(rep.logit_error_per_position) < 0.1 * float(ref.logits.abs().mean())
    assert rep.argmax_agreement >= 0.9
    assert abs(math.log(rep.perplexity / rep.reference_perplexity)) < 0.05
    assert [a for a, _, _ in rep.error_by_context(4)] == [0, 30, 60, 90]
    assert model.kv_dtype.name == "float32" and model.k_cache == []  # left as it was found


# --- the gate -----------------------------------------------------------------------------------


def test_clopper_pearson_matches_its_closed_forms():
    # k = 0 and k = n have closed forms: (0, 1 - (a/2)^(1/n)) and ((a/2)^(1/n), 1).
    low, high = clopper_pearson(0, 10)
    assert low == 0 and high == pytest.approx(1 - 0.025**0.1, abs=1e-9)
    low, high = clopper_pearson(300, 300)
    assert low == pytest.approx(0.025 ** (1 / 300), abs=1e-9) and high == 1
    low, high = clopper_pearson(5, 10)  # symmetric; the tabulated 0.187086, 0.812914
    assert low == pytest.approx(0.187086, abs=1e-6) and high == pytest.approx(1 - low, abs=1e-9)
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


def test_gate_holds_when_the_interval_reaches_past_the_tolerance_though_the_point_ships():
    small = gate_agreement([True] * 58 + [False] * 2, min_rate=0.9)  # 96.7 % agree
    assert small.point_decision == "ship" and small.decision == "hold" and small.low < 0.9
    assert "does not clear" in small.reason
    large = gate_agreement([True] * 290 + [False] * 10, min_rate=0.9)  # the same rate, 5x the prompts
    assert large.decision == "ship" and large.low >= 0.9
    # All identical proves 95 % only from 72 prompts on: 0.025^(1/71) = 0.9494, 0.025^(1/72) = 0.9501.
    assert gate_agreement([True] * 71, min_rate=0.95).decision == "hold"
    assert gate_agreement([True] * 72, min_rate=0.95).decision == "ship"


def test_paired_bootstrap_gate_in_both_directions():
    base = [1.0, 2.0, 3.0, 4.0, 5.0] * 8
    mean, low, high = paired_bootstrap(base, base)
    assert (mean, low, high) == (0, 0, 0)
    assert gate_paired(base, base, tolerance=0).decision == "ship"
    worse = [b - 0.5 for b in base]  # a score 0.5 lower on every prompt
    assert gate_paired(base, worse, tolerance=0.1).decision == "hold"
    assert gate_paired(base, worse, tolerance=0.6).decision == "ship"
    nll_up = [b + 0.05 for b in base]  # a loss 0.05 higher
    assert gate_paired(base, nll_up, tolerance=0.1, higher_is_better=False).decision == "ship"
    assert gate_paired(base, nll_up, tolerance=0.01, higher_is_better=False).decision == "hold"
    noisy = [b + (0.3 if i % 2 else -0.28) for i, b in enumerate(base)]  # mean +0.01, spread 0.29
    d = gate_paired(base, noisy, tolerance=0.02, higher_is_better=False, seed=1)
    assert d.point_decision == "ship" and d.decision == "hold" and d.high > 0.02
    assert gate_paired(base, noisy, tolerance=0.02, higher_is_better=False, seed=1) == d  # seeded
    with pytest.raises(ValueError, match="paired"):
        gate_paired(base, base[:-1], tolerance=0.1)


# --- the course model (slow) --------------------------------------------------------------------


@pytest.mark.slow
def test_course_model_quantized_caches_agree_with_float32_on_a_short_prompt(course_model):
    """Measured 2026-12-05 (AMD EPYC): fp8_e4m3 and int8 give float32's 24 tokens exactly; fp8_e5m2
    (2 mantissa bits) follows them for 10 tokens, then repeats itself and stops at EOS."""
    params = SamplingParams(temperature=0, max_tokens=24)
    prompt = "The capital of France is"
    outs = {}
    for name in ("auto", *QUANTIZED):
        eng = LLMEngine(course_model, kv_cache_dtype=name, dtype="float32", device="cpu", kv_cache_gib=0.05)
        outs[name] = list(eng.generate([prompt], params)[0].outputs[0].token_ids)
    base = outs["auto"]
    assert len(base) == 24
    assert outs["fp8_e4m3"] == base and outs["int8"] == base
    assert outs["fp8_e5m2"][:10] == base[:10]
