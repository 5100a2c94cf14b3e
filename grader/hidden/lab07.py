"""Lab 07: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab07`.
"""

from __future__ import annotations

import math

from grader.registry import hidden
from lab_utils.grading.provenance import verify
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
    want = _predicted_batch(scenario)
    assert abs(float(predicted_avg_batch) - want) <= 0.5, (
        "think about who is there to batch with: the clients in flight, and where the batcher stops waiting"
    )


@hidden("07.batching_measured")
def _(BATCHING_RESULT, measured_avg_batch, rng, scenario):
    assert verify(BATCHING_RESULT), "not the object measured in this run"
    sizes = {int(k): int(v) for k, v in dict(BATCHING_RESULT.batch_sizes).items()}
    inferences = sum(b * n for b, n in sizes.items())
    executions = sum(sizes.values())
    assert inferences == int(BATCHING_RESULT.inference_count), "the histogram does not add up to the counts"
    assert max(sizes) <= scenario["concurrency"], "this run was not measured under SCENARIO's concurrency"
    assert math.isclose(float(measured_avg_batch), inferences / executions, rel_tol=1e-6), (
        "derive the average batch from the measured counts"
    )


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


def _trt_tokens(gpu, weights, act, fraction, kv, max_tokens=None) -> int:
    tokens = int((gpu - weights - act) * GiB * fraction // kv)
    return tokens if max_tokens is None else min(tokens, int(max_tokens))


@hidden("07.trtllm_kv_tokens")
def _(trtllm_kv_tokens, rng, scenario):
    bad = 0
    for _ in range(20):
        gpu = rng.choice([24, 40, 48, 80, 94, 141])
        weights = rng.uniform(0.5, gpu * 0.6)
        act = rng.uniform(0.2, 3)
        fraction = rng.choice([0.5, 0.8, 0.85, 0.9, 0.95])
        kv = (
            2
            * rng.choice([16, 28, 32, 80])
            * rng.choice([1, 2, 4, 8])
            * rng.choice([64, 128])
            * rng.choice([1, 2])
        )
        cap = rng.choice([None, rng.randint(1000, 500_000)])
        got = int(
            trtllm_kv_tokens(gpu, weights, act, fraction, kv, cap)
            if cap is not None
            else trtllm_kv_tokens(gpu, weights, act, fraction, kv)
        )
        bad += abs(got - _trt_tokens(gpu, weights, act, fraction, kv, cap)) > 1
    assert not bad, f"wrong on {bad} of 20 unseen GPUs and models"
