"""Lab 04 (the course engine): slots in a paged cache, KV capacity, your own scheduling policy on
the real engine's scheduler, a forced preemption, and throughput against max_num_seqs."""

from __future__ import annotations

from lab_utils.grading.registry import question

# The course model's shape (config.json): 30 layers, 3 KV heads of 64 dims.
NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM = 30, 3, 64


@question("04.slot_for", points=2, answers=["slot_for"])
def _(slot_for):
    """Where token `position` of a request lives in the flat paged cache, given its block table."""
    table = [7, 2, 9]
    cases = [(0, 4, 28), (3, 4, 31), (4, 4, 8), (6, 4, 10), (11, 4, 39), (0, 16, 112), (17, 16, 33)]
    for pos, bs, want in cases:
        got = int(slot_for(list(table), pos, bs))
        assert got == want, (f"block table {table}, block_size {bs}, position {pos}: got slot {got}. "
                             "Which logical block holds the position, which physical block is that, "
                             "and where inside it?")


@question("04.kv_capacity_tokens", points=2, answers=["kv_capacity_tokens"])
def _(kv_capacity_tokens):
    """Tokens the engine's KV cache holds for the course model: whole blocks only."""
    for gib, bs, dbytes in [(1.0, 16, 4), (0.5, 16, 2), (0.01, 128, 4), (2.0, 4, 4)]:
        per_block = 2 * NUM_LAYERS * NUM_KV_HEADS * HEAD_DIM * dbytes * bs
        want = int(gib * 2**30 // per_block) * bs
        got = int(kv_capacity_tokens(gib, bs, dbytes))
        assert got == want, (f"kv_cache_gib={gib}, block_size={bs}, dtype_bytes={dbytes}: got {got} tokens. "
                             "Count K and V in every layer, KV heads only, then round down to whole blocks.")


def _drive(schedule_fn, num_blocks: int, block_size: int, budget: int, max_num_seqs: int,
           prompts: dict[str, int], max_tokens: int, max_steps: int = 200):
    """Run a scheduler with `schedule_fn` on fake tokens; returns (plans, scheduler)."""
    from lab_utils.engine import Request, SamplingParams, Scheduler, SchedulerConfig
    from lab_utils.kv import KVCacheManager

    s = Scheduler(KVCacheManager(num_blocks, block_size, enable_caching=False),
                  SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=64),
                  schedule_fn=schedule_fn)
    for rid, n in prompts.items():
        s.add_request(Request(rid, list(range(100, 100 + n)), SamplingParams(temperature=0, max_tokens=max_tokens)))
    plans = []
    while s.has_unfinished_requests() and len(plans) < max_steps:
        try:
            out = s.schedule()
        except RuntimeError as e:
            raise AssertionError(f"step {len(plans) + 1}: the engine refused your plan: {e}") from None
        plans.append((dict(out.num_scheduled_tokens), list(out.preempted_req_ids)))
        sampled = {rid: 5 for rid, n in out.num_scheduled_tokens.items()
                   if out.num_computed_tokens[rid] + n == s.requests[rid].num_tokens}
        s.update_from_output(out, sampled)
    return plans, s


@question("04.my_schedule", points=3, answers=["my_schedule"])
def _(my_schedule):
    """A continuous-batching policy that the engine's Scheduler accepts: chunked prefill, preemption."""
    # 1. Chunked prefill: budget 8, prompts of 6 and 10 tokens.
    plans, s = _drive(my_schedule, 16, 4, 8, 4, {"a": 6, "b": 10}, max_tokens=3)
    assert plans and {k: int(v) for k, v in plans[0][0].items()} == {"a": 6, "b": 2}, (
        f"first step with a budget of 8 and prompts of 6 and 10 tokens: you planned {plans[0][0] if plans else {}}; "
        "admit in arrival order and give the second prompt a chunk of what is left")
    assert not s.has_unfinished_requests(), "the requests never finished: does every running request get tokens?"
    assert s.kv.num_free_blocks == 16, "blocks were not all returned after the requests finished"
    # 2. max_num_seqs: three short prompts, room for two.
    plans, _ = _drive(my_schedule, 16, 4, 64, 2, {"a": 3, "b": 3, "c": 3}, max_tokens=2)
    assert len(plans[0][0]) == 2, "max_num_seqs=2 but the first step ran a different number of requests"
    # 3. Preemption: 4 blocks of 4 tokens, two prompts of 7 tokens that grow past 8.
    plans, s = _drive(my_schedule, 4, 4, 32, 4, {"a": 7, "b": 7}, max_tokens=6)
    preempting = [p for p in plans if p[1]]
    assert preempting, "the KV cache ran out but nothing was preempted (use state.preempt_last())"
    assert preempting[0][1] == ["b"], (f"first preemption took {preempting[0][1]}; preempt the most "
                                       "recently admitted request, not the oldest")
    assert "a" in preempting[0][0] and "b" not in preempting[0][0], \
        "in the preempting step the oldest request should keep decoding and the victim must not run"
    assert not s.has_unfinished_requests(), "after a preemption the victim must come back and finish"
    assert s.kv.num_free_blocks == 4, "blocks leaked after preemption"


@question("04.preemption", points=2, answers=["preemption_result"])
def _(preemption_result):
    """Your forced-preemption run: how many preemptions, and whether greedy outputs stayed identical."""
    r = dict(preemption_result)
    assert set(r) >= {"num_preemptions", "outputs_identical", "free_blocks_after", "num_blocks"}, \
        "a dict with num_preemptions, outputs_identical, free_blocks_after and num_blocks"
    assert int(r["num_preemptions"]) > 0, "no preemption happened: make the KV cache smaller"
    assert bool(r["outputs_identical"]) is True, \
        "recompute must give the same greedy tokens as the roomy run; compare token ids, not text"
    assert int(r["free_blocks_after"]) == int(r["num_blocks"]), "every block should be free at the end"


@question("04.throughput_vs_batch", points=2, answers=["throughput"])
def _(throughput):
    """Output tokens/s you measured for each max_num_seqs (at least three sizes, including 1)."""
    t = {int(k): float(v) for k, v in dict(throughput).items()}
    assert len(t) >= 3 and 1 in t, "measure at least three max_num_seqs values, one of them 1"
    assert all(v > 0 for v in t.values()), "throughputs are positive tokens per second"
    sizes = sorted(t)
    assert t[sizes[-1]] > t[1], ("the largest batch should beat max_num_seqs=1: one decode step reads "
                                 "the weights once for every request in the batch")
