"""Lab 11: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab11`. The simple calculators are graded against `grader.drill_calc`
(forbidden to the answers); the critical batch with KV reads, speculative decoding with per-position
acceptance, the batching prediction, the measurement's analysis and the chat sizing against the
references here.
"""

from __future__ import annotations

import heapq
import math

from grader import drill_calc as calc
from grader.registry import hidden
from lab_utils.drills import TOPICS, make_drills
from lab_utils.grading.checks import close, partial


@hidden("11.gpus_needed")
def _(gpus_needed, rng, scenario):
    ok, n = 0, 30
    for _ in range(n):
        heads_kv = rng.choice(
            [(32, 8), (64, 8), (28, 4), (40, 8), (9, 3), (48, 16), (32, 2), (16, 1), (24, 4)]
        )
        args = (
            round(rng.uniform(5, 900), 1),
            round(rng.uniform(0, 200), 1),
            rng.choice([24.0, 48.0, 80.0, 141.0]),
            rng.choice([0.8, 0.9, 0.95]),
            rng.choice([1.0, 2.0, 4.0]),
            *heads_kv,
            rng.choice([4, 8, 8, 16]),
        )
        want = calc.gpus_needed(*args)
        got = gpus_needed(*args)
        ok += (got is None) if want is None else (got is not None and close(got, want))
    return partial(ok, n, "sizing cases")


def _ref_critical(
    peak_tflops, bandwidth_gb_s, bytes_per_param, num_params=None, kv_bytes_per_token=0, context=0
):
    """Batch B where 2 P B FLOPs over (P b + B x KV bytes per sequence) bytes reaches the ridge."""
    ridge = peak_tflops * 1e12 / (bandwidth_gb_s * 1e9)
    kv = kv_bytes_per_token * context
    if not kv:
        return ridge * bytes_per_param / 2
    spare = 2 * num_params - ridge * kv  # FLOPs one more sequence brings, less the ridge's worth of its bytes
    return None if spare <= 0 else ridge * num_params * bytes_per_param / spare


@hidden("11.critical_batch")
def _(critical_batch, rng, scenario):
    ok, n = 0, 24
    for i in range(n):
        args = (rng.uniform(50, 2500), rng.uniform(200, 8000), rng.choice([0.5, 1.0, 2.0, 4.0]))
        if i % 4:  # most cases read a KV cache too; some of them never turn compute-bound
            args += (
                rng.choice([1e9, 8e9, 14e9, 70e9, 405e9]),
                rng.choice([16, 32, 64, 128, 160, 320]) * 1024,
                rng.choice([16, 64, 256, 1024, 4096, 32_768]),
            )
        want, got = _ref_critical(*args), critical_batch(*args)
        ok += (got is None) if want is None else close(got, want, 1e-6)
    return partial(ok, n, "GPUs and workloads")


@hidden("11.batching_gain")
def _(batching_gain, rng, scenario):
    ok, n = 0, 20
    for _ in range(n):
        b = rng.randint(1, 16)
        lens = [rng.randint(1, 2000) for _ in range(rng.randint(1, 60))]
        ok += close(batching_gain(lens, b), calc.batching_gain(lens, b))
    return partial(ok, n, "workloads")


def _ref_expected_tokens(accept) -> float:
    """1 + the chance the first draft survives + the chance the first two do + ..."""
    total, alive = 1.0, 1.0
    for p in accept:
        alive *= p
        total += alive
    return total


@hidden("11.speculative")
def _(spec_expected_tokens, spec_speedup, rng, scenario):
    ok, n = 0, 20
    for i in range(n):
        k, c = rng.randint(1, 10), round(rng.uniform(0.01, 0.5), 3)
        if i % 3 == 0:  # one acceptance rate for every position
            accept = [round(rng.uniform(0.05, 0.95), 3)] * k
        else:  # later positions accept less often, as vLLM's per-position counters show
            accept, p = [], rng.uniform(0.5, 0.97)
            for _ in range(k):
                accept.append(round(p, 3))
                p *= rng.uniform(0.6, 1.0)
        e = _ref_expected_tokens(accept)
        ok += close(spec_expected_tokens(list(accept)), e, 1e-9) and close(
            spec_speedup(list(accept), c), e / (1 + k * c), 1e-9
        )
    return partial(ok, n, "(acceptance, cost) cases")


@hidden("11.cost_per_million")
def _(cost_per_million_tokens, rng, scenario):
    ok, n = 0, 15
    for _ in range(n):
        args = (round(rng.uniform(0.3, 8), 2), rng.randint(1, 16), rng.uniform(50, 50_000))
        ok += close(cost_per_million_tokens(*args), calc.cost_per_million_tokens(*args))
    return partial(ok, n, "price and throughput cases")


def _solved(answer_drill, drills) -> int:
    solved = 0
    for d in drills:
        try:
            solved += bool(d.is_correct(answer_drill(d.kind, dict(d.inputs))))
        except Exception:
            pass
    return solved


@hidden("11.drill_answers")
def _(answer_drill, rng, scenario):
    mine = make_drills(scenario["drill_seed"], n=scenario["n_drills"])
    fresh = make_drills(rng.randrange(10**9), n=3 * len(TOPICS))
    right, solved = _solved(answer_drill, mine), _solved(answer_drill, fresh)
    if right == 0 or solved == 0:
        raise AssertionError(
            f"drills right: {right} of {len(mine)} in the scenario's set, {solved} of {len(fresh)} unseen"
        )
    frac = (right / len(mine)) * (solved / len(fresh))
    return None if frac == 1 else frac


def _ref_drain_gain(lens: list[int], batch: int) -> float:
    """Static steps over continuous steps for a workload that all arrives at t=0, drain included."""
    static = sum(max(lens[i : i + batch]) for i in range(0, len(lens), batch))
    slots = [0] * min(batch, len(lens))
    for n in lens:  # each request, in order, takes the slot that frees first
        heapq.heappush(slots, heapq.heappop(slots) + n)
    return static / max(slots)


def _batching_case(rng) -> dict:
    batch = rng.choice([2, 4, 8, 16, 32])
    mode = rng.random()
    if mode < 0.6:  # the scenario's shape: a short/long mix per batch
        short, long = rng.randint(5, 120), rng.randint(200, 1500)
        lens = []
        for _ in range(rng.randint(2, 12)):
            one = [short] * rng.randint(0, batch) + [long] * batch
            lens += rng.sample(one, batch)
    else:
        lens = [rng.randint(1, 2000) for _ in range(rng.randint(2 * batch, 120))]
    return {"batch_size": batch, "output_lens": lens, "prompt_len": rng.choice([16, 32, 128])}


@hidden("11.predict_batching")
def _(predicted_gain, rng, scenario):
    cases = [dict(scenario["batching"])] + [_batching_case(rng) for _ in range(19)]
    wrong = 0
    for c in cases:
        got = float(predicted_gain({**c, "output_lens": list(c["output_lens"])}))
        wrong += not (
            math.isfinite(got) and close(got, _ref_drain_gain(c["output_lens"], c["batch_size"]), 0.01)
        )
    assert not wrong, f"wrong on {wrong} of {len(cases)} unseen workloads (1% tolerance)"


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    pos = (len(xs) - 1) / 2
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@hidden("11.measured_batching")
def _(batching_summary, rng, scenario):
    wrong, n = 0, 20
    for _ in range(n):
        k = rng.randint(1, 80)
        lens = [rng.randint(1, 1000) for _ in range(k)]
        static = [round(rng.uniform(0.05, 60.0), 4) for _ in range(k)]
        cont = [round(s * rng.uniform(0.2, 1.1), 4) for s in static]
        got = {
            str(key): float(v)
            for key, v in dict(batching_summary(list(lens), list(static), list(cont))).items()
        }
        want = {"gain": max(static) / max(cont), "p50_ratio": _median(static) / _median(cont)}
        wrong += set(got) != set(want) or not all(close(got[key], want[key], 1e-6) for key in want)
    assert not wrong, f"wrong on {wrong} of {n} unseen pairs of runs"


def _ref_replicas(c: dict) -> set[int]:
    """The replica count, either way of rounding a product that lands on a whole number."""
    busy_s = c["prompt_tokens"] / c["prefill_tokens_per_s"] + c["output_tokens"] / c["decode_tokens_per_s"]
    x = c["rate"] * busy_s / c["headroom"]
    return {max(1, math.ceil(x - 1e-9)), max(1, math.ceil(x + 1e-9))}


@hidden("11.chat_replicas")
def _(chat_replicas, rng, scenario):
    cases = [dict(scenario["chat"])]
    for _ in range(19):
        cases.append(
            {
                "rate": rng.choice([1, 5, 20, 100, 500, 1000, 2000, 3000]),
                "output_tokens": rng.choice([50, 150, 250, 400, 1000]),
                "prompt_tokens": rng.choice([0, 100, 500, 1000, 2000, 8000]),
                "decode_tokens_per_s": rng.choice([1000, 2500, 4000, 6000, 9000]),
                "prefill_tokens_per_s": rng.choice([5000, 10_000, 20_000, 40_000]),
                "headroom": rng.choice([0.5, 0.6, 0.7, 0.8]),
            }
        )
    wrong = sum(int(chat_replicas(dict(c))) not in _ref_replicas(c) for c in cases)
    assert not wrong, f"wrong on {wrong} of {len(cases)} unseen chat loads"
