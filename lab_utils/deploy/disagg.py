"""Prefill/decode disaggregation, simulated with the course simulator (lab_utils.sim).

Colocated: every GPU runs both phases; a long prompt's prefill shares steps with the decodes of
other requests (chunked prefill), so those decodes slow down (TPOT) while the prompt waits its
turn (TTFT). Disaggregated: a prefill pool computes prompts and the first token, the KV cache
moves to a decode pool, and decode steps never carry prefill work.

    out = compare_pools(poisson_workload(200, rate=8, prompt_len=2000, output_len=128),
                        num_gpus=4, prefill_gpus=1, cost=StepCostModel.from_gpu("H100-80GB", 8e9),
                        kv_bytes_per_token=131072, link_gb_s=50, kv_capacity_tokens=400_000)
    out["colocated"]["tpot_p95"], out["disaggregated"]["tpot_p95"]

What the two layouts pay for, both modelled here:
- **the transfer**: a request's KV cache is `prompt_len x kv_bytes_per_token` bytes, sent over a
  link of `link_gb_s` GB/s (RDMA between nodes: 400 Gb/s is 50 GB/s; NVLink inside a node is
  hundreds of GB/s), plus `link_latency_s` per transfer. Long prompts pay more.
- **KV memory**: each GPU holds `kv_capacity_tokens` tokens of KV cache. A colocated GPU or a
  prefill GPU gets that many tokens of KV blocks in the simulator (it preempts when full). A decode
  GPU holds every running request's whole prompt plus what it has generated, so it runs at most
  kv_capacity_tokens // (prompt_len + output_len) requests at once (the longest request of its
  share sets the bound); the others wait for a slot with their KV cache parked.

Requests go to the GPUs of a pool in turn (round robin). The prefill pool runs each prompt; its
KV cache then crosses the link, and the decode pool streams every output token to the client, the
first one included, as vLLM's router does in its disaggregated mode (the prefill worker's request
asks for one token and its answer is not forwarded). So TTFT = queueing and prefill in the prefill
pool + the transfer + any wait for a decode slot + the first decode step; TPOT is the decode pool's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..sim import ContinuousBatching, StepCostModel, WorkloadRequest, simulate
from ..sim.metrics import percentile

DEFAULT_POLICY = ContinuousBatching(max_num_seqs=64, max_num_batched_tokens=2048)


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


def _with_kv(policy: ContinuousBatching, kv_capacity_tokens: int | None) -> ContinuousBatching:
    if kv_capacity_tokens is None:
        return policy
    return replace(policy, num_kv_blocks=max(1, int(kv_capacity_tokens) // policy.block_size))


def transfer_seconds(
    prompt_len: int, kv_bytes_per_token: int, link_gb_s: float, link_latency_s: float = 0.0
) -> float:
    """Time to move one request's KV cache from the prefill pool to the decode pool."""
    if link_gb_s <= 0:
        raise ValueError("link_gb_s must be positive")
    return link_latency_s + int(prompt_len) * int(kv_bytes_per_token) / (link_gb_s * 1e9)


def decode_slots(
    workload: Sequence[WorkloadRequest], kv_capacity_tokens: int | None, max_num_seqs: int
) -> int:
    """Requests one decode GPU runs at once: its KV capacity over the longest request's whole KV."""
    if kv_capacity_tokens is None or not workload:
        return max_num_seqs
    longest = max(w.prompt_len + w.output_len for w in workload)
    return max(0, min(max_num_seqs, int(kv_capacity_tokens) // longest))


def colocated(
    workload: Sequence[WorkloadRequest],
    num_gpus: int,
    cost: StepCostModel,
    policy: ContinuousBatching | None = None,
    *,
    kv_capacity_tokens: int | None = None,
) -> dict:
    """TTFT and TPOT percentiles (s) with `num_gpus` GPUs each running prefill and decode."""
    policy = _with_kv(policy or DEFAULT_POLICY, kv_capacity_tokens)
    recs = _pool(workload, num_gpus, policy, cost)
    return _stats([r.ttft for r in recs.values()], [r.tpot for r in recs.values() if r.tpot is not None])


def disaggregated(
    workload: Sequence[WorkloadRequest],
    prefill_gpus: int,
    decode_gpus: int,
    cost: StepCostModel,
    policy: ContinuousBatching | None = None,
    *,
    kv_bytes_per_token: int,
    link_gb_s: float,
    link_latency_s: float = 0.0,
    kv_capacity_tokens: int | None = None,
) -> dict:
    """TTFT and TPOT percentiles (s) with a prefill pool and a decode pool, the KV transfer and the
    decode pool's KV memory included (see the module docstring); also the transfer time (p50, p95)
    and the decode slots per GPU the memory allowed."""
    if prefill_gpus < 1 or decode_gpus < 1:
        raise ValueError("each pool needs at least one GPU")
    policy = policy or DEFAULT_POLICY
    pre = _pool(
        [WorkloadRequest(w.request_id, w.arrival_time, w.prompt_len, 1) for w in workload],
        prefill_gpus,
        _with_kv(policy, kv_capacity_tokens),
        cost,
    )
    done = {w.request_id: pre[w.request_id].first_token_time for w in workload}
    moves = {
        w.request_id: transfer_seconds(w.prompt_len, kv_bytes_per_token, link_gb_s, link_latency_s)
        for w in workload
    }
    follow = [
        WorkloadRequest(w.request_id, done[w.request_id] + moves[w.request_id], 1, w.output_len)
        for w in workload
    ]
    slots = decode_slots(workload, kv_capacity_tokens, policy.max_num_seqs)
    if slots < 1:
        raise ValueError("one request's KV cache does not fit a decode GPU")
    dec = _pool(follow, decode_gpus, replace(policy, max_num_seqs=slots), cost)
    arrival = {w.request_id: w.arrival_time for w in workload}
    ttft = [dec[f.request_id].first_token_time - arrival[f.request_id] for f in follow]
    tpot = [dec[f.request_id].tpot for f in follow if dec[f.request_id].tpot is not None]
    out = _stats(ttft, tpot)
    out.update(
        transfer_p50=percentile(list(moves.values()), 50),
        transfer_p95=percentile(list(moves.values()), 95),
        decode_slots=slots,
    )
    return out


def compare_pools(
    workload: Sequence[WorkloadRequest],
    num_gpus: int,
    prefill_gpus: int,
    cost: StepCostModel,
    *,
    kv_bytes_per_token: int,
    link_gb_s: float,
    link_latency_s: float = 0.0,
    kv_capacity_tokens: int | None = None,
) -> dict:
    """Colocated on `num_gpus` vs `prefill_gpus` + (num_gpus - prefill_gpus) under the same load."""
    return {
        "colocated": colocated(workload, num_gpus, cost, kv_capacity_tokens=kv_capacity_tokens),
        "disaggregated": disaggregated(
            workload,
            prefill_gpus,
            num_gpus - prefill_gpus,
            cost,
            kv_bytes_per_token=kv_bytes_per_token,
            link_gb_s=link_gb_s,
            link_latency_s=link_latency_s,
            kv_capacity_tokens=kv_capacity_tokens,
        ),
    }


__all__ = ["colocated", "compare_pools", "decode_slots", "disaggregated", "transfer_seconds"]
