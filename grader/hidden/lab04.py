"""Lab 04: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab04`.
"""

from __future__ import annotations

import math

from grader.registry import hidden
from lab_utils.grading.checks import inside, measured
from lab_utils.grading.questions.lab04 import _drive, _engine_run

_ENGINE_RUN = "lab_utils.engine.measure:EngineRun"


def _ref_blocks(scen: dict) -> list[int]:
    bs, m = scen["block_size"], scen["max_tokens"]
    # the last sampled token's K/V is never written: prompt + max_tokens - 1 tokens live in the cache
    return [math.ceil((p + m - 1) / bs) for p in scen["prompt_lens"]]


@hidden("04.slot_for")
def _(slot_for, rng, scenario):
    wrong = 0
    for _ in range(30):
        bs = rng.choice([1, 2, 4, 8, 16, 128])
        table = rng.sample(range(500), rng.randint(1, 8))
        pos = rng.randrange(len(table) * bs)
        if int(slot_for(list(table), pos, bs)) != table[pos // bs] * bs + pos % bs:
            wrong += 1
    assert not wrong, f"wrong on {wrong} of 30 unseen block tables"


def _ref_capacity(gib, bs, dbytes, layers, kv_heads, head_dim) -> int:
    per_block = 2 * layers * kv_heads * head_dim * dbytes * bs
    return int(int(gib * 2**30) // per_block) * bs


@hidden("04.kv_capacity_tokens")
def _(kv_capacity_tokens, rng, scenario):
    wrong = 0
    for _ in range(25):
        args = (
            rng.choice([0.05, 0.25, 0.5, 1.0, 3.0, 20.0]),
            rng.choice([4, 16, 32, 128]),
            rng.choice([1, 2, 4]),
            rng.randint(2, 80),
            rng.choice([1, 2, 4, 8]),
            rng.choice([64, 80, 128]),
        )
        if int(kv_capacity_tokens(*args)) != _ref_capacity(*args):
            wrong += 1
    assert not wrong, f"wrong on {wrong} of 25 unseen model shapes and cache sizes"


@hidden("04.blocks_needed")
def _(predicted_blocks, rng, scenario):
    # graded exactly (whole blocks, no tolerance): the reference model is the cache's arithmetic
    if [int(x) for x in predicted_blocks] != _ref_blocks(scenario):
        raise AssertionError(
            "the prediction does not match the blocks this seed's requests need: "
            "compute it from SCENARIO, counting which tokens' K/V are ever written"
        )


def _random_case(rng) -> dict:
    bs = rng.choice([2, 4, 8])
    n = rng.randint(2, 6)
    prompts = {f"r{i}": rng.randint(1, 30) for i in range(n)}
    max_tokens = rng.randint(1, 12)
    need_one = max(math.ceil((p + max_tokens) / bs) for p in prompts.values())
    return dict(
        num_blocks=rng.randint(need_one, need_one * n + 2),
        block_size=bs,
        budget=rng.choice([4, 8, 16, 64]),
        max_num_seqs=rng.randint(1, 5),
        prompts=prompts,
        max_tokens=max_tokens,
    )


@hidden("04.my_schedule")
def _(my_schedule, rng, scenario):
    cases = [_random_case(rng) for _ in range(14)]
    wrong = 0
    for case in cases:
        want, _ = _drive(None, **case)
        try:
            got, _ = inside(_drive, my_schedule, **case)
        except AssertionError:
            got = None
        if got != want:
            wrong += 1
    assert not wrong, (
        f"on {wrong} of {len(cases)} unseen workloads your plans differ from vLLM v1's "
        "policy at some step (who runs, how many tokens, who is preempted)"
    )


@hidden("04.preemption")
def _(tight_run, rng, scenario):
    run = measured(tight_run, _engine_run(), "tight_run", "engine.measure(...)")
    if (
        list(run.prompt_lens) != list(scenario["prompt_lens"])
        or run.settings["block_size"] != scenario["block_size"]
    ):
        raise AssertionError("tight_run is not a run of this seed's SCENARIO requests")
    if any(len(t) != scenario["max_tokens"] for t in run.output_token_ids):
        raise AssertionError("every request should generate max_tokens tokens (ignore_eos)")
    preempted = sum(len(s["preempted"]) for s in run.steps)  # re-derived from the raw steps
    if preempted == 0 or run.free_blocks_after != run.settings["num_blocks"]:
        raise AssertionError("the recorded steps show no preemption, or blocks still held at the end")


@hidden("04.throughput_vs_batch")
def _(sweep_runs, throughput, rng, scenario):
    runs = {
        int(k): measured(v, _engine_run(), "sweep_runs", "engine.measure(...)")
        for k, v in dict(sweep_runs).items()
    }
    t = {int(k): float(v) for k, v in dict(throughput).items()}
    for b, run in runs.items():
        if run.settings["max_num_seqs"] != b:
            raise AssertionError(f"sweep_runs[{b}] ran with a different max_num_seqs")
        tokens = sum(len(x) for x in run.output_token_ids)  # from the raw samples
        derived = tokens / run.wall_s
        if not abs(t[b] - derived) <= 0.02 * derived:
            raise AssertionError(f"throughput[{b}] is not the output tokens per second of its run")
    if len({tuple(r.prompt_lens) for r in runs.values()}) != 1:
        raise AssertionError("every size must run the same workload")
    if not runs[max(runs)].tokens_per_s > runs[1].tokens_per_s:
        raise AssertionError("the recorded runs do not show the largest batch beating max_num_seqs=1")
