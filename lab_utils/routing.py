"""Routing across vLLM replicas, measured with vLLM's own prefix-cache counters (lab 10).

A multi-tenant workload: every tenant has a long system prompt (longer than one KV block, so
vLLM can cache it) and asks short questions. Where a request lands decides whether its replica
already holds that tenant's system prompt:

    workload = tenant_workload(num_tenants=8, num_requests=24, seed=5)
    run = measure_policy(router, replicas, workload, concurrency=2, max_tokens=8)
    run.hit_rate, run.replica_hit_rates, run.load.summary.ttft_p95

`measure_policy` reads `vllm:prefix_cache_hits_total` and `vllm:prefix_cache_queries_total`
(tokens) on every replica before and after the run; the difference is what this run did. The
result keeps its raw samples (counters before and after, every request's record), from which the
lab's analysis functions derive every figure.

Requests carry their tenant in the `X-Tenant-ID` header, which the router's `consistent_hash`
policy uses as its key (after X-Session-ID and X-User-ID); `cache_aware` ignores it and matches
the prompt against what it sent to each worker. vllm-router 0.1.17's `cache_aware` matches *token
ids*: a chat or text request reaches it without them and is routed without any prefix match (the
router's metric `vllm_router_prefix_routing_decisions_total{outcome="missing_tokens"}` counts
them; seen 2026-12-01). So with a tokenizer `measure_policy` sends each request to
`/v1/completions` as the token ids of the chat-templated prompt, which vLLM accepts as a prompt
and the router can match.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field

from .clients.loadgen import LoadResult, RequestRecord, summarize
from .clients.metrics import metric_value, parse_prometheus

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"

_WORDS = (
    "account balance billing cluster contract delivery device engine fleet garden harbor invoice "
    "journey kernel ledger market network office policy quarter region schedule service ticket "
    "update vendor warehouse window yield zone customer refund shipment support warranty order "
    "product storage routing latency replica tenant budget report"
).split()


@dataclass(frozen=True)
class TenantRequest:
    """One request of the workload: whose it is, and the chat messages it sends."""

    tenant: str
    messages: list


def _system_prompt(tenant: int, words: int, rng: random.Random) -> str:
    body = " ".join(rng.choice(_WORDS) for _ in range(words))
    return (
        f"You are the assistant of tenant {tenant}. Follow this tenant's handbook exactly. "
        f"Handbook {tenant}: {body}."
    )


def tenant_workload(
    num_tenants: int = 8, num_requests: int = 24, *, system_words: int = 260, seed: int = 0
) -> list[TenantRequest]:
    """`num_requests` chat requests from `num_tenants` tenants, in a shuffled order.

    Each tenant's system prompt is about 1.3 x system_words tokens (260 words: about two 128-token
    CPU blocks); the user turn is a short question different in every request. Requests are split
    as evenly as possible between tenants.
    """
    if num_tenants < 1 or num_requests < 1:
        raise ValueError("num_tenants and num_requests must be at least 1")
    rng = random.Random(seed)
    systems = [_system_prompt(t, system_words, rng) for t in range(num_tenants)]
    owners = [i % num_tenants for i in range(num_requests)]
    rng.shuffle(owners)
    out = []
    for i, t in enumerate(owners):
        q = f"Question {i}: in one word, which {rng.choice(_WORDS)} matters most for {rng.choice(_WORDS)}?"
        out.append(
            TenantRequest(
                f"tenant-{t}", [{"role": "system", "content": systems[t]}, {"role": "user", "content": q}]
            )
        )
    return out


def prefix_cache_counters(url: str) -> tuple[float, float]:
    """(hit tokens, queried tokens) so far on one vLLM server, from its /metrics page."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as resp:
        samples = parse_prometheus(resp.read().decode("utf-8", "replace"))
    hits, queries = metric_value(samples, HITS), metric_value(samples, QUERIES)
    return (0.0 if math.isnan(hits) else hits), (0.0 if math.isnan(queries) else queries)


@dataclass
class RoutingRun:
    """One policy's run through the router: the load records and each replica's counter deltas."""

    policy: str
    tenants: list[str]  # request i's tenant
    load: LoadResult
    # per replica: counters before and after the run, [hits, queries] each
    before: list[list[float]]
    after: list[list[float]]
    settings: dict = field(default_factory=dict)

    def raw_samples(self) -> dict:
        return {
            "policy": self.policy,
            "tenants": list(self.tenants),
            "load": self.load.raw_samples(),
            "before": [list(map(float, b)) for b in self.before],
            "after": [list(map(float, a)) for a in self.after],
            "settings": dict(self.settings),
        }

    @classmethod
    def from_raw(cls, raw: dict) -> RoutingRun:
        return cls(
            raw["policy"],
            list(raw["tenants"]),
            LoadResult.from_raw(raw["load"]),
            [list(b) for b in raw["before"]],
            [list(a) for a in raw["after"]],
            dict(raw["settings"]),
        )

    @property
    def replica_hits(self) -> list[float]:
        return [a[0] - b[0] for a, b in zip(self.after, self.before)]

    @property
    def replica_queries(self) -> list[float]:
        return [a[1] - b[1] for a, b in zip(self.after, self.before)]

    @property
    def replica_hit_rates(self) -> list[float]:
        """Prefix-cache hit rate (hit tokens / queried tokens) of each replica in this run."""
        return [h / q if q > 0 else math.nan for h, q in zip(self.replica_hits, self.replica_queries)]

    @property
    def replica_share(self) -> list[float]:
        """Fraction of the run's prompt tokens each replica received (how the router spread load)."""
        total = sum(self.replica_queries)
        return [q / total if total > 0 else math.nan for q in self.replica_queries]

    @property
    def hit_rate(self) -> float:
        """Hit tokens / queried tokens over all replicas."""
        q = sum(self.replica_queries)
        return sum(self.replica_hits) / q if q > 0 else math.nan

    def row(self) -> dict:
        s = self.load.summary
        return {
            "policy": self.policy,
            "hit_rate": self.hit_rate,
            "replica_hit_rates": self.replica_hit_rates,
            "replica_share": self.replica_share,
            "ttft_p50_s": s.ttft_p50,
            "ttft_p95_s": s.ttft_p95,
            "output_tokens_per_s": s.output_tokens_per_s,
            "errors": s.num_errors,
        }


def prompt_token_ids(req: TenantRequest, tokenizer) -> list[int]:
    """The token ids of a request's chat-templated prompt (what vLLM would compute from the chat)."""
    ids = tokenizer.apply_chat_template(req.messages, tokenize=True, add_generation_prompt=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


async def _drive(
    base_url: str,
    model: str,
    workload: Sequence[TenantRequest],
    concurrency: int,
    max_tokens: int,
    timeout: float,
    tokenizer=None,
) -> LoadResult:
    import httpx

    from .clients.loadgen import _one_request  # the load generator's own streaming request

    endpoint = "chat" if tokenizer is None else "completions"
    url = base_url.rstrip("/") + ("/chat/completions" if tokenizer is None else "/completions")
    prompts = None if tokenizer is None else [prompt_token_ids(w, tokenizer) for w in workload]
    records: list[RequestRecord] = []
    started_at = time.time()
    t0 = time.perf_counter()
    ids = iter(range(len(workload)))
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:

        async def worker() -> None:
            for i in ids:
                req = workload[i]
                rec = RequestRecord(request_id=i, start=time.perf_counter() - t0)
                records.append(rec)
                body = {
                    "model": model,
                    "max_tokens": max_tokens,
                    "temperature": 0.0,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                if prompts is None:
                    body["messages"] = req.messages
                else:
                    body["prompt"] = prompts[i]
                headers = {"Authorization": "Bearer EMPTY", "X-Tenant-ID": req.tenant}
                await _one_request(client, url, headers, body, endpoint, rec, t0, timeout)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(workload)))))
    duration = time.perf_counter() - t0
    records.sort(key=lambda r: r.request_id)
    settings = {
        "num_requests": len(workload),
        "concurrency": concurrency,
        "rate": None,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "endpoint": endpoint,
        "ignore_eos": False,
        "seed": 0,
        "duration_s": duration,
    }
    return LoadResult(records, summarize(records, duration), started_at, settings)


def _run(coro):
    from lab_utils.asyncrun import run_coroutine

    return run_coroutine(coro)


def measure_policy(
    router,
    replicas,
    workload: Sequence[TenantRequest],
    *,
    model: str | None = None,
    concurrency: int = 2,
    max_tokens: int = 8,
    timeout: float = 300.0,
    tokenizer=None,
) -> RoutingRun:
    """Send `workload` through `router` and read every replica's prefix-cache counters.

    `router` has `.base_url` and `.policy`; `replicas` are the vLLM servers behind it (their `.url`
    and `.model_name`). With `tokenizer`, requests go to /v1/completions as token ids (see the
    module docstring: the router's cache_aware policy needs them); without, as streaming chat.
    Returns a RoutingRun.
    """
    model = model or replicas[0].model_name
    before = [list(prefix_cache_counters(r.url)) for r in replicas]
    load = _run(
        _drive(router.base_url, model, workload, int(concurrency), int(max_tokens), timeout, tokenizer)
    )
    after = [list(prefix_cache_counters(r.url)) for r in replicas]
    run = RoutingRun(
        router.policy,
        [w.tenant for w in workload],
        load,
        before,
        after,
        {
            "concurrency": int(concurrency),
            "max_tokens": int(max_tokens),
            "num_replicas": len(replicas),
            "num_tenants": len({w.tenant for w in workload}),
            "token_ids": tokenizer is not None,
        },
    )
    return run


def cacheable_prefix_tokens(workload: Sequence[TenantRequest], tokenizer, block_size: int = 128) -> int:
    """Tokens a prefix-cache hit can skip: the shared start of two requests of one tenant, in whole blocks.

    vLLM caches full blocks only, so a tenant's prompt beyond its last complete shared block is
    computed again even on a hit.
    """
    by_tenant: dict[str, list] = {}
    for w in workload:
        by_tenant.setdefault(w.tenant, []).append(w)
    pair = next((v[:2] for v in by_tenant.values() if len(v) >= 2), None)
    if pair is None:
        return 0
    a, b = (
        tokenizer.apply_chat_template(w.messages, tokenize=True, add_generation_prompt=True) for w in pair
    )
    a = list(a["input_ids"] if isinstance(a, dict) or hasattr(a, "keys") else a)
    b = list(b["input_ids"] if isinstance(b, dict) or hasattr(b, "keys") else b)
    same = 0
    for x, y in zip(a, b):
        if x != y:
            break
        same += 1
    return (same // block_size) * block_size


__all__ = [
    "HITS",
    "QUERIES",
    "RoutingRun",
    "TenantRequest",
    "cacheable_prefix_tokens",
    "measure_policy",
    "prefix_cache_counters",
    "prompt_token_ids",
    "tenant_workload",
]
