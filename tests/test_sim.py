"""Batching simulator: hand-checked tiny runs per policy, invariants on random workloads, fast == reference."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

from lab_utils.sim import (
    SLO,
    ContinuousBatching,
    DynamicBatching,
    LengthDist,
    StaticBatching,
    StepCostModel,
    fixed_workload,
    poisson_workload,
    reference_schedule,
    seed_scenario,
    simulate,
    summarize,
)
from lab_utils.sim.calibrate import StepMeasurement, fit_cost_model

ONE_SECOND_STEPS = StepCostModel(fixed_s=1.0, per_token_s=0.0)


def times(rec):
    return (rec.scheduled_time, rec.first_token_time, rec.finish_time)


# ----------------------------------------------------------------------------- static
def test_static_seed_scenario_utilisation_and_times():
    res = simulate(seed_scenario(), StaticBatching(8), StepCostModel(fixed_s=0.01, per_token_s=0.0))
    assert len(res.steps) == 500
    assert [round(r.finish_time, 6) for r in res.requests] == [0.5] * 7 + [5.0]
    assert all(round(r.first_token_time, 6) == 0.01 for r in res.requests)
    assert res.steps[49].decode == (7, 0, 1, 2, 3, 4, 5, 6) or sorted(res.steps[49].decode) == list(range(8))
    assert res.steps[50].decode == (7,) and res.steps[50].num_padding == 7
    m = summarize(res, SLO(e2e_s=1.0))
    assert m.slot_utilisation == pytest.approx(850 / 4000)
    assert m.output_tokens_per_s == pytest.approx(850 / 5.0)
    assert m.goodput_rps == pytest.approx(7 / 5.0)
    assert res.requests[0].residencies[0].held_until == pytest.approx(5.0)


def test_static_waits_for_the_whole_batch():
    wl = fixed_workload([4, 4, 4], [3, 1, 2], [0.0, 0.0, 0.5])
    res = simulate(wl, StaticBatching(2), ONE_SECOND_STEPS)
    a, b, c = res.requests
    assert times(a) == (0.0, 1.0, 3.0)
    assert times(b) == (0.0, 1.0, 1.0)
    assert times(c) == (3.0, 4.0, 5.0)  # arrived at 0.5, waited for the whole first batch
    assert c.queue_time == 2.5 and c.ttft == 3.5 and c.e2e_latency == 4.5
    assert [s.num_padding for s in res.steps] == [0, 1, 1, 0, 0]


def test_static_padding_costs_compute():
    wl = fixed_workload([2, 10], [1, 3])
    cost = StepCostModel(fixed_s=0.0, per_token_s=1.0)
    padded = simulate(wl, StaticBatching(2), cost)
    unpadded = simulate(wl, StaticBatching(2, pad_finished=False), cost)
    assert [s.end - s.start for s in padded.steps] == [20.0, 2.0, 2.0]  # 2 rows x 10 padded prompt tokens
    assert [s.end - s.start for s in unpadded.steps] == [12.0, 1.0, 1.0]


# ----------------------------------------------------------------------------- continuous
def test_continuous_refills_a_freed_slot_next_step():
    wl = fixed_workload([4, 4, 4], [3, 1, 2])
    res = simulate(wl, ContinuousBatching(max_num_seqs=2, max_num_batched_tokens=100), ONE_SECOND_STEPS)
    a, b, c = res.requests
    assert times(a) == (0.0, 1.0, 3.0)
    assert times(b) == (0.0, 1.0, 1.0)
    assert times(c) == (1.0, 2.0, 3.0)  # took B's slot one step after B finished
    assert [(s.prefill, sorted(s.decode)) for s in res.steps] == [
        ({0: 4, 1: 4}, []),
        ({2: 4}, [0]),
        ({}, [0, 2]),
    ]
    assert [r.residencies[0].slot for r in res.requests] == [0, 1, 1]


def test_chunked_prefill_splits_a_long_prompt_over_the_budget():
    wl = fixed_workload([20, 4], [2, 1])
    res = simulate(wl, ContinuousBatching(max_num_seqs=4, max_num_batched_tokens=8), ONE_SECOND_STEPS)
    assert [s.prefill for s in res.steps] == [{0: 8}, {0: 8}, {0: 4, 1: 4}, {}]
    assert [s.decode for s in res.steps] == [(), (), (), (0,)]
    assert times(res.requests[0]) == (0.0, 3.0, 4.0)
    assert times(res.requests[1]) == (2.0, 3.0, 3.0)
    with pytest.raises(ValueError, match="chunked"):
        simulate(wl, ContinuousBatching(4, 8, enable_chunked_prefill=False), ONE_SECOND_STEPS)


def test_preemption_by_recompute_hand_checked():
    # 3 blocks of 4 tokens; A and B each grow to 2 blocks, so both cannot stay
    wl = fixed_workload([4, 4], [5, 5])
    cfg = ContinuousBatching(max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=3, block_size=4)
    for res in (
        simulate(wl, cfg, ONE_SECOND_STEPS),
        simulate(wl, cfg, ONE_SECOND_STEPS, schedule_fn=reference_schedule),
    ):
        a, b = res.requests
        assert times(a) == (0.0, 1.0, 5.0)
        assert times(b) == (0.0, 1.0, 9.0)
        assert (a.num_preemptions, b.num_preemptions) == (0, 1)
        assert res.steps[1].preempted == (1,) and res.steps[1].decode == (0,)
        assert res.steps[5].prefill == {1: 5}  # prompt + its one generated token, recomputed
        assert [(x.slot, x.start, x.prefill_end, x.end) for x in b.residencies] == [
            (1, 0.0, 1.0, 1.0),
            (0, 5.0, 6.0, 9.0),
        ]
        assert len(res.steps) == 9


def test_budget_rejects_fewer_tokens_than_sequences():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        ContinuousBatching(max_num_seqs=8, max_num_batched_tokens=4)


def test_request_that_can_never_fit_is_refused():
    with pytest.raises(ValueError, match="num_kv_blocks"):
        simulate(fixed_workload([100], [10]), ContinuousBatching(2, 64, num_kv_blocks=2, block_size=16))


# ----------------------------------------------------------------------------- dynamic (Triton)
def test_dynamic_batcher_preferred_sizes_and_delay():
    wl = fixed_workload([1] * 5, [1] * 5, [0.0, 0.01, 0.02, 0.5, 0.7])
    cfg = DynamicBatching(max_batch_size=4, preferred_batch_size=(2, 4), max_queue_delay_microseconds=100_000)
    res = simulate(wl, cfg, StepCostModel(fixed_s=0.05, per_token_s=0.0))
    starts = [round(s.start, 6) for s in res.steps]
    assert starts == [0.01, 0.12, 0.6, 0.8]  # pair goes at once; singles wait out the 100 ms delay
    assert [sorted(s.prefill) for s in res.steps] == [[0, 1], [2], [3], [4]]
    no_delay = simulate(wl, DynamicBatching(4), StepCostModel(fixed_s=0.05, per_token_s=0.0))
    assert [round(s.start, 6) for s in no_delay.steps] == [0.0, 0.05, 0.5, 0.7]


def test_dynamic_batcher_takes_the_largest_preferred_size():
    wl = fixed_workload([1] * 7, [1] * 7)
    res = simulate(
        wl,
        DynamicBatching(8, preferred_batch_size=(4, 8), max_queue_delay_microseconds=1000),
        StepCostModel(fixed_s=1.0, per_token_s=0.0),
    )
    assert [len(s.prefill) for s in res.steps] == [4, 3]  # 7 queued: 4 now, 3 after their delay


def test_dynamic_config_is_validated():
    with pytest.raises(ValueError, match="preferred_batch_size"):
        DynamicBatching(max_batch_size=4, preferred_batch_size=(8,))


# ----------------------------------------------------------------------------- invariants
def _random_case(seed: int):
    rng = random.Random(seed)
    n = rng.randint(1, 20)
    wl = poisson_workload(
        n,
        rate=rng.choice([1.0, 5.0, 50.0, float("inf")]),
        prompt_len=LengthDist("uniform", low=1, high=rng.choice([8, 40, 100])),
        output_len=LengthDist("uniform", low=1, high=rng.choice([5, 30, 60])),
        seed=seed,
    )
    longest = max(w.prompt_len + w.output_len for w in wl)
    block = rng.choice([1, 2, 4, 16])
    chunked = rng.random() < 0.7
    seqs = rng.randint(1, 6)
    budget = rng.randint(max(seqs, 1 if chunked else longest), max(seqs, longest) + 48)
    blocks = rng.choice([None, -(-longest // block) + rng.randint(0, 8)])
    return wl, ContinuousBatching(seqs, budget, chunked, blocks, block)


def _canonical(res):
    reqs = [
        (
            r.request_id,
            times(r),
            r.num_preemptions,
            [(x.slot, x.start, x.prefill_end, x.end) for x in r.residencies],
        )
        for r in res.requests
    ]
    steps = [
        (s.start, s.end, sorted(s.prefill.items()), sorted(s.decode), s.preempted, sorted(s.prefill_sampled))
        for s in res.steps
    ]
    return reqs, steps


def _check_invariants(wl, cfg, res):
    by_id = {w.request_id: w for w in wl}
    produced = Counter()
    for s in res.steps:
        assert len(s.prefill) + len(s.decode) <= cfg.max_num_seqs
        assert s.num_tokens <= cfg.max_num_batched_tokens
        assert not set(s.prefill) & set(s.decode)
        produced.update(s.sampled)
    for r in res.requests:
        w = by_id[r.request_id]
        assert produced[r.request_id] == w.output_len  # every token once, none re-emitted after recompute
        assert r.finish_time is not None  # preempted requests finish too
        assert w.arrival_time <= r.scheduled_time <= r.first_token_time <= r.finish_time
        for x in r.residencies:
            assert x.start >= w.arrival_time
        assert len(r.residencies) == r.num_preemptions + 1
    # slots: no two stays overlap in one slot
    stays = sorted((x.slot, x.start, x.end) for r in res.requests for x in r.residencies)
    for (s1, _, e1), (s2, b2, _) in zip(stays, stays[1:]):
        assert s1 != s2 or b2 >= e1


def test_continuous_invariants_and_fast_engine_matches_reference():
    cost = StepCostModel(0.01, 0.001, 1e-5)
    preemptions = 0
    for seed in range(60):
        wl, cfg = _random_case(seed)
        fast = simulate(wl, cfg, cost)
        ref = simulate(wl, cfg, cost, schedule_fn=reference_schedule)
        _check_invariants(wl, cfg, fast)
        assert _canonical(fast) == _canonical(ref), f"seed {seed}: {cfg}"
        preemptions += sum(r.num_preemptions for r in fast.requests)
    assert preemptions > 0  # the cases do exercise preemption


def test_paged_kv_manager_gives_the_same_schedule_as_block_counting():
    pytest.importorskip("lab_utils.kv")
    cost = StepCostModel(0.01, 0.001, 1e-5)
    checked = 0
    for seed in range(40):
        wl, cfg = _random_case(seed)
        if cfg.num_kv_blocks is None:
            continue
        counted = simulate(wl, cfg, cost, schedule_fn=reference_schedule)
        paged = simulate(wl, cfg, cost, schedule_fn=reference_schedule, kv_manager="paged")
        assert _canonical(counted) == _canonical(paged)
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("policy", [StaticBatching(3), StaticBatching(3, pad_finished=False)])
def test_static_invariants(policy):
    for seed in range(10):
        wl, _ = _random_case(seed)
        res = simulate(wl, policy, StepCostModel(0.01, 0.001))
        produced = Counter()
        for s in res.steps:
            assert len(s.prefill) + len(s.decode) + s.num_padding <= policy.batch_size
            produced.update(s.sampled)
        for r in res.requests:
            assert produced[r.request_id] == r.output_len
            assert r.arrival_time <= r.scheduled_time <= r.first_token_time <= r.finish_time


def test_dynamic_invariants():
    wl = poisson_workload(200, rate=100.0, prompt_len=8, output_len=1, seed=3)
    cfg = DynamicBatching(8, (4, 8), max_queue_delay_microseconds=20_000)
    res = simulate(wl, cfg, StepCostModel(0.01, 0.0005))
    for s in res.steps:
        assert 1 <= len(s.prefill) <= 8
    for r in res.requests:
        assert r.scheduled_time >= r.arrival_time
        # nobody waits past the delay while the instance is idle: the delay or a busy instance explains a wait
        assert r.finish_time is not None


def test_plain_engine_rejects_a_plan_over_budget():
    def greedy(state):
        from lab_utils.sim import SchedulerOutput

        out = SchedulerOutput()
        while state.waiting:
            req = state.waiting[0]
            state.admit(req)
            out.num_scheduled_tokens[req.request_id] = req.num_tokens
        return out

    with pytest.raises(RuntimeError, match="budget"):
        simulate(
            fixed_workload([8, 8], [2, 2]), ContinuousBatching(4, 8), ONE_SECOND_STEPS, schedule_fn=greedy
        )


# ----------------------------------------------------------------------------- workloads, cost, metrics
def test_workloads_are_seeded():
    a = poisson_workload(
        50, 2.0, LengthDist("lognormal", mean=100), LengthDist("uniform", low=5, high=9), seed=7
    )
    b = poisson_workload(
        50, 2.0, LengthDist("lognormal", mean=100), LengthDist("uniform", low=5, high=9), seed=7
    )
    assert a == b
    assert all(5 <= w.output_len <= 9 for w in a)
    assert all(x.arrival_time <= y.arrival_time for x, y in zip(a, a[1:]))
    assert [w.arrival_time for w in poisson_workload(3, float("inf"), seed=1)] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="kind"):
        LengthDist("zipf")
    with pytest.raises(ValueError, match="output_len"):
        fixed_workload([4], [0])


def test_cost_model_parts():
    cost = StepCostModel(fixed_s=0.02, per_token_s=0.001, per_context_token_s=1e-5)
    assert cost.decode_step_time(8, 100) == pytest.approx(0.02 + 0.008 + 0.008)
    roof = StepCostModel.from_roofline(135e6, 2, 1000.0, 100.0, kv_bytes_per_token=23040)
    assert roof.fixed_s == pytest.approx(270e6 / 1e12)
    assert roof.per_token_s == pytest.approx(270e6 / 100e12)
    # memory-bound until the batch's compute catches up with the weight reads
    assert roof.step_time(1) == pytest.approx(roof.fixed_s)
    assert roof.step_time(1000) == pytest.approx(1000 * roof.per_token_s)
    with pytest.raises(ValueError, match="fixed_s"):
        StepCostModel(fixed_s=-1)


def test_cost_model_from_the_gpu_catalog():
    pytest.importorskip("lab_utils.memory")
    h100 = StepCostModel.from_gpu("H100-80GB", 8e9, bytes_per_param=2, efficiency=1.0)
    assert h100.fixed_s == pytest.approx(16e9 / 3350e9)  # 16 GB of weights at 3.35 TB/s
    assert h100.per_token_s == pytest.approx(16e9 / 989e12)
    assert h100.decode_step_time(1) == h100.decode_step_time(64)  # memory-bound: batch is free


def test_fit_recovers_a_known_cost_model():
    truth = StepCostModel(0.03, 0.0008, 2e-6)
    samples = [
        StepMeasurement("x", 1, n, c, truth.step_time(n, c))
        for n, c in [(1, 64), (8, 512), (8, 2048), (32, 32), (512, 512), (128, 4096)]
    ]
    fit = fit_cost_model(samples)
    assert fit.fixed_s == pytest.approx(0.03, rel=1e-6)
    assert fit.per_token_s == pytest.approx(0.0008, rel=1e-6)
    assert fit.per_context_token_s == pytest.approx(2e-6, rel=1e-5)


def test_metrics_on_a_hand_made_run():
    res = simulate(fixed_workload([4, 4, 4], [3, 1, 2]), ContinuousBatching(2, 100), ONE_SECOND_STEPS)
    m = summarize(res, SLO(ttft_s=1.5))
    assert m.duration_s == 3.0
    assert m.output_tokens_per_s == pytest.approx(6 / 3)
    assert m.ttft_p50 == 1.0
    assert m.tpot_p50 == pytest.approx(1.0)
    assert m.goodput_rps == pytest.approx(2 / 3)  # C's first token came at 2.0 s
    assert m.slot_utilisation == pytest.approx((2 + 2 + 2) / (2 * 3))


def test_dropping_step_records_keeps_every_request_figure():
    cost = StepCostModel(0.01, 0.001, 1e-5)
    for seed in (1, 7, 23):
        wl, cfg = _random_case(seed)
        full = simulate(wl, cfg, cost)
        lean = simulate(wl, cfg, cost, keep_steps=False)
        assert lean.steps == [] and lean.num_steps == len(full.steps) > 0
        assert [dataclasses.asdict(r) for r in lean.requests] == [
            dataclasses.asdict(r) for r in full.requests
        ]
