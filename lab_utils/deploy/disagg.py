"""Prefill/decode disaggregation, simulated with the course simulator (lab_utils.sim).

Colocated: every GPU runs both phases; a long prompt's prefill shares steps with the decodes of
other requests (chunked prefill), so those decodes slow down (TPOT) while the prompt waits its
turn (TTFT). Disaggregated: a prefill pool computes prompts and the first token, the KV cache
moves to a decode pool (`transfer_s` per request), and decode steps never carry prefill work.

    out = compare_pools(poisson_workload(200, rate=8, prompt_len=2000, output_len=128),
                        num_gpus=4, prefill_gpus=1, cost=StepCostModel.from_gpu("H100-80GB", 8e9))
    out["colocated"]["tpot_p95"], out["disaggregated"]["tpot_p95"]

Requests go to the GPUs of a pool in turn (round robin). In the decode pool a request starts with
a one-token step (its KV cache arrived, the first decode token is computed there) and generates
the rest; its TPOT counts from the first token the prefill pool produced, so the transfer and any
wait for a decode slot show up in it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..sim import ContinuousBatching, StepCostModel, WorkloadRequest, simulate
from ..sim.metrics import percentile


def _pool(
    workload: Sequence[WorkloadRequest], gpus: int, policy: ContinuousBatching, cost: StepCostModel
) -> dict:
    parts: list[list[WorkloadRequest]] = [[] for _ in range(gpus)]
    for i, w in enumerate(sorted(workload, key=lambda w: (w.arrival_time, w.request_id))):
        parts[i % gpus].append(w)
    out = {}
    for part in parts:
        if part:
            for r in simulate(part, policy, cost).requests:
                out[r.request_id] = r
    return out


def _stats(ttft: list[float], tpot: list[float]) -> dict:
    return {
        "ttft_p50": percentile(ttft, 50),
        "ttft_p95": percentile(ttft, 95),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p95": percentile(tpot, 95),
        "requests": len(ttft),
    }


def colocated(
    workload: Sequence[WorkloadRequest],
    num_gpus: int,
    cost: StepCostModel,
    policy: ContinuousBatching | None = None,
) -> dict:
    """TTFT and TPOT percentiles (s) with `num_gpus` GPUs each running prefill and decode."""
    policy = policy or ContinuousBatching(max_num_seqs=64, max_num_batched_tokens=2048)
    recs = _pool(workload, num_gpus, policy, cost)
    return _stats([r.ttft for r in recs.values()], [r.tpot for r in recs.values() if r.tpot is not None])


def disaggregated(
    workload: Sequence[WorkloadRequest],
    prefill_gpus: int,
    decode_gpus: int,
    cost: StepCostModel,
    transfer_s: float = 0.005,
    policy: ContinuousBatching | None = None,
) -> dict:
    """TTFT and TPOT percentiles (s) with a prefill pool and a decode pool."""
    if prefill_gpus < 1 or decode_gpus < 1:
        raise ValueError("each pool needs at least one GPU")
    policy = policy or ContinuousBatching(max_num_seqs=64, max_num_batched_tokens=2048)
    pre = _pool(
        [WorkloadRequest(w.request_id, w.arrival_time, w.prompt_len, 1) for w in workload],
        prefill_gpus,
        policy,
        cost,
    )
    first = {w.request_id: pre[w.request_id].first_token_time for w in workload}
    ttft = [first[w.request_id] - w.arrival_time for w in workload]
    follow = [
        WorkloadRequest(w.request_id, first[w.request_id] + transfer_s, 1, w.output_len - 1)
        for w in workload
        if w.output_len > 1
    ]
    dec = _pool(follow, decode_gpus, policy, cost)
    tpot = [(dec[f.request_id].finish_time - first[f.request_id]) / f.output_len for f in follow]
    return _stats(ttft, tpot)


def compare_pools(
    workload: Sequence[WorkloadRequest],
    num_gpus: int,
    prefill_gpus: int,
    cost: StepCostModel,
    transfer_s: float = 0.005,
) -> dict:
    """Colocated on `num_gpus` vs `prefill_gpus` + (num_gpus - prefill_gpus) under the same load."""
    return {
        "colocated": colocated(workload, num_gpus, cost),
        "disaggregated": disaggregated(workload, prefill_gpus, num_gpus - prefill_gpus, cost, transfer_s),
    }


__all__ = ["colocated", "compare_pools", "disaggregated"]
