"""vLLM v1's scheduling step with the two variations labs 03 and 04 ask for (the grader's; never
inside a sandbox): lab 03's admission watermark (vLLM V0's BlockSpaceManager.can_allocate) and lab
04's priority policy (vllm/v1/core/sched/scheduler.py, 0.32). The course engine's own first-come-
first-served step is lab_utils.engine.scheduler.reference_schedule, which the learner's copy ships.
"""

from __future__ import annotations


def v1_step(state, plan, *, rank=None, watermark: int = 0, newest_victim: bool = False, restore: bool = True):
    """Fill `plan` (an empty SchedulerOutput) with one step and return it.

    rank: None serves first come first served (the newest running request is preempted, the queue's
    head admitted); a key function serves by rank (the largest running rank is preempted, even one
    already planned this step, whose tokens go back to the budget; the smallest waiting rank is
    admitted). watermark: blocks that must stay free after a waiting request's allocation.
    newest_victim / restore=False: two mistakes under `rank` (the newest running request preempted; a
    planned victim's tokens kept out of the budget) that the hidden cases must tell apart from it.
    """
    cfg, kv = state.config, state.kv
    tokens = plan.num_scheduled_tokens
    budget = cfg.max_num_batched_tokens
    i = 0
    while i < len(state.running) and budget > 0:
        req = state.running[i]
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        fits = True
        while kv.allocate_slots(req, n) is None:
            if rank is None:
                victim = state.preempt_last()  # always at or after position i: nothing planned undone
            else:
                victim = state.running[-1] if newest_victim else max(state.running, key=rank)
                if state.running.index(victim) < i:
                    i -= 1
                state.preempt(victim)
                back = tokens.pop(victim.request_id, 0)
                budget += back if restore else 0
            plan.preempted_req_ids.append(victim.request_id)
            if victim is req:
                fits = False
                break
        if not fits:
            break
        tokens[req.request_id] = n
        budget -= n
        i += 1
    if plan.preempted_req_ids:
        return plan
    while state.waiting and budget > 0 and len(state.running) < cfg.max_num_seqs:
        req = state.waiting[0] if rank is None else min(state.waiting, key=rank)
        left = req.num_tokens - req.num_computed_tokens
        n = min(left, budget)
        if n < left and not cfg.enable_chunked_prefill:
            break
        need = -(-(req.num_computed_tokens + n) // kv.block_size)
        if kv.num_free_blocks - need < watermark or kv.allocate_slots(req, n) is None:
            break
        state.admit(req)
        tokens[req.request_id] = n
        budget -= n
    return plan
