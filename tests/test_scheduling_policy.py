"""One scheduling policy for the course: the engine's Scheduler and lab 03's simulator plan the same steps.

Both run `lab_utils.engine.scheduler.reference_schedule` (vLLM v1's policy). Here the engine's
`Scheduler` is driven without a model: fake requests, a fake sampled token, and the simulator's
step cost model as the clock. On random workloads its steps must equal the simulator's, both its
reference pass and its fast event-driven loop.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from lab_utils.engine import Request, SamplingParams, Scheduler, SchedulerConfig
from lab_utils.kv import KVCacheManager
from lab_utils.sim import (
    ContinuousBatching,
    LengthDist,
    StepCostModel,
    poisson_workload,
    reference_schedule,
    simulate,
)

COST = StepCostModel(fixed_s=0.01, per_token_s=0.001, per_context_token_s=1e-5)


def random_case(seed: int, threshold: bool = False):
    """A seeded workload and limits: some cases short of KV blocks (preemption), some unchunked."""
    rng = random.Random(seed)
    wl = poisson_workload(
        rng.randint(1, 16),
        rate=rng.choice([2.0, 20.0, float("inf")]),
        prompt_len=LengthDist("uniform", low=1, high=rng.choice([8, 40, 90])),
        output_len=LengthDist("uniform", low=1, high=rng.choice([5, 25, 50])),
        seed=seed,
    )
    longest = max(w.prompt_len + w.output_len for w in wl)
    block = rng.choice([1, 4, 16])
    chunked = rng.random() < 0.75
    seqs = rng.randint(1, 6)
    budget = rng.randint(max(seqs, 1 if chunked else longest), max(seqs, longest) + 40)
    blocks = rng.choice([None, -(-longest // block) + rng.randint(0, 10)])
    cap = rng.choice([0, 3, 8, 20]) if threshold and chunked else 0
    return wl, ContinuousBatching(seqs, budget, chunked, blocks, block, long_prefill_token_threshold=cap)


def engine_steps(workload, cfg: ContinuousBatching, cost: StepCostModel):
    """Serve `workload` with the engine's Scheduler and lab 02's KV manager on a simulated clock."""
    longest = max(w.prompt_len + w.output_len for w in workload)
    num_blocks = cfg.num_kv_blocks or len(workload) * -(-longest // cfg.block_size)  # never short
    sched = Scheduler(
        KVCacheManager(num_blocks, cfg.block_size, enable_caching=False),
        SchedulerConfig(
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=longest + 1,
            enable_chunked_prefill=cfg.enable_chunked_prefill,
            long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        ),
    )
    pending = deque(sorted(workload, key=lambda w: (w.arrival_time, w.request_id)))
    steps, finished, preemptions = [], {}, {}
    now = 0.0
    while pending or sched.has_unfinished_requests():
        while pending and pending[0].arrival_time <= now:
            w = pending.popleft()
            params = SamplingParams(max_tokens=w.output_len, ignore_eos=True)
            sched.add_request(Request(str(w.request_id), [7] * w.prompt_len, params))
        if not sched.has_unfinished_requests():
            now = pending[0].arrival_time
            continue
        out = sched.schedule()
        context = sum(out.num_computed_tokens[r] + n for r, n in out.num_scheduled_tokens.items())
        end = now + cost.step_time(out.total_num_scheduled_tokens, context)
        prefill = {r: n for r, n in out.num_scheduled_tokens.items() if r not in out.decode_req_ids}
        steps.append((now, end, sorted(prefill.items()), sorted(out.decode_req_ids), out.preempted_req_ids))
        sampled = {
            r: 7
            for r, n in out.num_scheduled_tokens.items()
            if out.num_computed_tokens[r] + n == sched.requests[r].num_tokens
        }
        for req in sched.update_from_output(out, sampled):
            finished[req.request_id] = end
            preemptions[req.request_id] = req.num_preemptions
        now = end
    return steps, finished, preemptions


def sim_steps(result):
    """The simulator's steps and request ends in `engine_steps`' form (ids as strings)."""
    steps = [
        (
            s.start,
            s.end,
            sorted((str(r), n) for r, n in s.prefill.items()),
            sorted(str(r) for r in s.decode),
            [str(r) for r in s.preempted],
        )
        for s in result.steps
    ]
    finished = {str(r.request_id): r.finish_time for r in result.requests}
    preemptions = {str(r.request_id): r.num_preemptions for r in result.requests}
    return steps, finished, preemptions


def test_engine_and_simulator_share_one_policy_and_one_plan_type():
    import lab_utils.engine.scheduler as engine_scheduler
    import lab_utils.sim as sim

    assert sim.reference_schedule is engine_scheduler.reference_schedule
    assert sim.SchedulerOutput is engine_scheduler.SchedulerOutput


@pytest.mark.parametrize("threshold", [False, True], ids=["no-cap", "long-prefill-cap"])
def test_engine_scheduler_plans_the_simulators_steps_on_random_workloads(threshold):
    preempted = 0
    for seed in range(30):
        wl, cfg = random_case(seed, threshold)
        want = engine_steps(wl, cfg, COST)
        assert sim_steps(simulate(wl, cfg, COST, schedule_fn=reference_schedule)) == want, (seed, cfg)
        assert sim_steps(simulate(wl, cfg, COST)) == want, (seed, cfg)  # fast loop when it applies
        preempted += sum(want[2].values())
    assert preempted > 0  # the cases do exercise preemption


def test_fast_loop_plans_the_reference_steps_on_random_workloads():
    preempted = 0
    for seed in range(100, 160):
        wl, cfg = random_case(seed)
        fast = simulate(wl, cfg, COST)
        ref = simulate(wl, cfg, COST, schedule_fn=reference_schedule)
        assert sim_steps(fast) == sim_steps(ref), (seed, cfg)
        assert [s.prefill_sampled for s in fast.steps] == [s.prefill_sampled for s in ref.steps]
        preempted += sum(r.num_preemptions for r in fast.requests)
    assert preempted > 0
