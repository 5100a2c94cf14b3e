"""Lab 04 (the course engine): slots in a paged cache, KV capacity, a prediction of the blocks each
request needs, your own scheduling policy on the real engine's scheduler, a forced preemption, and
throughput against max_num_seqs.

Measured answers (`tight_run`, `sweep_runs`) are `lab_utils.engine.EngineRun` objects returned by
`LLMEngine.measure`, stamped in that run; the hidden checks verify the stamp and re-derive every
figure from the per-step records.
"""

from __future__ import annotations

from lab_utils.grading.checks import inside, measured
from lab_utils.grading.registry import question, scenario

# The engine's references: the learner's answers may neither be nor call them.
_SCHEDULERS = [
    "lab_utils.engine.scheduler:Scheduler.reference_schedule",
    "lab_utils.sim.scheduler:reference_schedule",
]
_KV_SIZING = [
    "lab_utils.memory.kv:kv_cache_capacity_tokens",
    "lab_utils.memory.kv:kv_cache_num_blocks",
    "lab_utils.memory.kv:kv_cache_block_bytes",
    "lab_utils.memory.kv:vllm_kv_cache_report",
    "lab_utils.engine.llama:LlamaConfig.kv_bytes_per_token",
]


@scenario("04")
def _(rng):
    """Three requests of random token ids for the block prediction and the forced preemption."""
    block_size = rng.choice([4, 8])
    # every request grows by at least one block, so a cache that admits all three must preempt
    return {
        "block_size": block_size,
        "prompt_lens": [rng.randint(6, 24) for _ in range(3)],
        "max_tokens": rng.randint(block_size + 1, block_size + 6),
        "token_seed": rng.randrange(1_000_000),
    }


# --- 04.slot_for --------------------------------------------------------------------------------


# No forbid: the model runner computes slots inline while it builds a step's inputs, so there is no
# importable reference of this formula to forbid.
@question("04.slot_for", points=2, answers=["slot_for"])
def _(slot_for):
    """Where token `position` of a request lives in the flat paged cache, given its block table."""
    got = int(slot_for([7, 2, 9], 0, 4))
    assert 28 <= got < 32, (
        "block table [7, 2, 9], 4-token blocks, position 0: your slot lies outside "
        "physical block 7. Which rows of the flat cache does a block own?"
    )
    a, b = int(slot_for([7, 2, 9], 4, 4)), int(slot_for([7, 2, 9], 5, 4))
    assert b == a + 1 and a // 4 == 2, (
        "consecutive positions inside one logical block should be "
        "neighbouring rows of that block's physical block"
    )


# --- 04.kv_capacity_tokens ----------------------------------------------------------------------


@question("04.kv_capacity_tokens", points=2, answers=["kv_capacity_tokens"], forbid=_KV_SIZING)
def _(kv_capacity_tokens):
    """Tokens a paged KV cache holds for a model shape: whole blocks only."""
    a = int(kv_capacity_tokens(1.0, 16, 4, 30, 3, 64))
    b = int(kv_capacity_tokens(1.0, 16, 2, 30, 3, 64))
    assert a > 0 and a % 16 == 0, "the cache holds whole blocks: a multiple of the block size"
    assert 1.9 < b / a < 2.1, "halving the bytes per value should about double the tokens"


# --- 04.blocks_needed (predict, then the roomy run measures it) -----------------------------------


@question("04.blocks_needed", points=2, answers=["predicted_blocks"], predict=True)
def _(predicted_blocks):
    """Predicted blocks each SCENARIO request holds at its longest (prompt order), before measuring."""
    got = [int(x) for x in predicted_blocks]
    assert len(got) >= 1 and all(x >= 1 for x in got), "one positive whole number of blocks per request"


# --- 04.my_schedule -----------------------------------------------------------------------------


def _drive(
    schedule_fn,
    num_blocks: int,
    block_size: int,
    budget: int,
    max_num_seqs: int,
    prompts: dict[str, int],
    max_tokens: int,
    max_steps: int = 300,
):
    """Run a scheduler with `schedule_fn` (None: the reference) on fake tokens; (plans, scheduler)."""
    from lab_utils.engine import Request, SamplingParams, Scheduler, SchedulerConfig
    from lab_utils.kv import KVCacheManager

    s = Scheduler(
        KVCacheManager(num_blocks, block_size, enable_caching=False),
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=256),
        schedule_fn=schedule_fn,
    )
    for rid, n in prompts.items():
        s.add_request(
            Request(rid, list(range(100, 100 + n)), SamplingParams(temperature=0, max_tokens=max_tokens))
        )
    plans = []
    while s.has_unfinished_requests() and len(plans) < max_steps:
        try:
            out = s.schedule()
        except NotImplementedError:
            raise
        except RuntimeError as e:
            raise AssertionError(f"step {len(plans) + 1}: the engine refused your plan: {e}") from None
        plans.append(
            ({str(k): int(v) for k, v in out.num_scheduled_tokens.items()}, list(out.preempted_req_ids))
        )
        if not out.num_scheduled_tokens:
            break  # a stall: the plans so far are what the comparison sees
        sampled = {
            rid: 5
            for rid, n in out.num_scheduled_tokens.items()
            if out.num_computed_tokens[rid] + n == s.requests[rid].num_tokens
        }
        s.update_from_output(out, sampled)
    return plans, s


@question("04.my_schedule", points=3, answers=["my_schedule"], forbid=_SCHEDULERS)
def _(my_schedule):
    """A continuous-batching policy that the engine's Scheduler accepts: chunked prefill, preemption."""
    # 1. a token budget smaller than the prompts: chunked prefill, everything finishes, nothing leaks
    plans, s = inside(_drive, my_schedule, 16, 4, 8, 4, {"a": 6, "b": 10}, max_tokens=3)
    assert plans and sum(plans[0][0].values()) == 8 and "a" in plans[0][0], (
        "first step: with a budget smaller than the two prompts, the first request should be served "
        "and the budget used up (a prompt may be cut into chunks)"
    )
    assert not s.has_unfinished_requests(), (
        "the requests never finished: does every running request get tokens?"
    )
    assert s.kv.num_free_blocks == 16, "blocks were not all returned after the requests finished"
    # 2. a cache too small for both requests to grow: someone must be preempted, and come back
    plans, s = inside(_drive, my_schedule, 4, 4, 32, 4, {"a": 7, "b": 7}, max_tokens=6)
    assert any(p[1] for p in plans), "the KV cache ran out but nothing was preempted"
    assert not s.has_unfinished_requests(), "after a preemption the victim must come back and finish"
    assert s.kv.num_free_blocks == 4, "blocks leaked after preemption"


# --- 04.preemption (measured) -------------------------------------------------------------------


def _engine_run() -> type:
    from lab_utils.engine.measure import EngineRun

    return EngineRun


@question("04.preemption", points=2, answers=["tight_run"])
def _(tight_run):
    """Your forced-preemption run: an EngineRun from `engine.measure` on a cache you sized."""
    run = measured(tight_run, _engine_run(), "tight_run", "engine.measure(...)")
    assert run.num_preemptions > 0, "no preemption happened: how many blocks must the cache lack?"
    assert run.free_blocks_after == run.settings["num_blocks"], "every block should be free at the end"


# --- 04.throughput_vs_batch (measured) ----------------------------------------------------------


@question("04.throughput_vs_batch", points=2, answers=["sweep_runs", "throughput"])
def _(sweep_runs, throughput):
    """One EngineRun per max_num_seqs (at least three, including 1), and the tokens/s you derived."""
    runs = {
        int(k): measured(v, _engine_run(), f"sweep_runs[{k}]", "engine.measure(...)")
        for k, v in dict(sweep_runs).items()
    }
    assert len(runs) >= 3 and 1 in runs, "measure at least three max_num_seqs values, one of them 1"
    t = {int(k): float(v) for k, v in dict(throughput).items()}
    assert set(t) == set(runs), "one throughput per run, keyed by max_num_seqs"
    assert all(v > 0 for v in t.values()), "throughputs are positive tokens per second"
