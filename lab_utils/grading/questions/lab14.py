"""Lab 14 (KV cache beyond one engine): the bytes a prompt's KV occupies in a store, TTFT when
loading it against recomputing it (a prediction) and the prompt length where loading starts to
win, where a request's prompt tokens came from (two /metrics scrapes), TTFT and TPOT from stream
records, the replica a KV-aware router picks, and when disaggregation meets SLOs (lab 10's
simulator, measured transfer cost).

Public checks run at most two fixed cases and a few properties; hidden checks (grader/hidden/lab14.py)
call the same functions on cases drawn from the judge's key.
"""

from __future__ import annotations

import math

from lab_utils.grading.checks import close
from lab_utils.grading.forbidden import refs
from lab_utils.grading.questions.lab11 import MEDIANS  # the same one-call medians and percentiles
from lab_utils.grading.registry import limits, question, scenario

# graded as submitted (LIGHT = False): the kernel, two vLLM engines and the proxy
limits("14", memory_mb=8192, timeout=1800)


@scenario("14")
def _(rng):
    """A KV tier on some machine, and a workload for the disaggregation question."""
    return {
        "tier": {
            "prefill_tok_s": rng.choice([800.0, 1500.0, 4000.0, 20000.0]),
            "fixed_s": rng.choice([0.02, 0.05]),
            "kv_bytes_per_token": rng.choice([46080, 23040, 131072]),
            "block_size": rng.choice([16, 128]),
            "tier_gb_s": rng.choice([0.2, 1.0, 5.0, 25.0]),
            "load_overhead_s": rng.choice([0.005, 0.02, 0.1]),
        },
        "prompt_len": rng.choice([300, 701, 2000, 8000]),
        "spec": {"num_layers": rng.choice([30, 32, 80]), "num_kv_heads": rng.choice([3, 8]), "head_dim": 64},
        "dtype_bytes": rng.choice([2, 4]),
    }


_SPEC = {"num_layers": 2, "num_kv_heads": 1, "head_dim": 4}
_TIER = {
    "prefill_tok_s": 1000.0,
    "fixed_s": 0.02,
    "kv_bytes_per_token": 46080,
    "block_size": 128,
    "tier_gb_s": 2.0,
    "load_overhead_s": 0.01,
}
# lab_utils.memory's re-export is the same object: absent too; and the drills' KV calculators
_KV_REFS = refs("kv_block_bytes", "stored_tokens")


@question("14.kv_bytes_stored", points=2, answers=["kv_bytes_stored"], forbid=_KV_REFS)
def _(kv_bytes_stored):
    """kv_bytes_stored(spec, prompt_len, block_size, dtype_bytes): tensor bytes the disk connector
    stores for one prompt (headers not counted)."""
    short = int(kv_bytes_stored(dict(_SPEC), 16, 16, 2))
    assert short == 0, "a prompt that fills no whole block before its last token leaves nothing to store"
    a = int(kv_bytes_stored(dict(_SPEC), 100, 16, 2))
    assert a > 0 and int(kv_bytes_stored(dict(_SPEC), 100, 16, 4)) == 2 * a, (
        "twice the bytes per element, twice the bytes"
    )
    assert int(kv_bytes_stored(dict(_SPEC), 101, 16, 2)) == a, "only whole blocks are stored"


@question(
    "14.predict_ttft",
    points=4,
    answers=["predict_ttft"],
    predict=True,
    forbid=refs("kv_transfer"),
)
def _(predict_ttft):
    """predict_ttft(prompt_len, tier, path): TTFT (s) recomputing the prompt ("recompute") or loading
    its stored KV from the tier ("load"), in the lab's model of one engine."""
    long_r = float(predict_ttft(2000, dict(_TIER), "recompute"))
    long_l = float(predict_ttft(2000, dict(_TIER), "load"))
    assert math.isfinite(long_r) and long_r > _TIER["fixed_s"], "a time in seconds, more than one step"
    assert long_l < long_r, "2,000 tokens at 1,000 tok/s take longer than reading their KV at 2 GB/s"
    short = float(predict_ttft(50, dict(_TIER), "load"))
    assert close(short, float(predict_ttft(50, dict(_TIER), "recompute")), 1e-9), (
        "a prompt shorter than a block has nothing in the store: both paths compute it"
    )


@question("14.crossover", points=2, answers=["crossover_len"], forbid=refs("kv_transfer"))
def _(crossover_len):
    """crossover_len(tier, max_len): the shortest prompt (1..max_len tokens) whose KV loads faster
    than it computes, or None."""
    got = crossover_len(dict(_TIER), 4096)
    assert got is not None and 1 < int(got) <= 4096, (
        "on a 2 GB/s tier loading wins somewhere below 4,096 tokens"
    )
    slow = dict(_TIER, tier_gb_s=0.01)
    assert crossover_len(slow, 4096) is None, "at 10 MB/s a token's 46 kB take longer to read than to compute"


@question(
    "14.cache_sources",
    points=3,
    answers=["cache_sources"],
    forbid=refs("kv_tier_counters"),  # and every Prometheus text parser within reach
)
def _(cache_sources):
    """cache_sources(before, after): from two /metrics pages, the shares of prompt tokens served by
    the device cache, loaded by the connector, and computed; and the connector's own hit rate."""
    page = (
        'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {p}\n'
        'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {d}\n'
        'vllm:external_prefix_cache_queries_total{{engine="0",model_name="m"}} {q}\n'
        'vllm:external_prefix_cache_hits_total{{engine="0",model_name="m"}} {e}\n'
    )
    got = cache_sources(page.format(p=100, d=0, q=100, e=0), page.format(p=200, d=50, q=150, e=25))
    got = {str(k): float(v) for k, v in dict(got).items()}
    assert set(got) == {"device", "external", "computed", "connector_hit_rate"}, (
        "return {'device', 'external', 'computed', 'connector_hit_rate'}"
    )
    assert close(got["device"] + got["external"] + got["computed"], 1.0, 1e-9), (
        "every prompt token was served by one source"
    )
    assert got["device"] > got["external"] > 0, "the differences between the scrapes, not the totals"


@question("14.ttft_tpot", points=2, answers=["ttft_tpot"], forbid=MEDIANS)
def _(ttft_tpot):
    """ttft_tpot(records): {"ttft_p50", "tpot_p50"} (s) from stream records {"sent", "token_times", "ok"}."""
    recs = [
        {"sent": 0.0, "token_times": [0.5, 0.6, 0.7], "ok": True},
        {"sent": 1.0, "token_times": [], "ok": False},
    ]
    got = {str(k): float(v) for k, v in dict(ttft_tpot(recs)).items()}
    assert set(got) == {"ttft_p50", "tpot_p50"}, "return {'ttft_p50': ..., 'tpot_p50': ...}"
    assert close(got["ttft_p50"], 0.5, 1e-9), "a failed request has no TTFT"
    assert 0 < got["tpot_p50"] < got["ttft_p50"], "TPOT is the time between tokens after the first"


@question("14.pick_replica", points=2, answers=["pick_replica"])
def _(pick_replica):
    """pick_replica(prompt, replicas, block_size): the index of the replica a KV-aware router sends
    the prompt to; replicas are {"cached": [token lists], "load": requests in flight}."""
    prompt = list(range(40))
    reps = [{"cached": [list(range(20))], "load": 5}, {"cached": [list(range(8)) + [99] * 30], "load": 0}]
    assert int(pick_replica(prompt, reps, 8)) == 0, "two cached blocks beat one, whatever the load"
    even = [{"cached": [], "load": 3}, {"cached": [[7, 7, 7]], "load": 1}]
    assert int(pick_replica(prompt, even, 8)) == 1, "with nothing useful cached anywhere, the least loaded"


@question("14.disagg_layout", points=3, answers=["best_layout"])
def _(best_layout):
    """best_layout(workload, num_gpus, cost, link, slo): "colocated", a prefill-pool size, or None."""
    work = [
        {"request_id": i, "arrival_time": i * 0.1, "prompt_len": 100, "output_len": 20} for i in range(10)
    ]
    cost = {"fixed_s": 0.02, "per_token_s": 0.0004}
    link = {"kv_bytes_per_token": 46080, "link_gb_s": 1.0, "link_latency_s": 0.01}
    easy = best_layout([dict(w) for w in work], 2, dict(cost), dict(link), {"ttft_s": 100.0, "tpot_s": 100.0})
    assert easy == "colocated" or isinstance(easy, int), "a layout: 'colocated' or the prefill GPUs"
    none = best_layout([dict(w) for w in work], 2, dict(cost), dict(link), {"ttft_s": 1e-6, "tpot_s": 1e-6})
    assert none is None, "no layout answers in a microsecond"
