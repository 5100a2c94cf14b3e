"""Lab 07 — Triton Inference Server: graded questions.

Configs are checked by parsing them into Triton's own ModelConfig protobuf (tritonclient ships it)
and by what Triton would refuse at load time; functions on at most two fixed cases in public and on
random cases from the grading seed in the hidden checks; the measured batcher run is the stamped
statistics object of that run, re-derived here. Hints say where to look, never the answer.
"""

from __future__ import annotations

import math

from lab_utils.grading.provenance import verify
from lab_utils.grading.registry import hidden, question, scenario

GiB = 1 << 30
_TYPES = ["TYPE_STRING", "TYPE_INT32", "TYPE_INT64", "TYPE_FP32", "TYPE_FP16"]


@scenario("07")
def _(rng):
    """The batcher setting you measure, and the load it is measured under."""
    return {
        "preferred_batch_size": rng.choice([2, 3, 4, 6, 8]),
        "max_queue_delay_us": rng.choice([5000, 10000, 20000]),
        "concurrency": rng.choice([2, 3, 4, 5, 6, 8]),
    }


def _config(text, what: str):
    from lab_utils.triton.config import ConfigError, config_from_dict, validate_config

    if isinstance(text, dict):
        text = config_from_dict(dict(text), what)
    assert isinstance(text, str), f"{what} should return config.pbtxt text (a str) or a dict"
    try:
        return validate_config(str(text), what)
    except ConfigError as err:
        raise AssertionError(str(err)) from None


# --- 07.batching_config ------------------------------------------------------------------------


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


@question(
    "07.batching_config",
    points=2,
    answers=["batching_config"],
    forbid=["lab_utils.triton.recipes:mlp_config"],
)
def _(batching_config):
    """config.pbtxt for the MLP with the dynamic batcher set to given preferred sizes and delay."""
    from lab_utils.triton.config import config_problems

    cfg = _config(batching_config([4], 1000), "batching_config([4], 1000)")
    assert cfg.name == "mlp" and cfg.backend == "python", "keep the MLP's name and backend"
    problems = config_problems(cfg, "mlp")
    assert not problems, "Triton would refuse this config: " + "; ".join(problems)
    assert cfg.HasField("dynamic_batching"), "turn on the dynamic batcher"
    assert list(cfg.input[0].dims) == [16], "dims describe one row, without the batch dimension"
    other = _config(batching_config([2, 8], 250), "batching_config([2, 8], 250)")
    assert (
        other.dynamic_batching.max_queue_delay_microseconds
        != cfg.dynamic_batching.max_queue_delay_microseconds
    ), "the delay argument must reach the config"


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


# --- 07.served_versions ------------------------------------------------------------------------


def _served(on_disk: list[int], policy: dict) -> list[int]:
    versions = sorted(on_disk)
    if "all" in policy:
        return versions
    if "specific" in policy:
        wanted = set(policy["specific"]["versions"])
        return [v for v in versions if v in wanted]
    n = int(policy.get("latest", {}).get("num_versions", 1))
    return versions[-n:]


@question("07.served_versions", points=2, answers=["served_versions"])
def _(served_versions):
    """Which version folders Triton serves under a version_policy (latest / all / specific)."""
    got = sorted(int(v) for v in served_versions([1, 2, 3], {}))
    assert len(got) == 1, "with no version_policy Triton serves a single version"
    got = sorted(int(v) for v in served_versions([3, 1, 7, 2], {"latest": {"num_versions": 2}}))
    assert len(got) == 2 and set(got) <= {1, 2, 3, 7}, "latest keeps num_versions of the versions on disk"


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


# --- 07.predicted_batch / 07.batching_measured -------------------------------------------------


def _predicted_batch(s: dict) -> float:
    # closed loop, a delay much longer than one execution: a batch leaves when it reaches the
    # preferred size, or, when fewer clients exist than that, after the delay with all of them
    return float(min(s["concurrency"], s["preferred_batch_size"]))


@question("07.predicted_batch", points=2, answers=["predicted_avg_batch"], predict=True)
def _(predicted_avg_batch):
    """Before measuring: the average batch Triton will form for SCENARIO's setting and load."""
    value = float(predicted_avg_batch)
    assert math.isfinite(value) and value >= 1, "a batch holds at least one request"
    assert value <= 16, "the MLP's max_batch_size caps a batch"


@hidden("07.predicted_batch")
def _(predicted_avg_batch, rng, scenario):
    want = _predicted_batch(scenario)
    assert abs(float(predicted_avg_batch) - want) <= 0.5, (
        "think about who is there to batch with: the clients in flight, and where the batcher stops waiting"
    )


@question("07.batching_measured", points=2, answers=["BATCHING_RESULT", "measured_avg_batch"])
def _(BATCHING_RESULT, measured_avg_batch):
    """The statistics difference measured under SCENARIO's load, and the average batch read from it."""
    assert verify(BATCHING_RESULT), (
        "BATCHING_RESULT must be the counts object `measure` returned in this run, not numbers typed in"
    )
    sizes = {int(k): int(v) for k, v in dict(BATCHING_RESULT.batch_sizes).items()}
    assert int(BATCHING_RESULT.inference_count) >= 16, "measure at least 16 requests"
    assert max(sizes, default=1) > 1, "run it with the batcher on and concurrent clients"
    assert float(measured_avg_batch) >= 1, "inferences per execution is at least 1"


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


# --- 07.ensemble_config ------------------------------------------------------------------------


def _check_ensemble(cfg, name: str, models: list[dict]) -> None:
    from lab_utils.triton.config import config_problems

    assert cfg.name == name and cfg.platform == "ensemble", (
        "an ensemble is declared with platform, named as asked"
    )
    problems = config_problems(cfg, name)
    assert not problems, "; ".join(problems)
    steps = list(cfg.ensemble_scheduling.step)
    assert [s.model_name for s in steps] == [m["name"] for m in models], "one step per model, in order"
    produced: set[str] = set()
    for step, m in zip(steps, models):
        assert set(step.input_map) == set(m["inputs"]), (
            f"{m['name']}: input_map's keys are that model's own input names"
        )
        assert set(step.output_map) == set(m["outputs"]), (
            f"{m['name']}: output_map's keys are its output names"
        )
        produced.update(m["outputs"])
    needed = {t for m in models for t in m["inputs"]}
    produced_before: set[str] = set()
    external = set()
    for m in models:
        external |= {t for t in m["inputs"] if t not in produced_before}
        produced_before |= set(m["outputs"])
    types = {t: ty for m in models for t, ty in {**m["inputs"], **m["outputs"]}.items()}
    assert {t.name for t in cfg.input} == external, "the ensemble's inputs are what no earlier step produces"
    assert {t.name for t in cfg.output} == set(models[-1]["outputs"]), "its outputs are the last model's"
    from lab_utils.triton.config import _pb

    for t in list(cfg.input) + list(cfg.output):
        assert _pb().DataType.Name(t.data_type) == types[t.name], f"{t.name}: keep the model's data type"
    assert needed


PIPELINE = [
    {"name": "tokenizer", "inputs": {"text_input": "TYPE_STRING"}, "outputs": {"input_ids": "TYPE_INT64"}},
    {
        "name": "generator",
        "inputs": {"input_ids": "TYPE_INT64", "max_tokens": "TYPE_INT32"},
        "outputs": {"output_ids": "TYPE_INT64"},
    },
    {
        "name": "detokenizer",
        "inputs": {"output_ids": "TYPE_INT64"},
        "outputs": {"text_output": "TYPE_STRING"},
    },
]


@question(
    "07.ensemble_config",
    points=2,
    answers=["ensemble_config"],
    forbid=["lab_utils.triton.recipes:ensemble_config"],
)
def _(ensemble_config):
    """An ensemble config wiring a chain of models: each step fed by the ensemble or an earlier step."""
    models = [dict(m, inputs=dict(m["inputs"]), outputs=dict(m["outputs"])) for m in PIPELINE]
    _check_ensemble(
        _config(ensemble_config("my_pipeline", models), "ensemble_config"), "my_pipeline", PIPELINE
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


# --- 07.extra_tensor_bytes ---------------------------------------------------------------------


@question("07.extra_tensor_bytes", points=1, answers=["extra_tensor_bytes"])
def _(extra_tensor_bytes):
    """Raw bytes of token-id tensors that cross the network only because the client calls 3 models."""
    small, big = int(extra_tensor_bytes(1, 0)), int(extra_tensor_bytes(10, 5))
    assert 0 < small < big, "more tokens, more bytes on the wire"
    assert int(extra_tensor_bytes(10, 5, 4)) < big, "narrower ids, fewer bytes"


@hidden("07.extra_tensor_bytes")
def _(extra_tensor_bytes, rng, scenario):
    bad = 0
    for _ in range(20):
        p, n, b = rng.randint(1, 4000), rng.randint(0, 2000), rng.choice([2, 4, 8])
        bad += int(extra_tensor_bytes(p, n, b)) != 2 * b * (p + n)
    assert not bad, f"wrong on {bad} of 20 unseen requests"


# --- 07.pending_requests -----------------------------------------------------------------------


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


@question(
    "07.pending_requests",
    points=1,
    answers=["pending_requests"],
    forbid=[
        "lab_utils.triton.measure:metric_value",
        "lab_utils.triton.measure:parse_metrics",
        "lab_utils.clients.metrics:parse_prometheus",
    ],
)
def _(pending_requests):
    """Read nv_inference_pending_request_count for one model (all its versions) from /metrics text."""
    text = (
        'nv_inference_pending_request_count{model="a",version="1"} 3\n'
        'nv_inference_pending_request_count{model="ab",version="1"} 4\n'
    )
    assert float(pending_requests(text, "a")) >= 0, "a count of pending requests"
    assert float(pending_requests(text, "absent")) == 0.0, "a model with no samples has 0 pending"


@hidden("07.pending_requests")
def _(pending_requests, rng, scenario):
    bad = 0
    for _ in range(10):
        names = rng.sample(["mlp", "mlp2", "llm", "llm_stream", "pipeline", "gen"], 3)
        text, want = _metrics_text(rng, names)
        for m in names + ["absent"]:
            bad += not math.isclose(float(pending_requests(text, m)), want.get(m, 0.0))
    assert not bad, f"wrong on {bad} of 40 unseen scrapes"


# --- 07.trtllm_kv_tokens -----------------------------------------------------------------------


def _trt_tokens(gpu, weights, act, fraction, kv, max_tokens=None) -> int:
    tokens = int((gpu - weights - act) * GiB * fraction // kv)
    return tokens if max_tokens is None else min(tokens, int(max_tokens))


@question("07.trtllm_kv_tokens", points=2, answers=["trtllm_kv_tokens"])
def _(trtllm_kv_tokens):
    """Tokens of paged KV cache the TensorRT-LLM backend gets from the free-memory fraction and cap."""
    kv = 2 * 32 * 8 * 128 * 2
    full = int(trtllm_kv_tokens(80, 16, 2, 0.9, kv))
    assert 0 < full < int(80 * GiB // kv), "only part of the GPU becomes KV cache"
    assert int(trtllm_kv_tokens(80, 16, 2, 0.9, kv, max_tokens=1000)) == 1000, (
        "max_tokens_in_paged_kv_cache caps the pool"
    )


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
