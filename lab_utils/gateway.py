"""A small front door for one vLLM server shared by many tenants: per-tenant token buckets and a
concurrency share, on 127.0.0.1 only.

    python -m lab_utils.gateway --upstream http://127.0.0.1:8000 --port 9000 \
        --tenants '{"noisy": {"rate_per_s": 1, "burst": 2, "max_concurrency": 2}, ...}'

Each tenant's API key comes from the environment (LAB_GATEWAY_KEYS, a JSON object tenant -> key),
never from the command line; a request's `Authorization: Bearer KEY` names its tenant, compared
with hmac.compare_digest against every key so the time taken says nothing about how much matched.

A request is admitted when its tenant's bucket holds a token (the bucket refills at `rate_per_s`
up to `burst`) and the tenant has fewer than `max_concurrency` requests in flight; otherwise it
gets 429 at once, with Retry-After. Admitted requests are passed through to vLLM, streamed back as
they come; when the client goes away the upstream request is closed too, so vLLM aborts it and
frees its KV blocks. `/metrics` counts outcomes per tenant in Prometheus' text format.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
import os
import time
from dataclasses import dataclass, field

KEYS_ENV = "LAB_GATEWAY_KEYS"
UPSTREAM_KEY_ENV = "LAB_GATEWAY_UPSTREAM_KEY"


@dataclass
class TokenBucket:
    """A bucket of `burst` tokens that refills at `rate_per_s`; each admitted request takes one."""

    rate_per_s: float
    burst: float
    # tokens now (starts full) and when they were last counted
    tokens: float = field(default=-1.0)
    last: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_per_s) and self.rate_per_s >= 0):
            raise ValueError(f"rate_per_s must be a finite number >= 0, got {self.rate_per_s!r}")
        if not (math.isfinite(self.burst) and self.burst >= 1):
            raise ValueError(f"burst must be at least 1 (one request), got {self.burst!r}")
        if self.tokens < 0:
            self.tokens = float(self.burst)

    def refill(self, now: float) -> None:
        """Add the tokens earned since the last look, never past `burst`."""
        if self.last is not None and now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate_per_s)
        self.last = now if self.last is None else max(self.last, now)

    def try_take(self, now: float, cost: float = 1.0) -> bool:
        """Take `cost` tokens at time `now` if the bucket has them; True when admitted."""
        self.refill(now)
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False

    def wait_s(self, cost: float = 1.0) -> float:
        """Seconds until `cost` tokens are there (inf when the bucket never refills)."""
        short = cost - self.tokens
        if short <= 0:
            return 0.0
        return math.inf if self.rate_per_s == 0 else short / self.rate_per_s


@dataclass(frozen=True)
class TenantPolicy:
    """One tenant's share of the server: a request rate, a burst, and concurrent requests."""

    rate_per_s: float
    burst: float = 1.0
    max_concurrency: int = 1_000_000

    def __post_init__(self) -> None:
        TokenBucket(self.rate_per_s, self.burst)  # validates both
        if int(self.max_concurrency) != self.max_concurrency or self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be a whole number >= 1, got {self.max_concurrency!r}")


def parse_policies(text: str) -> dict[str, TenantPolicy]:
    """Tenants' policies from JSON: {"tenant": {"rate_per_s": .., "burst": .., "max_concurrency": ..}}."""
    raw = json.loads(text)
    if not isinstance(raw, dict) or not raw:
        raise ValueError("tenants must be a non-empty JSON object: tenant name -> policy")
    return {str(name): TenantPolicy(**spec) for name, spec in raw.items()}


def tenant_for(auth_header: str | None, keys: dict[str, str]) -> str | None:
    """The tenant whose key the `Authorization: Bearer KEY` header carries, or None.

    Every key is compared, with hmac.compare_digest, whatever matched before.
    """
    if not auth_header or not auth_header.startswith("Bearer "):
        return None
    given = auth_header[len("Bearer ") :].strip().encode()
    found = None
    for tenant, key in keys.items():
        if hmac.compare_digest(given, key.encode()) and found is None:
            found = tenant
    return found


class Admission:
    """The gateway's decisions, apart from HTTP: one bucket and one in-flight count per tenant."""

    def __init__(self, policies: dict[str, TenantPolicy], clock=time.monotonic):
        self.policies = dict(policies)
        self.clock = clock
        self.buckets = {t: TokenBucket(p.rate_per_s, p.burst) for t, p in self.policies.items()}
        self.in_flight = {t: 0 for t in self.policies}
        self.counts: dict[tuple[str, str], int] = {}

    def _count(self, tenant: str, outcome: str) -> None:
        self.counts[(tenant, outcome)] = self.counts.get((tenant, outcome), 0) + 1

    def admit(self, tenant: str) -> tuple[bool, str, float]:
        """(admitted, outcome, retry_after_s); call `done(tenant)` after an admitted request ends."""
        if self.in_flight[tenant] >= self.policies[tenant].max_concurrency:
            self._count(tenant, "over_share")
            return False, "over_share", 1.0
        bucket = self.buckets[tenant]
        if not bucket.try_take(self.clock()):
            self._count(tenant, "rate_limited")
            return False, "rate_limited", bucket.wait_s()
        self.in_flight[tenant] += 1
        self._count(tenant, "admitted")
        return True, "admitted", 0.0

    def done(self, tenant: str) -> None:
        self.in_flight[tenant] = max(0, self.in_flight[tenant] - 1)

    def metrics_text(self) -> str:
        """Counters and gauges in Prometheus' text format."""
        lines = [
            "# HELP gateway_requests_total Requests seen by the gateway, by tenant and outcome.",
            "# TYPE gateway_requests_total counter",
        ]
        for (tenant, outcome), n in sorted(self.counts.items()):
            lines.append(f'gateway_requests_total{{tenant="{tenant}",outcome="{outcome}"}} {n}')
        lines += [
            "# HELP gateway_in_flight Requests passed to the upstream and not finished, by tenant.",
            "# TYPE gateway_in_flight gauge",
        ]
        for tenant, n in sorted(self.in_flight.items()):
            lines.append(f'gateway_in_flight{{tenant="{tenant}"}} {n}')
        return "\n".join(lines) + "\n"


def _require_loopback(host: str) -> None:
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = host == "localhost"
    if not ok:
        raise SystemExit(f"the gateway binds loopback only (127.0.0.1), not {host!r}")


def make_app(
    upstream: str, policies: dict[str, TenantPolicy], keys: dict[str, str], upstream_key: str | None
):
    """The aiohttp application: /health, /metrics, and every /v1/... route passed to `upstream`."""
    from aiohttp import ClientSession, ClientTimeout, web

    missing = sorted(set(policies) - set(keys))
    if missing:
        raise SystemExit(f"no API key for tenants {missing} in {KEYS_ENV}")
    admission = Admission(policies)
    app = web.Application()

    async def on_start(app):
        app["session"] = ClientSession(timeout=ClientTimeout(total=None, sock_connect=10))

    async def on_stop(app):
        await app["session"].close()

    async def health(_request):
        return web.Response(text="ok")

    async def metrics(_request):
        return web.Response(text=admission.metrics_text(), content_type="text/plain")

    async def proxy(request):
        tenant = tenant_for(request.headers.get("Authorization"), keys)
        if tenant is None:
            admission._count("unknown", "unauthorized")
            return web.json_response({"error": "missing or wrong API key"}, status=401)
        ok, outcome, retry = admission.admit(tenant)
        if not ok:
            headers = {"Retry-After": str(max(1, math.ceil(retry))) if math.isfinite(retry) else "3600"}
            return web.json_response({"error": outcome, "tenant": tenant}, status=429, headers=headers)
        try:
            body = await request.read()
            headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
            if upstream_key:
                headers["Authorization"] = f"Bearer {upstream_key}"
            async with app["session"].request(
                request.method, upstream + request.path_qs, data=body, headers=headers
            ) as up:
                resp = web.StreamResponse(status=up.status)
                resp.content_type = up.content_type
                await resp.prepare(request)
                # a client that disconnects cancels this task; leaving the `async with` closes the
                # upstream connection, and vLLM aborts the request
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        finally:
            admission.done(tenant)

    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_route("*", "/v1/{tail:.*}", proxy)
    app.on_startup.append(on_start)
    app.on_cleanup.append(on_stop)
    return app


def main(argv: list[str] | None = None) -> None:
    import argparse

    from aiohttp import web

    parser = argparse.ArgumentParser(prog="python -m lab_utils.gateway")
    parser.add_argument("--upstream", required=True, help="the vLLM server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--tenants", required=True, help="JSON: tenant -> {rate_per_s, burst, max_concurrency}"
    )
    args = parser.parse_args(argv)
    _require_loopback(args.host)
    keys = json.loads(os.environ.get(KEYS_ENV, "{}"))
    app = make_app(
        args.upstream.rstrip("/"), parse_policies(args.tenants), keys, os.environ.get(UPSTREAM_KEY_ENV)
    )
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
