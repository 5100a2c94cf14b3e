"""Lab 12 (many tenants on one server): adapter memory and slots, a token bucket on arrival traces,
a counter's rate from scrapes, TTFT per priority class, goodput per tenant, and a prediction of the
urgent class's p90 TTFT under both scheduling policies.

Public checks run at most two fixed cases and a few properties; hidden checks (grader/hidden/lab12.py)
call the same functions on cases drawn from the judge's key.
"""

from __future__ import annotations

import math

from lab_utils.grading.checks import close
from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import limits, question, scenario

# graded as submitted (LIGHT = False): the kernel, one vLLM server, the gateway and Prometheus
limits("12", memory_mb=8192, timeout=1800)


@scenario("12")
def _(rng):
    """A GPU budget for adapters, and the overload of the priority study at a CPU-like step cost."""
    return {
        "adapter_ranks": sorted(rng.sample([4, 8, 12, 16, 24, 40, 48], 3)),
        "free_gib": rng.choice([2.0, 4.0, 6.0]),
        "kv_gib": rng.choice([1.0, 1.5, 3.0]),
        "priority": {
            "max_num_seqs": rng.choice([2, 3, 4]),
            "n_low": rng.randint(5, 9),
            "n_high": rng.randint(1, 2),
            "low_output": rng.choice([32, 48, 64]),
            "high_output": rng.choice([4, 8]),
            "prompt_len": rng.choice([16, 32]),
            "high_arrival_s": rng.choice([0.3, 0.5, 0.8]),
            "fixed_s": rng.choice([0.02, 0.025, 0.03]),
            "per_token_s": rng.choice([0.0005, 0.001, 0.002]),
        },
    }


_SPEC = {
    "num_layers": 2,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_kv_heads": 1,
    "head_dim": 4,
    "intermediate_size": 16,
}


@question(
    "12.adapter_bytes",
    points=2,
    answers=["adapter_bytes"],
    forbid=refs("lora_sizing"),
)
def _(adapter_bytes):
    """Bytes of one LoRA adapter: adapter_bytes(spec, rank, target_modules, bytes_per_param)."""
    one = float(adapter_bytes(dict(_SPEC), 1, ["q_proj"], 4))
    assert one > 0 and float(adapter_bytes(dict(_SPEC), 4, ["q_proj"], 4)) == 4 * one, (
        "the adapter's matrices have rank columns or rows: bytes grow in proportion to the rank"
    )
    both = float(adapter_bytes(dict(_SPEC), 1, ["q_proj", "k_proj"], 4))
    assert one < both < 2 * one, "k has fewer output features than q under grouped-query attention"


@question(
    "12.adapter_slots",
    points=2,
    answers=["adapter_slots"],
    forbid=refs("lora_sizing"),
)
def _(adapter_slots):
    """Adapter slots that fit beside the KV cache for tenants' adapters of the given ranks, with the
    slot rank a value vLLM accepts for --max-lora-rank."""
    accepted = (1, 8, 16, 32)
    a = int(adapter_slots(dict(_SPEC), 10_000_000, 1_000_000, [8], ["q_proj", "v_proj"], 2, accepted))
    assert a > 0, "9 MB left over holds many adapters of a tiny model"
    assert (
        int(adapter_slots(dict(_SPEC), 10_000_000, 1_000_000, [2, 8], ["q_proj", "v_proj"], 2, accepted)) == a
    ), "one server serves every tenant: what rank must each of its slots have?"
    assert (
        int(adapter_slots(dict(_SPEC), 1_000_000, 2_000_000, [8], ["q_proj", "v_proj"], 2, accepted)) == 0
    ), "when the KV cache takes everything, no adapter fits"


@question(
    "12.token_bucket",
    points=3,
    answers=["admitted"],
    forbid=refs("gateway"),
)
def _(admitted):
    """admitted(arrivals, rate_per_s, burst): one bool per arrival, the bucket starting full."""
    got = [bool(x) for x in admitted([0.0, 0.0, 0.0], 1.0, 2)]
    assert len(got) == 3 and got[:2] == [True, True] and not got[2], (
        "a full bucket admits a burst, then refuses"
    )
    later = [bool(x) for x in admitted([0.0, 10.0], 0.5, 1)]
    assert later == [True, True], "an idle bucket refills"


@question("12.counter_rate", points=3, answers=["counter_rate"])
def _(counter_rate):
    """counter_rate(samples, window_s, at): a counter's per-second increase over [at - window_s, at]."""
    flat = float(counter_rate([(0.0, 5.0), (1.0, 5.0), (2.0, 5.0)], 10.0, 2.0))
    assert flat == 0.0, "a counter that does not move has no rate"
    reset = float(counter_rate([(0.0, 10.0), (1.0, 12.0), (2.0, 1.0), (3.0, 3.0)], 10.0, 3.0))
    assert reset > 0, "a counter that drops was restarted: the drop is not negative traffic"


@question(
    "12.p90_by_class",
    points=2,
    answers=["p90_by_class"],
    forbid=refs("percentiles", "percentile_summaries"),
)
def _(p90_by_class):
    """p90_by_class(records): {priority: p90 of ttft}, linear interpolation between sorted ranks."""
    got = p90_by_class(
        [{"priority": 0, "ttft": 1.0}, {"priority": 1, "ttft": 2.0}, {"priority": 1, "ttft": 4.0}]
    )
    got = {int(k): float(v) for k, v in dict(got).items()}
    assert set(got) == {0, 1}, "one entry per priority class present in the records"
    assert got[0] == 1.0 and 2.0 < got[1] < 4.0, "a p90 lies between the samples around its rank"


@question(
    "12.goodput_by_tenant",
    points=2,
    answers=["goodput_by_tenant"],
    forbid=refs("goodput", "slo"),
)
def _(goodput_by_tenant):
    """goodput_by_tenant(records, ttft_slo_s, duration_s): {tenant: requests/s that met the SLO}."""
    recs = [
        {"tenant": "a", "status": 200, "ttft": 0.1},
        {"tenant": "a", "status": 429, "ttft": None},
        {"tenant": "b", "status": 200, "ttft": 5.0},
    ]
    got = {str(k): float(v) for k, v in dict(goodput_by_tenant(recs, 1.0, 2.0)).items()}
    assert set(got) == {"a", "b"}, "every tenant that sent a request appears"
    assert got["b"] == 0.0 and got["a"] > 0, "a late answer or a refusal is not goodput"


@question(
    "12.predict_priority",
    points=4,
    answers=["predict_high_p90"],
    predict=True,
    forbid=refs("priority_simulators"),
)
def _(predict_high_p90):
    """predict_high_p90(overload, policy): the urgent class's p90 TTFT in the lab's step model."""
    case = {
        "max_num_seqs": 2,
        "n_low": 6,
        "n_high": 1,
        "low_output": 32,
        "high_output": 4,
        "prompt_len": 16,
        "high_arrival_s": 0.5,
        "fixed_s": 0.025,
        "per_token_s": 0.001,
    }
    fcfs, prio = float(predict_high_p90(dict(case), "fcfs")), float(predict_high_p90(dict(case), "priority"))
    assert math.isfinite(fcfs) and math.isfinite(prio) and prio > 0, "a time in seconds"
    assert prio < fcfs, "the policy exists to let the urgent class go first"
    assert not close(fcfs, prio, 0.05), "under fcfs the urgent request waits for the queue ahead of it"


@question(
    "12.tpot_by_model",
    points=2,
    answers=["tpot_by_model"],
    forbid=refs("request_records", "percentiles", "percentile_summaries"),
)
def _(tpot_by_model):
    """tpot_by_model(records): {model: median TPOT of its answered requests of two tokens or more}."""
    recs = [
        {"model": "a", "ok": True, "ttft": 1.0, "e2e": 2.0, "output_tokens": 11},
        {"model": "b", "ok": False, "ttft": None, "e2e": None, "output_tokens": 0},
    ]
    got = {str(k): float(v) for k, v in dict(tpot_by_model(recs)).items()}
    assert set(got) == {"a", "b"}, "one entry per model present in the records"
    assert 0 < got["a"] < 1.0 and math.isnan(got["b"]), "a failed request has no TPOT: nan where none is left"
