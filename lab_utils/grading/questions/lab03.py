"""Lab 03 (batching): static utilisation, the "~10x" claim, a continuous batching step, goodput,
Triton's dynamic batcher, and the simulator's error against real runs."""

from __future__ import annotations

import math

from lab_utils.grading.registry import question

# The dynamic-batcher scenario of the notebook (section 5); the check re-runs it.
TRITON_RATE = 300.0  # requests per second
TRITON_NUM_REQUESTS = 3000
TRITON_SEED = 3
TRITON_FIXED_S = 0.004  # per execution
TRITON_PER_ITEM_S = 0.001  # per request in the batch
TRITON_MAX_BATCH_SIZE = 16
TRITON_P99_SLO_S = 0.040
TRITON_MIN_MEAN_BATCH = 6.0


def triton_scenario():
    """(workload, cost model) of the dynamic-batcher exercise."""
    from lab_utils.sim import StepCostModel, poisson_workload

    workload = poisson_workload(TRITON_NUM_REQUESTS, TRITON_RATE, prompt_len=1, output_len=1, seed=TRITON_SEED)
    return workload, StepCostModel(fixed_s=TRITON_FIXED_S, per_token_s=TRITON_PER_ITEM_S)


def _close(value, expected: float, rel: float = 0.02) -> bool:
    v = float(value)
    return math.isfinite(v) and abs(v - expected) <= rel * abs(expected)


@question("03.static_utilisation", points=2, answers=["static_slot_utilisation"])
def _(static_slot_utilisation):
    """Fraction of slot-steps of one static batch that produce a token."""
    cases = [([50] * 7 + [500], 850 / 4000), ([10, 10], 1.0), ([1, 3], 4 / 6), ([5], 1.0), ([2, 4, 6, 8], 20 / 32)]
    for lens, want in cases:
        got = float(static_slot_utilisation(list(lens)))
        assert _close(got, want, 1e-6), (
            f"for output lengths {lens} the answer is off: every slot is held until the longest "
            "request finishes; count the steps that produce a token over all slot-steps")


@question("03.queue_ratios", points=3, answers=["RATIO_NO_QUEUE", "RATIO_SAME_MIX",
                                                 "RATIO_SHORT_QUEUE_REQUESTS", "RATIO_SHORT_QUEUE_TOKENS"])
def _(RATIO_NO_QUEUE, RATIO_SAME_MIX, RATIO_SHORT_QUEUE_REQUESTS, RATIO_SHORT_QUEUE_TOKENS):
    """Continuous / static throughput ratios for the seed's batch under three queue assumptions."""
    expected = {
        "RATIO_NO_QUEUE": (RATIO_NO_QUEUE, 1.0, "with no queue both policies finish when the 500-token request does"),
        "RATIO_SAME_MIX": (RATIO_SAME_MIX, 4000 / 850, "a full continuous batch against the static utilisation"),
        "RATIO_SHORT_QUEUE_REQUESTS": (RATIO_SHORT_QUEUE_REQUESTS, 71 / 8,
                                       "count requests finished in the first 500 steps: 7 slots turn over every 50 steps"),
        "RATIO_SHORT_QUEUE_TOKENS": (RATIO_SHORT_QUEUE_TOKENS, 4000 / 850,
                                     "tokens in the first 500 steps: how many slot-steps does each policy fill?"),
    }
    wrong = [f"{name}: {hint}" for name, (value, want, hint) in expected.items() if not _close(value, want)]
    if len(wrong) == len(expected):
        raise AssertionError("none of the ratios is right yet. " + "; ".join(wrong))
    if wrong:
        print("not yet right — " + "; ".join(wrong))
        return 1 - len(wrong) / len(expected)
    return None


def _canonical(res) -> tuple:
    reqs = [(r.request_id, r.scheduled_time, r.first_token_time, r.finish_time, r.num_preemptions)
            for r in res.requests]
    steps = [(sorted(s.prefill.items()), sorted(s.decode), tuple(s.preempted)) for s in res.steps]
    return reqs, steps


def _step_traces():
    from lab_utils.sim import ContinuousBatching, LengthDist, fixed_workload, poisson_workload

    return [
        ("a freed slot is refilled", fixed_workload([4, 4, 4, 6], [3, 1, 2, 2]),
         ContinuousBatching(max_num_seqs=2, max_num_batched_tokens=100)),
        ("chunked prefill under a token budget", fixed_workload([20, 4, 9], [2, 1, 3], [0.0, 0.0, 0.5]),
         ContinuousBatching(max_num_seqs=4, max_num_batched_tokens=8)),
        ("no chunking: a prompt must fit whole", fixed_workload([6, 6, 3], [2, 2, 2]),
         ContinuousBatching(max_num_seqs=4, max_num_batched_tokens=10, enable_chunked_prefill=False)),
        ("preemption when KV blocks run out", fixed_workload([4, 4, 4], [5, 5, 3]),
         ContinuousBatching(max_num_seqs=3, max_num_batched_tokens=64, num_kv_blocks=4, block_size=4)),
        ("a random trace with everything", poisson_workload(14, 4.0, LengthDist("uniform", low=2, high=30),
                                                            LengthDist("uniform", low=1, high=12), seed=5),
         ContinuousBatching(max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=12, block_size=4)),
    ]


@question("03.continuous_step", points=4, answers=["my_schedule"])
def _(my_schedule):
    """A continuous-batching schedule step (decode, chunk, admit, preempt) that matches the reference."""
    from lab_utils.sim import StepCostModel, reference_schedule, simulate

    cost = StepCostModel(fixed_s=1.0, per_token_s=0.0)
    passed, problems = 0, []
    for name, workload, cfg in _step_traces():
        want = _canonical(simulate(workload, cfg, cost, schedule_fn=reference_schedule))
        try:
            got = _canonical(simulate(workload, cfg, cost, schedule_fn=my_schedule))
        except NotImplementedError:
            raise
        except (RuntimeError, ValueError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        if got == want:
            passed += 1
            continue
        first = next((i for i, (g, w) in enumerate(zip(got[1], want[1])) if g != w), min(len(got[1]), len(want[1])))
        what = "number of steps"
        if first < min(len(got[1]), len(want[1])):
            g, w = got[1][first], want[1][first]
            what = ("prompt tokens" if g[0] != w[0] else "decoding requests" if g[1] != w[1] else "preemptions")
        problems.append(f"{name}: step {first} differs in its {what}")
    if passed == 0:
        raise AssertionError("no trace matches the reference yet. " + "; ".join(problems))
    if problems:
        print("partly right — " + "; ".join(problems))
        return passed / len(_step_traces())
    return None


@question("03.goodput", points=2, answers=["goodput_rps"])
def _(goodput_rps):
    """Requests per second that met a TTFT and a TPOT objective."""
    reqs = [  # (arrival, first token, finish, output tokens)
        (0.0, 0.2, 1.2, 11),   # ttft 0.2, tpot 0.1
        (0.5, 1.5, 2.0, 6),    # ttft 1.0 -> misses a 0.5 s TTFT objective
        (1.0, 1.1, 4.1, 11),   # tpot 0.3 -> misses a 0.2 s TPOT objective
        (2.0, 2.3, 2.3, 1),    # one token: only TTFT applies
    ]
    cases = [((0.5, 0.2), 2 / 4.1), ((2.0, 0.5), 4 / 4.1), ((0.05, 1.0), 0.0), ((0.5, 0.35), 3 / 4.1)]
    for (ttft_slo, tpot_slo), want in cases:
        got = float(goodput_rps([tuple(r) for r in reqs], ttft_slo, tpot_slo))
        assert _close(got, want, 1e-6) or (want == 0 and got == 0), (
            f"with TTFT <= {ttft_slo} s and TPOT <= {tpot_slo} s the goodput is off: count requests meeting "
            "both (TPOT only when there are 2+ tokens) and divide by first arrival to last finish")


@question("03.dynamic_batcher", points=3, answers=["MAX_QUEUE_DELAY_US", "PREFERRED_BATCH_SIZE"])
def _(MAX_QUEUE_DELAY_US, PREFERRED_BATCH_SIZE):
    """Triton dynamic-batcher settings meeting the p99 SLO with a mean batch of at least 6."""
    from lab_utils.sim import DynamicBatching, simulate, summarize

    delay = int(MAX_QUEUE_DELAY_US)
    pref = PREFERRED_BATCH_SIZE
    preferred = (int(pref),) if isinstance(pref, (int, float)) else tuple(int(s) for s in (pref or ()))
    cfg = DynamicBatching(TRITON_MAX_BATCH_SIZE, preferred, delay)
    workload, cost = triton_scenario()
    res = simulate(workload, cfg, cost)
    m = summarize(res)
    mean_batch = len(res.requests) / len(res.steps)
    assert mean_batch >= TRITON_MIN_MEAN_BATCH, (
        f"mean batch {mean_batch:.2f} < {TRITON_MIN_MEAN_BATCH}: requests are sent before enough have "
        "gathered; give the batcher more time to form batches")
    assert m.e2e_p99 <= TRITON_P99_SLO_S, (
        f"p99 latency {m.e2e_p99 * 1000:.1f} ms > {TRITON_P99_SLO_S * 1000:.0f} ms: requests wait too long "
        "in the queue (delay or preferred sizes)")


@question("03.relative_error", points=1, answers=["relative_error"])
def _(relative_error):
    """Signed relative error of a prediction against a measurement."""
    for pred, meas, want in [(110.0, 100.0, 0.1), (90.0, 100.0, -0.1), (5.0, 4.0, 0.25), (3.0, 3.0, 0.0)]:
        got = float(relative_error(pred, meas))
        assert abs(got - want) < 1e-9, "(predicted - measured) / measured: positive when the simulator over-predicts"
