"""Lab 05 — vLLM for real: the offline LLM, the OpenAI server, choosing flags for a goal (predicted,
then read from the server's own start-up log), metrics, and a concurrency sweep.

Measured answers (`sweep_results`) are `lab_utils.clients.LoadResult` objects returned by
`run_load`, stamped in that run; the hidden check verifies the stamp and re-derives throughput
from the per-request records.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from lab_utils.clients.loadgen import LoadResult
from lab_utils.grading.checks import measured
from lab_utils.grading.registry import limits, question, scenario

GiB = 1 << 30
COURSE_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # the course model's float32 K and V, all layers

_KV_SIZING = [
    "lab_utils.memory.kv:kv_cache_capacity_tokens",
    "lab_utils.memory.kv:kv_cache_num_blocks",
    "lab_utils.memory.kv:kv_cache_block_bytes",
    "lab_utils.memory.kv:vllm_kv_cache_report",
]


# graded as submitted (LIGHT = False): the kernel and its vLLM server(s), proportional set size
limits("05", memory_mb=8192, timeout=1800)


@scenario("05")
def _(rng):
    """The serving goal the second server's flags must meet."""
    return {"goal_concurrency": rng.randint(2, 5), "goal_context": rng.choice([1024, 1280, 1536, 1792, 2048])}


# --- 05.texts_of --------------------------------------------------------------------------------


def _out(*texts):
    return SimpleNamespace(
        prompt="p", outputs=[SimpleNamespace(text=t, token_ids=[1] * len(t)) for t in texts]
    )


@question("05.texts_of", points=1, answers=["texts_of"])
def _(texts_of):
    """The generated text of every RequestOutput, in prompt order."""
    got = [str(t) for t in texts_of([_out("Paris", "Lyon"), _out("")])]
    assert len(got) == 2, "one string per RequestOutput"
    assert got[1] == "", "an empty completion is still a completion (and still a string)"


# --- 05.client_kwargs ---------------------------------------------------------------------------


@question(
    "05.client_kwargs",
    points=2,
    answers=["client_kwargs"],
    forbid=["lab_utils.servers.vllm:VLLMServer.client_kwargs"],
)
def _(client_kwargs):
    """Keyword arguments for openai.OpenAI against a vLLM server."""
    got = dict(client_kwargs("http://127.0.0.1:8000"))
    assert set(got) == {"base_url", "api_key"}, "return exactly base_url and api_key"
    assert str(got["base_url"]).startswith("http://127.0.0.1:8000/"), (
        "base_url starts with the server's address: where do vLLM's OpenAI routes live?"
    )
    assert isinstance(got["api_key"], str) and got["api_key"], "the SDK refuses a missing or empty key"
    got = dict(client_kwargs("http://10.0.0.5:9000/", api_key="s3cret"))
    assert "//" not in str(got["base_url"])[len("http://") :], "a trailing slash must not give a double slash"


# --- 05.kv_cache_tokens -------------------------------------------------------------------------


@question("05.kv_cache_tokens", points=2, answers=["kv_cache_tokens"], forbid=_KV_SIZING)
def _(kv_cache_tokens):
    """KV-cache capacity in tokens from the KV memory, the model shape and the block size."""
    a = int(kv_cache_tokens(1.0, 30, 3, 64, 4, 128))
    b = int(kv_cache_tokens(1.0, 30, 3, 64, 2, 128))
    assert a > 0 and a % 128 == 0, "vLLM allocates whole blocks: capacity is a multiple of the block size"
    assert 1.9 < b / a < 2.1, "bf16 KV stores half the bytes per value of float32"


# --- 05.max_model_len_limit ---------------------------------------------------------------------


@question("05.max_model_len_limit", points=2, answers=["max_model_len_limit"], forbid=_KV_SIZING)
def _(max_model_len_limit):
    """The longest --max-model-len vLLM accepts for a given KV memory."""
    per_token = COURSE_BYTES_PER_TOKEN
    assert int(max_model_len_limit(per_token * 128, per_token, 128)) == 0, (
        "with a single block in the pool, what is left for a request?"
    )
    got = int(max_model_len_limit(GiB, per_token, 128))
    assert 0 < got < GiB // per_token and got % 128 == 0, "whole blocks, and less than the whole cache"


# --- 05.flags_for_goal (predict, then the start-up log measures it) -----------------------------


@question("05.flags_for_goal", points=3, answers=["chosen_flags", "predicted_concurrency"], predict=True)
def _(chosen_flags, predicted_concurrency):
    """Flags meeting SCENARIO's goal, and the maximum concurrency vLLM will log for them."""
    f = dict(chosen_flags)
    assert set(f) == {"kv_cache_gib", "max_model_len", "max_num_seqs"}, (
        "a dict with kv_cache_gib, max_model_len and max_num_seqs"
    )
    assert float(f["kv_cache_gib"]) > 0 and int(f["max_model_len"]) > 0 and int(f["max_num_seqs"]) >= 1, (
        "positive numbers"
    )
    assert float(predicted_concurrency) > 0, "the prediction is a positive number of requests"


# --- 05.gauge_value -----------------------------------------------------------------------------

_METRICS = ["lab_utils.clients.metrics:metric_value", "lab_utils.clients.metrics:parse_prometheus"]


@question("05.gauge_value", points=2, answers=["gauge_value"], forbid=_METRICS)
def _(gauge_value):
    """One metric's value from Prometheus text, summed over its label sets."""
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0',
            'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 7.0',
            "process_open_fds 41",
        ]
    )
    w = float(gauge_value(text, "vllm:num_requests_waiting"))
    assert w not in (3.0, 2.0, 12.0), (
        "one metric can have several label sets; and only that exact name counts"
    )
    assert math.isnan(float(gauge_value(text, "vllm:num_requests_running"))), (
        "a metric that is not on the page is not zero"
    )


# --- 05.p50_p95 ---------------------------------------------------------------------------------


@question("05.p50_p95", points=2, answers=["p50_p95"], forbid=["lab_utils.clients.loadgen:percentile"])
def _(p50_p95):
    """Median and 95th percentile with linear interpolation between ranks."""
    p50, p95 = map(float, p50_p95([0.4, 0.1, 0.3, 0.2]))
    assert 0.2 < p50 < 0.3, "sort first; with an even count the median sits between two values"
    assert 0.3 < p95 < 0.4, "the 95th percentile interpolates between its two neighbouring ranks"
    p50, p95 = map(float, p50_p95([2.0]))
    assert p50 == p95 == 2.0, "one value is every percentile"


# --- 05.sweep (measured) ------------------------------------------------------------------------


@question("05.sweep", points=2, answers=["sweep_results", "sweep_tok_s"])
def _(sweep_results, sweep_tok_s):
    """The concurrency sweep: one LoadResult per level (1 and at least one more), and tokens/s per level."""
    runs = {
        int(k): measured(v, LoadResult, f"sweep_results[{k}]", "run_load")
        for k, v in dict(sweep_results).items()
    }
    assert len(runs) >= 2 and 1 in runs, "at least two concurrency levels, one of them 1"
    t = {int(k): float(v) for k, v in dict(sweep_tok_s).items()}
    assert set(t) == set(runs) and all(v > 0 for v in t.values()), "one positive tokens/s per level"
