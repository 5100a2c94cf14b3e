"""Measuring adapters on a server: one batch with k distinct adapters, and a server's memory.

    row = mixed_batch(srv.base_url, ["json", "upper"], prompts, max_tokens=32)
    row["output_tokens_per_s"], row["ttft_p90"], row["tpot_p50"]
    server_memory(srv.pid)["rss_bytes"]

Request i goes to `models[i % len(models)]`, and every request is sent at once, so each batch the
server runs mixes the adapters as evenly as its `--max-num-seqs` allows. On the LoRA path each
distinct adapter in a batch is one more pair of small matmuls per adapted projection (vLLM's
Punica kernels group the tokens by adapter); a merged model has none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from ..clients.loadgen import run_load_async
from ..mathutils import percentile


def assign(models: Sequence[str], num_requests: int) -> list[str]:
    """The model name of each request: round robin over `models`."""
    if not models:
        raise ValueError("models is empty: give at least one model name (the base model's for none)")
    return [models[i % len(models)] for i in range(num_requests)]


async def mixed_batch_async(
    base_url: str,
    models: Sequence[str],
    prompts: Sequence[str],
    *,
    max_tokens: int = 32,
    timeout: float = 300.0,
) -> dict:
    """Send len(prompts) streamed requests at once, request i to assign(models)[i]; summarize them.

    Same work whatever the models: temperature 0 and ignore_eos, so every request generates
    `max_tokens`. Returns output tokens/s over the batch's wall time, TTFT p50/p90 and TPOT p50 (s).
    """
    names = assign(models, len(prompts))
    groups: dict[str, list[str]] = {}
    for name, p in zip(names, prompts):
        groups.setdefault(name, []).append(p)
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *(
            run_load_async(
                base_url,
                name,
                ps,
                concurrency=len(ps),
                max_tokens=max_tokens,
                ignore_eos=True,
                temperature=0.0,
                timeout=timeout,
            )
            for name, ps in groups.items()
        )
    )
    wall = time.perf_counter() - t0
    records = [r for res in results for r in res.records]  # results come back in `groups` order
    ok = [r for r in records if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    return {
        "distinct": len(set(models)),
        "models": sorted(set(models)),
        "num_requests": len(records),
        "num_ok": len(ok),
        "errors": [r.error for r in records if r.error][:3],
        "wall_s": wall,
        "output_tokens": sum(r.output_tokens for r in ok),
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / wall if wall > 0 else float("nan"),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "tpot_p50": percentile(tpot, 50),
        # one plain dict per request, for an analysis by model
        "records": [
            {"model": name, "ok": r.ok, "ttft": r.ttft, "e2e": r.e2e, "output_tokens": r.output_tokens}
            for name, res in zip(groups, results)
            for r in res.records
        ],
    }


def mixed_batch(base_url: str, models: Sequence[str], prompts: Sequence[str], **kwargs) -> dict:
    """`mixed_batch_async` from ordinary code or a notebook (where an event loop already runs)."""
    from ..asyncrun import run_coroutine

    return run_coroutine(mixed_batch_async(base_url, models, prompts, **kwargs))


def server_memory(pid: int) -> dict[str, int]:
    """Resident memory of a server's process tree (vLLM runs an API process and an engine process).

    rss_bytes sums each process's resident set, so pages two processes share (torch's libraries)
    count twice; pss_bytes splits every shared page between the processes that map it, so its sum
    counts each page once (0 where /proc does not say).
    """
    import psutil

    root = psutil.Process(pid)
    rss = pss = 0
    for p in [root] + root.children(recursive=True):
        try:
            rss += p.memory_info().rss
            pss += getattr(p.memory_full_info(), "pss", 0)
        except psutil.Error:
            continue
    return {"rss_bytes": rss, "pss_bytes": pss}
