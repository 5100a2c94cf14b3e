"""Lab 07: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab07`.
"""

from __future__ import annotations

import math

from grader.registry import hidden
from lab_utils.grading.questions.lab07 import GiB, _check_ensemble, _config

_TYPES = ["TYPE_STRING", "TYPE_INT32", "TYPE_INT64", "TYPE_FP32", "TYPE_FP16"]


def _batching_ok(cfg, preferred: list[int], delay_us: int) -> bool:
    from lab_utils.triton.config import config_problems

    return (
        cfg.name == "mlp"
        and cfg.backend == "python"
        and not config_problems(cfg, "mlp")
        and cfg.HasField("dynamic_batching")
        and sorted(map(int, cfg.dynamic_batching.preferred_batch_size)) == sorted(preferred)
        and int(cfg.dynamic_batching.max_queue_delay_microseconds) == int(delay_us)
        and [t.name for t in cfg.input] == ["x"]
        and list(cfg.input[0].dims) == [16]
    )


@hidden("07.batching_config")
def _(batching_config, rng, scenario):
    bad = 0
    for _ in range(8):
        preferred = sorted(rng.sample([1, 2, 3, 4, 6, 8, 12, 16], rng.randint(1, 3)))
        delay = rng.choice([0, 100, 500, 2000, 10000, 50000])
        if not _batching_ok(
            _config(batching_config(list(preferred), delay), "batching_config"), preferred, delay
        ):
            bad += 1
    assert not bad, f"wrong on {bad} of 8 unseen settings"


def _served(on_disk: list[int], policy: dict) -> list[int]:
    versions = sorted(on_disk)
    if "all" in policy:
        return versions
    if "specific" in policy:
        wanted = set(policy["specific"]["versions"])
        return [v for v in versions if v in wanted]
    n = int(policy.get("latest", {}).get("num_versions", 1))
    return versions[-n:]


@hidden("07.served_versions")
def _(served_versions, rng, scenario):
    bad = 0
    for _ in range(20):
        on_disk = rng.sample(range(1, 30), rng.randint(1, 6))
        kind = rng.choice(["none", "latest", "all", "specific"])
        policy = {
            "none": {},
            "all": {"all": {}},
            "latest": {"latest": {"num_versions": rng.randint(1, 7)}},
            "specific": {"specific": {"versions": rng.sample(range(1, 30), rng.randint(1, 4))}},
        }[kind]
        if sorted(int(v) for v in served_versions(list(on_disk), policy)) != _served(on_disk, policy):
            bad += 1
    assert not bad, f"wrong on {bad} of 20 unseen repositories"


def _predicted_batch(s: dict) -> float:
    # closed loop, a delay much longer than one execution: a batch leaves when it reaches the
    # preferred size, or, when fewer clients exist than that, after the delay with all of them
    return float(min(s["concurrency"], s["preferred_batch_size"]))


@hidden("07.predicted_batch")
def _(predicted_avg_batch, rng, scenario):
    cases = [dict(scenario)]
    while len(cases) < 20:
        p, c = rng.choice([1, 2, 3, 4, 5, 6, 8, 12, 16]), rng.randint(1, 24)
        if (c < p) != (len(cases) % 2 == 0):
            continue  # half the cases with fewer clients than the preferred size, half with more
        cases.append(
            {
                "preferred_batch_size": p,
                "max_queue_delay_us": rng.choice([5000, 10000, 20000, 50000]),
                "concurrency": c,
            }
        )
    bad = sum(abs(float(predicted_avg_batch(dict(c))) - _predicted_batch(c)) > 0.5 for c in cases)
    assert not bad, (
        f"wrong on {bad} of {len(cases)} unseen settings and loads: think about who is there to batch "
        "with (the clients in flight) and what makes the batcher stop waiting"
    )


def _stats_entry(name, version, inferences, executions, sizes):
    stats = [{"batch_size": b, "compute_infer": {"count": n, "ns": n * 1000 * b}} for b, n in sizes.items()]
    return {
        "name": name,
        "version": version,
        "inference_count": inferences,
        "execution_count": executions,
        "last_inference": 0,
        "inference_stats": {},
        "batch_stats": stats,
    }


def _histogram(rng, top):
    sizes = rng.sample(range(1, top + 1), rng.randint(1, min(top, 5)))
    return {b: rng.randint(1, 40) for b in sizes}


def _snapshots(rng):
    """Two /stats answers around a run, and the average batch of one model between them."""
    model = rng.choice(["mlp", "resnet", "llm", "encoder"])
    names = [model] * rng.randint(1, 2) + rng.sample(
        [model + "2", model + "_v2", "pre_" + model, "tokenizer"], 2
    )
    before, after, inf, ex, seen = [], [], 0, 0, set()
    for name in names:
        version = rng.choice([v for v in "1234" if (name, v) not in seen])
        seen.add((name, version))
        old = _histogram(rng, 16) if rng.random() < 0.8 else {}
        new = _histogram(rng, 16) if name == model or rng.random() < 0.7 else {}
        both = {b: old.get(b, 0) + new.get(b, 0) for b in sorted(set(old) | set(new))}
        if old or rng.random() < 0.5:  # a version missing from `before` had not run yet
            before.append(
                _stats_entry(name, version, sum(b * n for b, n in old.items()), sum(old.values()), old)
            )
        after.append(
            _stats_entry(name, version, sum(b * n for b, n in both.items()), sum(both.values()), both)
        )
        if name == model:
            inf, ex = inf + sum(b * n for b, n in new.items()), ex + sum(new.values())
    for entries in (before, after):
        rng.shuffle(entries)
        for e in entries:
            rng.shuffle(e["batch_stats"])
    return {"model_stats": before}, {"model_stats": after}, model, inf / ex


@hidden("07.batching_measured")
def _(average_batch, rng, scenario):
    import copy

    bad, n = 0, 20
    for _ in range(n):
        before, after, model, want = _snapshots(rng)
        got = float(average_batch(copy.deepcopy(before), copy.deepcopy(after), model))
        bad += not (math.isfinite(got) and math.isclose(got, want, rel_tol=1e-6))
    assert not bad, f"wrong on {bad} of {n} unseen pairs of statistics snapshots"


@hidden("07.ensemble_config")
def _(ensemble_config, rng, scenario):
    bad = 0
    for case in range(6):
        pool = [f"t{case}_{i}" for i in range(12)]
        rng.shuffle(pool)
        models, available = [], [pool.pop()]
        for k in range(rng.randint(2, 4)):
            inputs = {
                t: rng.choice(_TYPES) for t in rng.sample(available, min(len(available), rng.randint(1, 2)))
            }
            if rng.random() < 0.4:
                inputs[pool.pop()] = rng.choice(_TYPES)  # a fresh input the ensemble must take from outside
            outputs = {pool.pop(): rng.choice(_TYPES) for _ in range(rng.randint(1, 2))}
            models.append({"name": f"m{case}_{k}", "inputs": inputs, "outputs": outputs})
            available = list(outputs)
        # one type per tensor name along the chain
        types = {}
        for m in models:
            for t in list(m["inputs"]) + list(m["outputs"]):
                types.setdefault(t, rng.choice(_TYPES))
        models = [
            {
                "name": m["name"],
                "inputs": {t: types[t] for t in m["inputs"]},
                "outputs": {t: types[t] for t in m["outputs"]},
            }
            for m in models
        ]
        name = f"ens_{case}"
        try:
            copy = [dict(m, inputs=dict(m["inputs"]), outputs=dict(m["outputs"])) for m in models]
            _check_ensemble(_config(ensemble_config(name, copy), "ensemble_config"), name, models)
        except AssertionError:
            bad += 1
    assert not bad, f"wrong on {bad} of 6 unseen chains of models"


@hidden("07.extra_tensor_bytes")
def _(extra_tensor_bytes, rng, scenario):
    bad = 0
    for _ in range(20):
        p, n, b = rng.randint(1, 4000), rng.randint(0, 2000), rng.choice([2, 4, 8])
        bad += int(extra_tensor_bytes(p, n, b)) != 2 * b * (p + n)
    assert not bad, f"wrong on {bad} of 20 unseen requests"


def _metrics_text(rng, models: list[str]) -> tuple[str, dict[str, float]]:
    lines = [
        "# HELP nv_inference_pending_request_count Instantaneous number of pending requests",
        "# TYPE nv_inference_pending_request_count gauge",
    ]
    want = {m: 0.0 for m in models}
    for m in models:
        for v in range(1, rng.randint(0, 3) + 1):
            n = float(rng.randint(0, 40))
            want[m] += n
            labels = [f'model="{m}"', f'version="{v}"']
            rng.shuffle(labels)
            lines.append(f"nv_inference_pending_request_count{{{','.join(labels)}}} {n:g}")
        lines.append(f'nv_inference_count{{model="{m}",version="1"}} {rng.randint(0, 999)}')
    rng.shuffle(lines[2:])
    return "\n".join(lines) + "\n", want


@hidden("07.pending_requests")
def _(pending_requests, rng, scenario):
    bad = 0
    for _ in range(10):
        names = rng.sample(["mlp", "mlp2", "llm", "llm_stream", "pipeline", "gen"], 3)
        text, want = _metrics_text(rng, names)
        for m in names + ["absent"]:
            bad += not math.isclose(float(pending_requests(text, m)), want.get(m, 0.0))
    assert not bad, f"wrong on {bad} of 40 unseen scrapes"


def _llmapi_kv_tokens(body: dict, gpu, weights, act, kv) -> int:
    """KV tokens per GPU as TensorRT-LLM's PyTorch backend sizes them (tensor_parallel_size GPUs).

    tensorrt_llm/_torch/pyexecutor/_util.py, KvCacheCreator (read 2026-12-02): after the profiling
    run, the KV budget is free_gpu_memory_fraction of (GPU memory - peak use), capped by
    max_tokens x bytes per token and by max_gpu_total_bytes when positive; tokens are that budget
    over the bytes per token of one GPU (its share of the KV heads; fp8 halves a 16-bit cache).
    """
    from lab_utils.facts import fact

    gpus = int(body.get("tensor_parallel_size", 1))
    cfg = body.get("kv_cache_config") or {}
    fraction = cfg.get("free_gpu_memory_fraction", fact("trtllm.free_gpu_memory_fraction"))
    per_token = kv / gpus / (2 if cfg.get("dtype") == "fp8" else 1)
    budget = max((gpu - weights / gpus - act) * GiB, 0) * fraction
    cap = cfg.get("max_gpu_total_bytes", fact("trtllm.max_gpu_total_bytes_default")[1])
    if cap:
        budget = min(budget, cap)
    tokens = int(budget // per_token)
    if cfg.get("max_tokens") is not None:
        tokens = min(tokens, int(cfg["max_tokens"]))
    return tokens


def _random_llmapi(rng) -> tuple[str, dict, tuple]:
    """An unseen model.yaml (written by the course's llmapi writer) and a GPU for it."""
    import yaml

    from lab_utils.triton.llm_backends import llmapi_model_yaml

    gpus = rng.choice([1, 1, 2, 4, 8])
    opts: dict = {"max_batch_size": rng.choice([8, 64, 256])}
    if gpus > 1 or rng.random() < 0.3:
        opts["tensor_parallel_size"] = gpus
    if rng.random() < 0.4:
        opts["pipeline_parallel_size"] = 1
    if rng.random() < 0.3:
        opts["max_seq_len"] = rng.choice([2048, 8192, 32768])
    kv_cfg: dict = {}
    for key in rng.sample(
        [
            "free_gpu_memory_fraction",
            "max_tokens",
            "max_gpu_total_bytes",
            "enable_block_reuse",
            "dtype",
            "tokens_per_block",
        ],
        rng.randint(0, 4),
    ):
        kv_cfg[key] = {
            "free_gpu_memory_fraction": rng.choice([0.3, 0.5, 0.8, 0.85, 0.95]),
            "max_tokens": rng.randint(1000, 600_000),
            "max_gpu_total_bytes": rng.choice([0, rng.randint(1, 40) * GiB // 2]),
            "enable_block_reuse": rng.choice([True, False]),
            "dtype": rng.choice(["auto", "fp8"]),
            "tokens_per_block": rng.choice([16, 32, 64]),
        }[key]
    if kv_cfg or rng.random() < 0.3:
        opts["kv_cache_config"] = kv_cfg
    model = rng.choice(["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-14B-Instruct", "/models/ckpt"])
    text = llmapi_model_yaml(model, opts, decoupled=rng.random() < 0.5)
    gpu = rng.choice([24, 40, 48, 80, 94, 141])
    weights = rng.uniform(0.5, gpu * 0.6) * gpus
    act = rng.uniform(0.2, 3)
    heads = gpus * rng.choice([1, 2, 4])  # KV heads that divide evenly among the GPUs
    kv = 2 * rng.choice([16, 28, 32, 80]) * heads * rng.choice([64, 128]) * 2
    return text, yaml.safe_load(text), (gpu, weights, act, kv)


@hidden("07.trtllm_kv_tokens")
def _(trtllm_kv_tokens, rng, scenario):
    bad, n = 0, 24
    for _ in range(n):
        text, body, (gpu, weights, act, kv) = _random_llmapi(rng)
        got = int(trtllm_kv_tokens(text, gpu, weights, act, kv))
        bad += abs(got - _llmapi_kv_tokens(body, gpu, weights, act, kv)) > 1
    assert not bad, f"wrong on {bad} of {n} unseen model.yaml files and GPUs"
