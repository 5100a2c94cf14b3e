"""Real runs as timelines: per-request times measured on a server or with transformers, as a SimResult.

    prompts = token_prompts(workload)                       # exact-length token-id prompts
    vllm_run = run_vllm(srv.base_url, srv.model_name, workload, prompts)   # continuous, streamed
    hf_run = run_static_transformers(model_dir, workload, prompts, batch_size=4)
    plot_timeline(vllm_run); plot_timeline(hf_run)           # the simulator's plotting code

A measured request has an arrival (when the client sent it), a first-token time (first streamed
chunk) and a finish time. Which batch slot it used is not observable from outside vLLM, so
`trace_result` packs requests into the fewest lanes (a lane per concurrent request).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .results import RequestRecord, Residency, SimResult
from .workload import WorkloadRequest


def _get(row, name: str, default=None):
    return row.get(name, default) if isinstance(row, dict) else getattr(row, name, default)


def trace_result(
    rows: Sequence,
    *,
    policy: str = "measured",
    num_slots: int | None = None,
    max_concurrency: int | None = None,
) -> SimResult:
    """Build a SimResult from measured rows so the timeline and metrics can use them.

    Each row (dict or object) needs request_id, arrival_time, first_token_time, finish_time and
    output_len; optional: prompt_len, scheduled_time (bar start; default arrival), slot, held_until.
    Times may be absolute (perf_counter); they are shifted so the first arrival is 0.

    `max_concurrency` (the server's max_num_seqs) infers when each request without a
    scheduled_time was admitted: in first-token order, a request starts when it has arrived and one
    of the `max_concurrency` slots is free, so queueing is no longer drawn as a running slot.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("trace_result needs at least one measured request")
    if max_concurrency is not None:
        import heapq

        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        releases: list[float] = []
        inferred = {}
        for i in sorted(range(len(rows)), key=lambda k: float(_get(rows[k], "first_token_time"))):
            r = rows[i]
            if _get(r, "scheduled_time") is not None:
                continue
            arrival, first = float(_get(r, "arrival_time")), float(_get(r, "first_token_time"))
            free_at = heapq.heappop(releases) if len(releases) >= max_concurrency else arrival
            inferred[i] = min(first, max(arrival, free_at))
            heapq.heappush(releases, float(_get(r, "finish_time")))
        rows = [
            ({**_as_dict(r), "scheduled_time": inferred[i]} if i in inferred else r)
            for i, r in enumerate(rows)
        ]
    t0 = min(float(_get(r, "arrival_time")) for r in rows)
    records, spans = [], []
    for r in rows:
        arrival = float(_get(r, "arrival_time")) - t0
        first = float(_get(r, "first_token_time")) - t0
        finish = float(_get(r, "finish_time")) - t0
        if not arrival <= first <= finish:
            raise ValueError(
                f"request {_get(r, 'request_id')}: need arrival <= first token <= finish, "
                f"got {arrival:.4f}, {first:.4f}, {finish:.4f}"
            )
        start = _get(r, "scheduled_time")
        start = arrival if start is None else float(start) - t0
        held = _get(r, "held_until")
        rec = RequestRecord(
            _get(r, "request_id"),
            arrival,
            int(_get(r, "prompt_len", 1) or 1),
            int(_get(r, "output_len")),
            scheduled_time=start,
            first_token_time=first,
            finish_time=finish,
        )
        records.append(rec)
        spans.append((start, first, finish, None if held is None else float(held) - t0, _get(r, "slot")))
    # lanes: given slots as they are, the rest packed greedily (lowest free lane first)
    lane_free: list[float] = []
    order = sorted(range(len(records)), key=lambda i: (spans[i][0], i))
    for i in order:
        start, first, finish, held, slot = spans[i]
        release = finish if held is None else max(finish, held)
        if slot is None:
            slot = next((k for k, free_at in enumerate(lane_free) if free_at <= start + 1e-9), len(lane_free))
        slot = int(slot)
        while len(lane_free) <= slot:
            lane_free.append(0.0)
        lane_free[slot] = max(lane_free[slot], release)
        records[i].residencies.append(Residency(slot, start, first, finish, held))
    lanes = len(lane_free) if num_slots is None else max(num_slots, len(lane_free))
    return SimResult(policy, lanes, records, measured=True)


def _as_dict(row) -> dict:
    if isinstance(row, dict):
        return row
    return {
        k: getattr(row, k)
        for k in (
            "request_id",
            "arrival_time",
            "first_token_time",
            "finish_time",
            "output_len",
            "prompt_len",
            "slot",
            "held_until",
        )
        if hasattr(row, k)
    }


def token_prompts(
    workload: Sequence[WorkloadRequest], seed: int = 0, low: int = 1000, high: int = 20000
) -> list[list[int]]:
    """One prompt of exactly `prompt_len` token ids per request (random ordinary-vocabulary ids, seeded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(low, high, size=w.prompt_len)] for w in workload]


# ----------------------------------------------------------------------------- vLLM (continuous)
async def run_vllm_async(
    base_url: str,
    model: str,
    workload: Sequence[WorkloadRequest],
    prompts: Sequence[Sequence[int]],
    api_key: str = "unused",
    max_num_seqs: int | None = None,
) -> SimResult:
    """Send the workload to a vLLM OpenAI server at its arrival times, streaming; measure each request.

    Every request asks for exactly `output_len` tokens (`ignore_eos`, `min_tokens`), so the work is
    the same as in the simulator.
    """
    import asyncio

    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
    t0 = time.perf_counter()
    rows: list[dict] = []

    async def one(w: WorkloadRequest, prompt: Sequence[int]) -> None:
        delay = w.arrival_time - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.perf_counter()
        first = None
        chunks = 0
        usage = None
        stream = await client.completions.create(
            model=model,
            prompt=list(prompt),
            max_tokens=w.output_len,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "min_tokens": w.output_len},
        )
        async for chunk in stream:
            if chunk.choices:  # one chunk per token; its text may be empty (a partial character)
                chunks += 1
                if first is None:
                    first = time.perf_counter()
            if getattr(chunk, "usage", None) is not None:
                usage = chunk.usage
        done = time.perf_counter()
        rows.append(
            {
                "request_id": w.request_id,
                "arrival_time": sent,
                "first_token_time": first or done,
                "finish_time": done,
                "prompt_len": w.prompt_len,
                "output_len": int(usage.completion_tokens) if usage else w.output_len,
                "streamed_chunks": chunks,
            }
        )

    try:
        await asyncio.gather(*(one(w, p) for w, p in zip(workload, prompts)))
    finally:
        await client.close()
    rows.sort(key=lambda r: r["request_id"])
    return trace_result(rows, policy="vLLM (continuous batching, measured)", max_concurrency=max_num_seqs)


def run_vllm(
    base_url: str,
    model: str,
    workload: Sequence[WorkloadRequest],
    prompts: Sequence[Sequence[int]],
    api_key: str = "unused",
    max_num_seqs: int | None = None,
) -> SimResult:
    """Blocking wrapper of `run_vllm_async` that also works inside Jupyter's running event loop.

    Pass the server's `max_num_seqs` to draw inferred admission times instead of client arrivals.
    """
    import asyncio
    import concurrent.futures

    coro_args = (base_url, model, workload, prompts, api_key, max_num_seqs)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_vllm_async(*coro_args))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a notebook: run in a fresh loop elsewhere
        return pool.submit(lambda: asyncio.run(run_vllm_async(*coro_args))).result()


# ----------------------------------------------------------------------------- transformers (static)
def run_static_transformers(
    model_path,
    workload: Sequence[WorkloadRequest],
    prompts: Sequence[Sequence[int]],
    batch_size: int,
    *,
    dtype: str = "float32",
    model=None,
) -> SimResult:
    """Serve the workload with `transformers.generate` in static batches and measure every request.

    A batch is formed from whoever has arrived (up to `batch_size`), left-padded, and generated
    to its longest `output_len`; a request's finish is the step that produced its last wanted
    token, but its row keeps computing until the batch ends (the padding the timeline shows grey).
    """
    import torch
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=getattr(torch, dtype))
    model.eval()
    pad_id = model.config.pad_token_id
    if pad_id is None:
        eos = model.config.eos_token_id
        pad_id = eos[0] if isinstance(eos, (list, tuple)) else (eos if eos is not None else 0)

    class StepClock(StoppingCriteria):
        """Records the wall time after every generated token (never stops generation)."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    order = sorted(range(len(workload)), key=lambda i: (workload[i].arrival_time, workload[i].request_id))
    t0 = time.perf_counter()
    rows: list[dict] = []
    pos = 0
    while pos < len(order):
        now = time.perf_counter() - t0
        first_arrival = workload[order[pos]].arrival_time
        if first_arrival > now:
            time.sleep(first_arrival - now)
            now = time.perf_counter() - t0
        batch = []
        while pos < len(order) and len(batch) < batch_size and workload[order[pos]].arrival_time <= now:
            batch.append(order[pos])
            pos += 1
        longest = max(len(prompts[i]) for i in batch)
        ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, i in enumerate(batch):  # left padding: every prompt ends at the same column
            p = torch.tensor(list(prompts[i]), dtype=torch.long)
            ids[row, longest - len(p) :] = p
            mask[row, longest - len(p) :] = 1
        new_tokens = max(workload[i].output_len for i in batch)
        clock = StepClock()
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                stopping_criteria=StoppingCriteriaList([clock]),
            )
        end = clock.times[-1] if clock.times else time.perf_counter()
        for slot, i in enumerate(batch):
            w = workload[i]
            rows.append(
                {
                    "request_id": w.request_id,
                    "arrival_time": t0 + w.arrival_time,
                    "scheduled_time": start,
                    "first_token_time": clock.times[0],
                    "finish_time": clock.times[w.output_len - 1],
                    "held_until": end,
                    "prompt_len": w.prompt_len,
                    "output_len": w.output_len,
                    "slot": slot,
                }
            )
    rows.sort(key=lambda r: r["request_id"])
    result = trace_result(
        rows, policy=f"transformers static batches of {batch_size} (measured)", num_slots=batch_size
    )
    return result
