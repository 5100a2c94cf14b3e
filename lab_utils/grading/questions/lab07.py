"""Lab 07 — Triton Inference Server: graded questions.

Configs are checked by parsing them into Triton's own ModelConfig protobuf (tritonclient ships
it), functions on small fixed cases, measured numbers for internal consistency (a histogram that
adds up to the counts it came with). Hints say where to look, never the answer.
"""

from __future__ import annotations

import math

from lab_utils.grading.registry import question

GiB = 1 << 30


def _config(text, what: str):
    from lab_utils.triton.config import ConfigError, config_from_dict, validate_config

    if isinstance(text, dict):
        text = config_from_dict(dict(text), what)
    assert isinstance(text, str), f"{what} should be config.pbtxt text (a str) or a dict"
    try:
        return validate_config(str(text), what)
    except ConfigError as err:
        raise AssertionError(str(err)) from None


@question("07.batching_config", points=2, answers=["BATCHING_CONFIG"])
def _(BATCHING_CONFIG):
    """config.pbtxt for the MLP with dynamic batching (preferred 4 and 8, 2 ms queue delay)."""
    from lab_utils.triton.config import config_problems

    cfg = _config(BATCHING_CONFIG, "BATCHING_CONFIG")
    assert cfg.name == "mlp", "the config's name must match the model folder, mlp"
    assert cfg.backend == "python", "which backend runs a model.py?"
    problems = config_problems(cfg, "mlp")
    assert not problems, "Triton would refuse this config: " + "; ".join(problems)
    assert int(cfg.max_batch_size) >= 8, "max_batch_size must allow the largest preferred batch"
    ins = {t.name: t for t in cfg.input}
    outs = {t.name: t for t in cfg.output}
    assert set(ins) == {"x"} and set(outs) == {"y"}, "one input named x and one output named y"
    for t in (ins["x"], outs["y"]):
        assert t.data_type == 11, f"{t.name}: 32-bit floats are TYPE_FP32"
        assert list(t.dims) == [16], (f"{t.name}: dims describe one row (16 values) without the batch "
                                      "dimension, which max_batch_size > 0 adds")
    assert cfg.HasField("dynamic_batching"), "turn on the dynamic batcher (dynamic_batching { ... })"
    assert sorted(map(int, cfg.dynamic_batching.preferred_batch_size)) == [4, 8], \
        "preferred_batch_size lists the sizes worth running at once: 4 and 8"
    assert int(cfg.dynamic_batching.max_queue_delay_microseconds) == 2000, \
        "max_queue_delay_microseconds is in microseconds: 2 ms is how many?"


_POLICY_CASES = [
    ([1, 2, 3], {}, [3]),
    ([1, 2, 3], {"latest": {"num_versions": 2}}, [2, 3]),
    ([3, 1, 7, 2], {"latest": {"num_versions": 3}}, [2, 3, 7]),
    ([1, 2], {"latest": {"num_versions": 5}}, [1, 2]),
    ([4, 1, 2], {"all": {}}, [1, 2, 4]),
    ([1, 2, 3], {"specific": {"versions": [1, 3]}}, [1, 3]),
    ([10, 9], {"specific": {"versions": [10]}}, [10]),
]


@question("07.served_versions", points=2, answers=["served_versions"])
def _(served_versions):
    """Which version folders Triton serves under a version_policy (latest / all / specific)."""
    for on_disk, policy, want in _POLICY_CASES:
        got = sorted(int(v) for v in served_versions(list(on_disk), dict(policy)))
        if not policy:
            assert got == want, "with no version_policy Triton serves only the newest version"
        elif "latest" in policy:
            assert got == want, ("latest keeps the num_versions highest version numbers "
                                 "(numbers, not folder order)")
        else:
            assert got == want, f"check the {next(iter(policy))} policy against the versions on disk"


@question("07.batching_measured", points=2, answers=["BATCHING_RESULT"])
def _(BATCHING_RESULT):
    """Counts measured on the server under concurrency: inferences, executions, histogram."""
    result = dict(BATCHING_RESULT)
    for key in ("inferences", "executions", "histogram"):
        assert key in result, f"BATCHING_RESULT needs the key {key!r}"
    inferences, executions = int(result["inferences"]), int(result["executions"])
    histogram = {int(k): int(v) for k, v in dict(result["histogram"]).items()}
    assert inferences >= 16, "measure at least 16 requests (take the difference of two stats snapshots)"
    assert executions == sum(histogram.values()), \
        "each execution ran at exactly one batch size: the histogram's counts add up to executions"
    assert inferences == sum(size * n for size, n in histogram.items()), \
        "an execution at batch size b served b inferences: sum size * count over the histogram"
    assert executions < inferences, "with concurrent requests and dynamic batching on, executions < inferences"


@question("07.ensemble_config", points=2, answers=["ENSEMBLE_CONFIG"])
def _(ENSEMBLE_CONFIG):
    """An ensemble wiring tokenizer -> generator -> detokenizer: text in, text out."""
    from lab_utils.triton.config import config_problems

    cfg = _config(ENSEMBLE_CONFIG, "ENSEMBLE_CONFIG")
    assert cfg.platform == "ensemble", "an ensemble is declared with platform, not backend"
    steps = list(cfg.ensemble_scheduling.step)
    assert [s.model_name for s in steps] == ["tokenizer", "generator", "detokenizer"], \
        "three steps, in order: tokenizer, generator, detokenizer"
    assert {t.name for t in cfg.input} == {"text_input", "max_tokens"}, "inputs: text_input and max_tokens"
    assert [t.name for t in cfg.output] == ["text_output"], "one output: text_output"
    problems = config_problems(cfg, cfg.name)
    assert not problems, "; ".join(problems)
    io = {"tokenizer": ({"text_input"}, {"input_ids"}), "generator": ({"input_ids", "max_tokens"}, {"output_ids"}),
          "detokenizer": ({"output_ids"}, {"text_output"})}
    for s in steps:
        ins, outs = io[s.model_name]
        assert set(s.input_map) == ins, (f"{s.model_name}: input_map's keys are that model's own input "
                                         f"names ({', '.join(sorted(ins))})")
        assert set(s.output_map) == outs, f"{s.model_name}: output_map's keys are that model's output names"


@question("07.extra_tensor_bytes", points=1, answers=["extra_tensor_bytes"])
def _(extra_tensor_bytes):
    """Raw bytes of token-id tensors that cross the network only because the client calls 3 models."""
    assert int(extra_tensor_bytes(1, 0)) != 8, "the prompt ids travel twice: out of the tokenizer, into the generator"
    for p, n, b in [(10, 5, 8), (37, 0, 8), (100, 24, 4), (1, 1, 8)]:
        assert int(extra_tensor_bytes(p, n, b)) == 2 * b * (p + n), \
            "count both intermediate tensors (prompt ids, new ids), each sent back to the client and up again"


_METRICS = """# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="mlp",version="1"} 5
nv_inference_pending_request_count{model="mlp",version="2"} 2
nv_inference_pending_request_count{model="mlp2",version="1"} 7
nv_inference_count{model="mlp",version="1"} 120
"""


@question("07.pending_requests", points=1, answers=["pending_requests"])
def _(pending_requests):
    """Read nv_inference_pending_request_count for one model (all its versions) from /metrics text."""
    got = float(pending_requests(_METRICS, "mlp"))
    assert got != 5.0, "a model can have several versions loaded: add them all up"
    assert got != 14.0, 'match the model label exactly: mlp2 is another model'
    assert math.isclose(got, 7.0), "sum the samples of nv_inference_pending_request_count whose model label matches"
    assert math.isclose(float(pending_requests(_METRICS, "mlp2")), 7.0)
    assert float(pending_requests(_METRICS, "absent")) == 0.0, "a model with no samples has 0 pending"


@question("07.trtllm_kv_tokens", points=2, answers=["trtllm_kv_tokens"])
def _(trtllm_kv_tokens):
    """Tokens of paged KV cache the TensorRT-LLM backend gets from the free-memory fraction and cap."""
    kv = 2 * 32 * 8 * 128 * 2  # Llama-3-8B-shaped, fp16
    free = (80 - 16 - 2) * GiB
    want = int(free * 0.9 // kv)
    got = int(trtllm_kv_tokens(80, 16, 2, 0.9, kv))
    assert got != int(80 * GiB * 0.9 // kv), "the fraction applies to memory left *after* weights and activations"
    assert got == want, "tokens = floor(fraction * free bytes / KV bytes per token)"
    assert int(trtllm_kv_tokens(80, 16, 2, 0.9, kv, max_tokens=100_000)) == 100_000, \
        "max_tokens_in_paged_kv_cache caps the pool: the smaller of the two wins"
    assert int(trtllm_kv_tokens(80, 16, 2, 0.9, kv, max_tokens=10**9)) == want
    assert int(trtllm_kv_tokens(24, 1, 1, 0.5, 2 * 30 * 3 * 64 * 2)) == int(22 * GiB * 0.5 // 23040)
