"""Lab 03: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab03`.
"""

from __future__ import annotations

from grader.hidden.schedules import v1_step
from grader.registry import hidden
from lab_utils.grading.checks import close, partial
from lab_utils.grading.questions.lab03 import _batcher_choice, _plans, _same_plans


def scenario_batch(s: dict) -> list:
    """The section-1 batch of scenario `s` (a workload for the simulator)."""
    from lab_utils.sim import fixed_workload

    outs = [s["short_len"]] * (s["batch_size"] - 1) + [s["long_len"]]
    return fixed_workload([s["prompt_len"]] * len(outs), outs)


def scenario_cost(s: dict):
    """The section-1 step cost model of scenario `s`."""
    from lab_utils.sim import StepCostModel

    return StepCostModel(fixed_s=s["fixed_ms"] / 1e3, per_token_s=s["per_token_ms"] / 1e3)


def triton_scenario(s: dict):
    """(workload, cost model) of scenario `s`'s dynamic-batcher exercise."""
    from lab_utils.sim import StepCostModel, poisson_workload

    workload = poisson_workload(
        s["triton_num_requests"], s["triton_rate"], prompt_len=1, output_len=1, seed=s["triton_seed"]
    )
    return workload, StepCostModel(
        fixed_s=s["triton_fixed_ms"] / 1e3, per_token_s=s["triton_per_item_ms"] / 1e3
    )


def _simulated_utilisation(lens: list[int]) -> float:
    from lab_utils.sim import StaticBatching, StepCostModel, fixed_workload, simulate, summarize

    run = simulate(
        fixed_workload([1] * len(lens), list(lens)),
        StaticBatching(len(lens)),
        StepCostModel(fixed_s=0.01, per_token_s=0.0),
    )
    return summarize(run).slot_utilisation


@hidden("03.static_utilisation")
def _(static_slot_utilisation, rng, scenario):
    cases = [[scenario["short_len"]] * (scenario["batch_size"] - 1) + [scenario["long_len"]]]
    cases += [[rng.randint(1, 60) for _ in range(rng.randint(1, 12))] for _ in range(12)]
    passed = sum(close(static_slot_utilisation(list(c)), _simulated_utilisation(c), 1e-6) for c in cases)
    return partial(passed, len(cases), "batches")


def reference_ratios(s: dict) -> dict[str, float]:
    """The reference: the three ratios of scenario `s`, measured on the simulator at a flat step cost."""
    from lab_utils.sim import ContinuousBatching, StaticBatching, StepCostModel, fixed_workload, simulate

    flat = StepCostModel(fixed_s=1.0, per_token_s=0.0)  # one second per step: time counts steps
    B, short, long_, P = s["batch_size"], s["short_len"], s["long_len"], s["prompt_len"]
    outs = [short] * (B - 1) + [long_]
    static = simulate(fixed_workload([P] * B, outs), StaticBatching(B), flat)
    # same mix, endless queue: steady state = every continuous slot busy vs the static batch's share
    busy = sum(len(st.decode) for st in static.steps) + B
    rows = B * len(static.steps)
    same_mix = rows / busy
    # short requests queued behind the batch: requests finished and tokens produced while the
    # long request runs
    extra = B * (long_ // short + 2)
    queued = fixed_workload([P] * (B + extra), outs + [short] * extra)
    horizon = float(long_) + 1e-9  # prefill samples the first token, so long_ steps finish the long one
    done = {}
    for name, policy in (
        ("static", StaticBatching(B)),
        ("continuous", ContinuousBatching(B, max(2048, B * P))),
    ):
        run = simulate(queued, policy, flat)
        finished = sum(1 for r in run.requests if r.finish_time <= horizon)
        produced = sum(len(st.sampled) for st in run.steps if st.end <= horizon)
        done[name] = (finished, produced)
    return {
        "RATIO_SAME_MIX": same_mix,
        "RATIO_SHORT_QUEUE_REQUESTS": done["continuous"][0] / done["static"][0],
        "RATIO_SHORT_QUEUE_TOKENS": done["continuous"][1] / done["static"][1],
    }


def _fresh_batch(rng) -> dict:
    """A section-1 batch and step cost the notebook never saw (wider than the public scenario's)."""
    short = rng.randint(2, 120)
    return {
        "batch_size": rng.randint(2, 32),
        "short_len": short,
        "long_len": rng.randint(short + 1, 1200),
        "prompt_len": rng.choice([1, 8, 16, 32, 64, 128]),
        "fixed_ms": round(rng.uniform(1.0, 40.0), 2),
        "per_token_ms": rng.choice([0.25, 0.5, 1.0, 1.5, 2.0, 3.0]),
    }


def _batch_cases(rng, scenario, n: int = 15) -> list[dict]:
    keys = ("batch_size", "short_len", "long_len", "prompt_len", "fixed_ms", "per_token_ms")
    return [{k: scenario[k] for k in keys}] + [_fresh_batch(rng) for _ in range(n - 1)]


RATIO_TOLERANCE = 0.02


@hidden("03.queue_ratios")
def _(queue_ratios, rng, scenario):
    from lab_utils.grading.questions.lab03 import _three

    passed = total = 0
    for case in _batch_cases(rng, scenario):
        want = list(reference_ratios(case).values())
        total += 3
        try:
            got = _three(queue_ratios(dict(case)))
        except AssertionError:
            continue
        passed += sum(close(g, w, RATIO_TOLERANCE) for g, w in zip(got, want))
    return partial(passed, total, "ratios of unseen batches")


def no_queue_gain(s: dict) -> float:
    """The reference model: the simulator's continuous / static tokens-per-second ratio for the batch."""
    from lab_utils.sim import ContinuousBatching, StaticBatching, simulate, summarize

    batch, cost = scenario_batch(s), scenario_cost(s)
    B = s["batch_size"]
    static = summarize(simulate(batch, StaticBatching(B, pad_finished=True), cost)).output_tokens_per_s
    cont = summarize(
        simulate(batch, ContinuousBatching(B, max(2048, B * s["prompt_len"])), cost)
    ).output_tokens_per_s
    return cont / static


GAIN_TOLERANCE = 0.03  # the prediction may differ from the simulator by 3%


@hidden("03.predict_gain")
def _(predicted_no_queue_gain, rng, scenario):
    cases = _batch_cases(rng, scenario)
    passed = sum(close(predicted_no_queue_gain(dict(c)), no_queue_gain(c), GAIN_TOLERANCE) for c in cases)
    return partial(passed, len(cases), "unseen batches within 3% of the simulator")


def _throughput(samples) -> float:
    """The reference: output tokens per second over the run (first arrival to last finish)."""
    tokens = sum(s[0] for s in samples)
    return tokens / (max(s[2] for s in samples) - min(s[1] for s in samples))


def _made_up_runs(rng) -> tuple[list, list]:
    """Two runs of the same requests (static, continuous) as BatchingGain keeps them, in a random
    order, arrivals at 0 or staggered (a queue), the first arrival not always at 0."""
    n = rng.randint(1, 14)
    start = rng.choice([0.0, 0.0, rng.uniform(0.1, 50.0)])
    staggered = rng.random() < 0.6
    reqs = []
    for _ in range(n):
        arrival = start + (rng.uniform(0.0, 5.0) if staggered else 0.0)
        reqs.append((float(rng.randint(1, 500)), arrival))
    runs = []
    for _ in range(2):
        run = [
            [tok, arr, arr + rng.uniform(0.05, 1.0) * tok * rng.uniform(0.005, 0.05) + 0.01]
            for tok, arr in reqs
        ]
        rng.shuffle(run)
        runs.append(run)
    return runs[0], runs[1]


def scenario_runs(s: dict) -> tuple[list, list]:
    """The scenario's batch under both policies, as `measure_batching_gain` keeps the samples."""
    from lab_utils.sim import ContinuousBatching, StaticBatching, simulate

    batch, B = scenario_batch(s), s["batch_size"]
    budget = max(2048, B, sum(w.prompt_len for w in batch))
    out = []
    for policy in (StaticBatching(B, pad_finished=True), ContinuousBatching(B, budget)):
        res = simulate(batch, policy, scenario_cost(s))
        out.append([[float(r.output_len), float(r.arrival_time), float(r.finish_time)] for r in res.requests])
    return out[0], out[1]


@hidden("03.measured_gain")
def _(throughput_gain, rng, scenario):
    # the scenario's own runs first, then made-up runs the notebook never produced
    pairs = [scenario_runs(scenario)] + [_made_up_runs(rng) for _ in range(14)]
    passed = 0
    for static, cont in pairs:
        want = _throughput(cont) / _throughput(static)
        got = throughput_gain([list(r) for r in static], [list(r) for r in cont])
        passed += close(got, want, 1e-6)
    return partial(passed, len(pairs), "pairs of runs")


def _random_trace(rng):
    from lab_utils.sim import ContinuousBatching, LengthDist, poisson_workload

    bs, seqs = rng.choice([2, 4, 8]), rng.randint(1, 6)
    budget, chunk = rng.randint(seqs, 40), rng.random() < 0.7
    wl = poisson_workload(
        rng.randint(3, 18),
        rng.uniform(0.5, 8.0),
        LengthDist("uniform", low=2, high=30 if chunk else max(3, budget // 2)),
        LengthDist("uniform", low=1, high=12),
        seed=rng.randint(0, 10**6),
    )
    if not chunk:
        wl = [w for w in wl if w.prompt_len + w.output_len <= budget] or wl[:0]
    if not wl:
        return None
    need = max(-(-(w.prompt_len + w.output_len - 1) // bs) for w in wl)
    blocks = rng.choice([None, need, need + 2, 3 * need])
    return wl, ContinuousBatching(seqs, budget, chunk, blocks, bs)


def _ref_watermark_schedule(state, watermark: int):
    """vLLM v1's step with vLLM v0's admission watermark: a waiting request is admitted only if at
    least `watermark` blocks stay free after its allocation; running requests may use every block."""
    from lab_utils.sim import SchedulerOutput

    return v1_step(state, SchedulerOutput(), watermark=watermark)


def watermark_traces(rng, count: int = 14) -> list:
    """Traces, each with a watermark, on which the watermark changes the plans (and the run ends)."""
    from lab_utils.sim import reference_schedule

    out = []
    for _ in range(30 * count):
        trace = _random_trace(rng)
        if trace is None or trace[1].num_kv_blocks is None:
            continue
        wl, cfg = trace
        watermark = rng.randint(1, max(1, cfg.num_kv_blocks // 2))
        want = _plans(_ref_watermark_schedule, wl, cfg, (watermark,))
        if want is not None and want != _plans(reference_schedule, wl, cfg):
            out.append((wl, cfg, watermark, want))
        if len(out) == count:
            break
    return out


@hidden("03.continuous_step")
def _(my_schedule, rng, scenario):
    traces = watermark_traces(rng)
    passed = sum(_same_plans(my_schedule, wl, cfg, w, want) for wl, cfg, w, want in traces)
    return partial(passed, len(traces), "traces")


def _reference_goodput(reqs, ttft_slo: float, tpot_slo: float) -> float:
    from lab_utils.sim import SLO, goodput
    from lab_utils.sim.results import RequestRecord, SimResult

    records = []
    for i, (arrival, first, finish, n) in enumerate(reqs):
        r = RequestRecord(i, arrival, 1, n)
        r.first_token_time, r.finish_time = first, finish
        records.append(r)
    return goodput(SimResult("given", 1, records), SLO(ttft_s=ttft_slo, tpot_s=tpot_slo))


@hidden("03.goodput")
def _(goodput_rps, rng, scenario):
    passed, total = 0, 15
    for _ in range(total):
        reqs = []
        for _ in range(rng.randint(1, 12)):
            arrival = rng.uniform(0, 5)
            first = arrival + rng.uniform(0.01, 2.0)
            n = rng.choice([1, 1, 2, 5, 20, 100])
            reqs.append((arrival, first, first + (n - 1) * rng.uniform(0.01, 0.3), n))
        ttft, tpot = rng.uniform(0.1, 2.0), rng.uniform(0.02, 0.3)
        want = _reference_goodput(reqs, ttft, tpot)
        passed += close(goodput_rps([tuple(r) for r in reqs], ttft, tpot), want, 1e-6) or (
            want == 0 and float(goodput_rps([tuple(r) for r in reqs], ttft, tpot)) == 0
        )
    return partial(passed, total, "request sets")


def batcher_outcome(s: dict, delay_us: int, preferred) -> tuple[float, float]:
    """(p99 latency in ms, mean batch size) of a dynamic-batcher setting on scenario `s`."""
    from lab_utils.sim import DynamicBatching, simulate, summarize

    workload, cost = triton_scenario(s)
    res = simulate(
        workload, DynamicBatching(s["triton_max_batch_size"], tuple(preferred), int(delay_us)), cost
    )
    return summarize(res).e2e_p99 * 1e3, len(res.requests) / len(res.steps)


TRITON_DELAYS_US = [0, 2_500, 5_000, 10_000, 15_000, 20_000, 30_000, 40_000]
TRITON_PREFERRED = [(), (4,), (8,), (4, 8), (16,), (8, 16), (32,), (16, 32)]


def triton_grid(s: dict) -> list[tuple[tuple[int, ...], int]]:
    """The settings the reference searches: preferred sizes up to max_batch_size, delays to 40 ms."""
    top = s["triton_max_batch_size"]
    return [(p, d) for p in TRITON_PREFERRED if all(x <= top for x in p) for d in TRITON_DELAYS_US]


def best_p99(s: dict) -> float | None:
    """The lowest p99 (ms) of the grid's settings that reach the mean batch within the p99 objective."""
    ok = [
        p99
        for p99, batch in (batcher_outcome(s, d, pref) for pref, d in triton_grid(s))
        if batch >= s["triton_min_mean_batch"] and p99 <= s["triton_p99_slo_ms"]
    ]
    return min(ok) if ok else None


def _fresh_triton(rng) -> tuple[dict, float]:
    """A dynamic-batcher exercise the notebook never saw, with an objective some setting can meet."""
    while True:
        rate, slo = rng.uniform(150.0, 500.0), rng.choice([30.0, 40.0, 50.0, 60.0, 80.0])
        top = rng.choice([8, 16, 32])
        s = {
            "triton_rate": rate,
            "triton_fixed_ms": rng.choice([2.0, 3.0, 4.0, 5.0, 6.0]),
            "triton_per_item_ms": rng.choice([0.25, 0.5, 1.0]),
            "triton_max_batch_size": top,
            "triton_p99_slo_ms": slo,
            "triton_min_mean_batch": float(
                min(top - 1, max(2, round(rate * slo / 1e3 * rng.uniform(0.08, 0.5))))
            ),
            "triton_num_requests": 1000,
            "triton_seed": rng.randint(0, 10**6),
        }
        best = best_p99(s)
        if best is not None:
            return s, best


P99_SLACK = 0.10  # a scenario counts when the setting meets both objectives within 10% of the best p99


@hidden("03.dynamic_batcher")
def _(choose_batcher, rng, scenario):
    keys = [k for k in scenario if k.startswith("triton_")]
    own = {k: scenario[k] for k in keys}
    cases = [(own, best_p99(own))] + [_fresh_triton(rng) for _ in range(9)]
    passed = 0
    for s, best in cases:
        if best is None:
            continue
        try:
            delay, pref = _batcher_choice(choose_batcher(dict(s)))
        except AssertionError:
            continue
        if not 0 <= delay <= 1_000_000 or not all(1 <= p <= s["triton_max_batch_size"] for p in pref):
            continue
        p99, batch = batcher_outcome(s, delay, pref)
        passed += batch >= s["triton_min_mean_batch"] and p99 <= min(
            s["triton_p99_slo_ms"], best * (1 + P99_SLACK)
        )
    return partial(passed, sum(1 for _, b in cases if b is not None), "unseen exercises")
