"""Lab 07 — Triton Inference Server: graded questions.

Configs are checked by parsing them into Triton's own ModelConfig protobuf (tritonclient ships it)
and by what Triton would refuse at load time; functions on at most two fixed cases in public and on
random cases from the grading seed in the hidden checks. The prediction is a function of the
scenario graded on unseen scenarios; the measurement is an analysis of two statistics snapshots,
graded on snapshots the hidden check makes up. Hints say where to look, never the answer.
"""

from __future__ import annotations

import math

from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import question, scenario

GiB = 1 << 30


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


@question(
    "07.batching_config",
    points=2,
    answers=["batching_config"],
    forbid=refs("triton_mlp_config"),
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


# --- 07.served_versions ------------------------------------------------------------------------


@question("07.served_versions", points=2, answers=["served_versions"])
def _(served_versions):
    """Which version folders Triton serves under a version_policy (latest / all / specific)."""
    got = sorted(int(v) for v in served_versions([1, 2, 3], {}))
    assert len(got) == 1, "with no version_policy Triton serves a single version"
    got = sorted(int(v) for v in served_versions([3, 1, 7, 2], {"latest": {"num_versions": 2}}))
    assert len(got) == 2 and set(got) <= {1, 2, 3, 7}, "latest keeps num_versions of the versions on disk"


# --- 07.predicted_batch / 07.batching_measured -------------------------------------------------


@question(
    "07.predicted_batch",
    points=2,
    answers=["predicted_avg_batch"],
    predict=True,
    forbid=refs("dynamic_batching_simulators"),
)
def _(predicted_avg_batch):
    """predicted_avg_batch(scenario): the average batch Triton forms for a batcher setting and load."""
    case = {"preferred_batch_size": 4, "max_queue_delay_us": 10000, "concurrency": 3}
    value = float(predicted_avg_batch(dict(case)))
    assert math.isfinite(value) and 1 <= value <= 16, (
        "a batch holds at least one request, and the MLP's max_batch_size caps it"
    )
    alone = float(predicted_avg_batch({**case, "concurrency": 1}))
    assert abs(alone - 1.0) < 0.5, "one closed-loop client has nobody to batch with"


def _entry(name, version, inferences, executions, sizes):
    return {
        "name": name,
        "version": version,
        "inference_count": inferences,
        "execution_count": executions,
        "batch_stats": [
            {"batch_size": b, "compute_infer": {"count": n, "ns": 1000 * n}} for b, n in sizes.items()
        ],
    }


@question("07.batching_measured", points=2, answers=["average_batch"], forbid=refs("triton_batch_stats"))
def _(average_batch):
    """average_batch(before, after, model): inferences per execution of `model` between two /stats answers."""
    before = {"model_stats": [_entry("mlp", "1", 10, 10, {1: 10})]}
    after = {"model_stats": [_entry("mlp", "1", 30, 30, {1: 30})]}
    value = float(average_batch(before, after, "mlp"))
    assert math.isfinite(value) and abs(value - 1.0) < 1e-9, "every execution ran one request: no batching"
    after = {"model_stats": [_entry("mlp", "1", 40, 20, {1: 10, 3: 10})]}
    value = float(average_batch(before, after, "mlp"))
    assert 1.0 < value <= 3.0, "between the snapshots some executions ran three requests at once"


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
    forbid=refs("triton_ensemble_config"),
)
def _(ensemble_config):
    """An ensemble config wiring a chain of models: each step fed by the ensemble or an earlier step."""
    models = [dict(m, inputs=dict(m["inputs"]), outputs=dict(m["outputs"])) for m in PIPELINE]
    _check_ensemble(
        _config(ensemble_config("my_pipeline", models), "ensemble_config"), "my_pipeline", PIPELINE
    )


# --- 07.extra_tensor_bytes ---------------------------------------------------------------------


@question("07.extra_tensor_bytes", points=1, answers=["extra_tensor_bytes"])
def _(extra_tensor_bytes):
    """Raw bytes of token-id tensors that cross the network only because the client calls 3 models."""
    small, big = int(extra_tensor_bytes(1, 0)), int(extra_tensor_bytes(10, 5))
    assert 0 < small < big, "more tokens, more bytes on the wire"
    assert int(extra_tensor_bytes(10, 5, 4)) < big, "narrower ids, fewer bytes"


# --- 07.pending_requests -----------------------------------------------------------------------


@question(
    "07.pending_requests",
    points=1,
    answers=["pending_requests"],
    forbid=refs("prometheus_parsers"),
)
def _(pending_requests):
    """Read nv_inference_pending_request_count for one model (all its versions) from /metrics text."""
    text = (
        'nv_inference_pending_request_count{model="a",version="1"} 3\n'
        'nv_inference_pending_request_count{model="ab",version="1"} 4\n'
    )
    assert float(pending_requests(text, "a")) >= 0, "a count of pending requests"
    assert float(pending_requests(text, "absent")) == 0.0, "a model with no samples has 0 pending"


# --- 07.trtllm_kv_tokens -----------------------------------------------------------------------

_YAML_PLAIN = """model: meta-llama/Llama-3.1-8B-Instruct
backend: pytorch
triton_config:
  max_batch_size: 0
  decoupled: false
"""


@question("07.trtllm_kv_tokens", points=2, answers=["trtllm_kv_tokens"], forbid=refs("trtllm_kv_planning"))
def _(trtllm_kv_tokens):
    """KV-cache tokens per GPU of the llmapi model a tensorrt_llm/1/model.yaml describes."""
    kv = 2 * 32 * 8 * 128 * 2
    plain = int(trtllm_kv_tokens(_YAML_PLAIN, 80, 16, 2, kv))
    assert 0 < plain < int(80 * GiB // kv), "only part of the GPU becomes KV cache, even with nothing set"
    capped = _YAML_PLAIN.replace("triton_config:", "kv_cache_config:\n  max_tokens: 1000\ntriton_config:")
    got = int(trtllm_kv_tokens(capped, 80, 16, 2, kv))
    assert 0 < got <= 1000 < plain, "kv_cache_config.max_tokens caps the pool"
