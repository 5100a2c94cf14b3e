"""An async load generator for OpenAI-compatible servers (vLLM, the TGI gateway, ...).

Two ways to offer load, the two that serving benchmarks use:

- **closed loop** (`concurrency=N`): N clients each send a request, wait for the whole answer,
  and send the next one. The server never sees more than N requests; throughput is what it
  can do at that concurrency.
- **open loop** (`rate=R` requests/s): requests arrive as a Poisson process whatever the server
  is doing, like independent users. Past the server's capacity the queue (and TTFT) grows
  without bound: this is how you find the knee.

Every request streams, so the client sees each token arrive:

    start ──── first token ── token ── token ─ ... ── finish
          TTFT              ITL      ITL               (E2E = finish - start)
    TPOT = (E2E - TTFT) / (output tokens - 1)     # mean time per output token after the first

In open loop, `start` is the request's INTENDED send time on the arrival schedule, not the moment
it got through the client's concurrency cap: a request that waits in the client for a free slot
has that wait in its TTFT and E2E, as a user would. Timing from the actual send instead leaves the
queueing out (coordinated omission: the slow moments get fewer samples and look fast). Each record
keeps `sent` too, and the summary reports how far sends lagged their schedule (`send_lag_*`).

    result = run_load(srv.base_url, srv.model_name, prompts, concurrency=8, max_tokens=64)
    result.summary.ttft_p95, result.summary.output_tokens_per_s, result.records[0].first_token
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from lab_utils.mathutils import percentile


@dataclass
class RequestRecord:
    """One request as the client saw it; times are seconds since the run started."""

    request_id: int
    # open loop: the intended send time on the arrival schedule; closed loop: when it was sent
    start: float
    first_token: float | None = None
    finish: float | None = None
    # arrival time of every streamed chunk that carried text
    chunk_times: list[float] = field(default_factory=list)
    # from the server's usage report when it sends one, else the number of text chunks
    output_tokens: int = 0
    prompt_tokens: int | None = None
    text: str = ""
    error: str | None = None
    # when the request really left the client (after any wait for the concurrency cap)
    sent: float | None = None

    @property
    def send_lag(self) -> float | None:
        """How late it was sent against its schedule (s): client-side queueing and loop delay."""
        return None if self.sent is None else self.sent - self.start

    @property
    def ok(self) -> bool:
        """True when the request finished without an error."""
        return self.error is None and self.finish is not None

    @property
    def ttft(self) -> float | None:
        """Time to first token (s)."""
        return None if self.first_token is None else self.first_token - self.start

    @property
    def e2e(self) -> float | None:
        """End-to-end latency (s)."""
        return None if self.finish is None else self.finish - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (s); None for a one-token answer."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: gaps between consecutive streamed chunks (s)."""
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    def to_dict(self) -> dict:
        """A plain dict (picklable, JSON-able) without the chunk times and text."""
        d = asdict(self)
        d.pop("chunk_times")
        d.pop("text")
        d.update(ttft=self.ttft, e2e=self.e2e, tpot=self.tpot, send_lag=self.send_lag)
        return d


@dataclass
class LoadSummary:
    """Aggregates of one run: counts, throughput and latency percentiles (seconds)."""

    num_requests: int
    num_ok: int
    num_errors: int
    duration_s: float
    requests_per_s: float
    output_tokens: int
    output_tokens_per_s: float
    ttft_mean: float
    ttft_p50: float
    ttft_p95: float
    ttft_p99: float
    tpot_mean: float
    tpot_p50: float
    tpot_p95: float
    itl_p50: float
    itl_p95: float
    e2e_mean: float
    e2e_p50: float
    e2e_p95: float
    errors: list[str] = field(default_factory=list)
    # sent - start per request: how far sends lagged the schedule (0 in closed loop)
    send_lag_p50: float = math.nan
    send_lag_p95: float = math.nan
    send_lag_max: float = math.nan

    def to_dict(self) -> dict:
        """A plain dict of every field."""
        return asdict(self)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def summarize(records: Sequence[RequestRecord], duration_s: float | None = None) -> LoadSummary:
    """Summarize request records; duration defaults to first start → last finish."""
    ok = [r for r in records if r.ok]
    if duration_s is None:
        ends = [r.finish for r in records if r.finish is not None]
        duration_s = (max(ends) - min(r.start for r in records)) if ends else 0.0
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    itl = [g for r in ok for g in r.itl]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    out_tokens = sum(r.output_tokens for r in ok)
    lags = [r.send_lag for r in records if r.send_lag is not None]
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: math.nan)
    return LoadSummary(
        num_requests=len(records),
        num_ok=len(ok),
        num_errors=len(records) - len(ok),
        duration_s=duration_s,
        requests_per_s=per_s(len(ok)),
        output_tokens=out_tokens,
        output_tokens_per_s=per_s(out_tokens),
        ttft_mean=_mean(ttft),
        ttft_p50=percentile(ttft, 50),
        ttft_p95=percentile(ttft, 95),
        ttft_p99=percentile(ttft, 99),
        tpot_mean=_mean(tpot),
        tpot_p50=percentile(tpot, 50),
        tpot_p95=percentile(tpot, 95),
        itl_p50=percentile(itl, 50),
        itl_p95=percentile(itl, 95),
        e2e_mean=_mean(e2e),
        e2e_p50=percentile(e2e, 50),
        e2e_p95=percentile(e2e, 95),
        errors=[f"request {r.request_id}: {r.error}" for r in records if r.error],
        send_lag_p50=percentile(lags, 50),
        send_lag_p95=percentile(lags, 95),
        send_lag_max=max(lags) if lags else math.nan,
    )


@dataclass
class LoadResult:
    """Everything one run produced: per-request records, the summary, and how it was run."""

    records: list[RequestRecord]
    summary: LoadSummary
    started_at: float  # time.time() when the run started, to line up with a MetricsSampler
    settings: dict

    def raw_samples(self) -> dict:
        """Every request's raw timings (what a grader re-derives the summary from)."""
        return {
            "settings": self.settings,
            "started_at": self.started_at,
            "records": [
                {
                    "request_id": r.request_id,
                    "start": r.start,
                    "first_token": r.first_token,
                    "finish": r.finish,
                    "chunk_times": list(r.chunk_times),
                    "output_tokens": r.output_tokens,
                    "prompt_tokens": r.prompt_tokens,
                    "error": r.error,
                    "sent": r.sent,
                }
                for r in self.records
            ],
        }

    @classmethod
    def from_raw(cls, raw: dict) -> LoadResult:
        """Rebuild records and the summary from `raw_samples()` (how a check re-derives figures)."""
        recs = [
            RequestRecord(
                request_id=d["request_id"],
                start=d["start"],
                first_token=d["first_token"],
                finish=d["finish"],
                chunk_times=list(d["chunk_times"]),
                output_tokens=d["output_tokens"],
                prompt_tokens=d["prompt_tokens"],
                error=d["error"],
                sent=d.get("sent"),
            )
            for d in raw["records"]
        ]
        return cls(
            recs, summarize(recs, raw["settings"].get("duration_s")), raw["started_at"], dict(raw["settings"])
        )

    def timeline(self) -> list[dict]:
        """Per-request rows (request_id, start, first_token, finish, output_tokens, error) for plots."""
        return [
            {
                "request_id": r.request_id,
                "start": r.start,
                "first_token": r.first_token,
                "finish": r.finish,
                "output_tokens": r.output_tokens,
                "error": r.error,
            }
            for r in self.records
        ]


def _payload(
    endpoint: str,
    model: str,
    prompt: str | list[dict],
    max_tokens: int,
    temperature: float,
    ignore_eos: bool,
    extra_body: dict | None,
) -> dict:
    body: dict = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        body["messages"] = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True  # a vLLM extension: always generate max_tokens
    if extra_body:
        body.update(extra_body)
    return body


def _chunk_text(endpoint: str, event: dict) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    if endpoint == "chat":
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


async def _one_request(
    client, url: str, headers: dict, body: dict, endpoint: str, rec: RequestRecord, t0: float, timeout: float
) -> None:
    """Send one streaming request and fill `rec`; `timeout` is ONE deadline for all of it."""
    if rec.sent is None:
        rec.sent = time.perf_counter() - t0
    try:
        async with asyncio.timeout(timeout):  # connect + every chunk + the end, together
            await _stream(client, url, headers, body, endpoint, rec, t0, timeout)
    except TimeoutError:
        rec.finish = None
        rec.error = f"Timeout: no complete answer within {timeout:g} s of sending"
    except Exception as exc:  # a load test reports failures, it does not stop at the first one
        rec.error = f"{type(exc).__name__}: {exc}"[:300]


async def _stream(
    client, url: str, headers: dict, body: dict, endpoint: str, rec: RequestRecord, t0: float, timeout: float
) -> None:
    chunks = 0
    async with client.stream("POST", url, json=body, headers=headers, timeout=timeout) as resp:
        if resp.status_code != 200:
            detail = (await resp.aread()).decode("utf-8", "replace")[:300]
            rec.error = f"HTTP {resp.status_code}: {detail}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                rec.error = str(event["error"])[:300]
                return
            text = _chunk_text(endpoint, event)
            if text:
                now = time.perf_counter() - t0
                if rec.first_token is None:
                    rec.first_token = now
                rec.chunk_times.append(now)
                rec.text += text
                chunks += 1
            usage = event.get("usage")
            if usage:
                rec.output_tokens = int(usage.get("completion_tokens") or 0)
                rec.prompt_tokens = usage.get("prompt_tokens")
    if rec.output_tokens == 0:
        rec.output_tokens = chunks
    rec.finish = time.perf_counter() - t0


async def run_load_async(
    base_url: str,
    model: str,
    prompts: Sequence[str | list[dict]],
    *,
    num_requests: int | None = None,
    concurrency: int | None = None,
    rate: float | None = None,
    max_tokens: int = 64,
    temperature: float = 0.0,
    endpoint: str = "completions",
    api_key: str = "EMPTY",
    ignore_eos: bool = False,
    extra_body: dict | None = None,
    seed: int = 0,
    timeout: float = 300.0,
    output_lens: Sequence[int] | None = None,
    progress: str | None = None,
) -> LoadResult:
    """Send `num_requests` streaming requests (prompts reused in turn) and record each one.

    Args:
        base_url: the server's OpenAI base URL, ending in /v1.
        concurrency: closed loop: this many requests in flight at all times.
        rate: open loop: Poisson arrivals at this many requests/s (concurrency, if also given,
            caps the requests in flight). Latencies count from each request's scheduled arrival,
            so time spent waiting for the cap is in them; `summary.send_lag_*` says how long.
        timeout: one deadline (s) per request, from its send to its last byte.
        endpoint: "completions" (prompt text) or "chat" (messages; a string becomes one user turn).
        ignore_eos: ask vLLM to always generate max_tokens (same work for every request).
        output_lens: per-request max_tokens, reused in turn like the prompts (a length mix such as
            ShareGPT's, with ignore_eos); `max_tokens` is then only the settings' label.
        progress: print `progress: i/n done, ... s left` as requests finish (lab_utils.notebook.progress:
            after the first, then every 10 s, and after the last); None: silent.
    """
    import httpx

    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    if endpoint not in ("completions", "chat"):
        raise ValueError(f"endpoint must be 'completions' or 'chat', got {endpoint!r}")
    if concurrency is None and rate is None:
        raise ValueError("give concurrency=N (closed loop) or rate=R requests/s (open loop)")
    if concurrency is not None and int(concurrency) < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be a positive number of requests per second, got {rate}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if output_lens is not None:
        output_lens = [int(x) for x in output_lens]
        if not output_lens or min(output_lens) < 1:
            raise ValueError("output_lens: at least one length, each at least 1 token")
    n = len(prompts) if num_requests is None else int(num_requests)
    url = base_url.rstrip("/") + ("/chat/completions" if endpoint == "chat" else "/completions")
    headers = {"Authorization": f"Bearer {api_key}"}
    in_flight = int(concurrency) if concurrency is not None else n
    limits = httpx.Limits(
        max_connections=max(in_flight, 1) + 4, max_keepalive_connections=max(in_flight, 1) + 4
    )
    records: list[RequestRecord] = []
    from lab_utils.notebook import progress as said

    ticks = said(range(n), progress)
    next(ticks, None)  # the clock starts now; each finished request moves it on by one
    started_at = time.time()
    t0 = time.perf_counter()

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:

        def record(i: int, start: float) -> tuple[RequestRecord, dict]:
            rec = RequestRecord(request_id=i, start=start)
            records.append(rec)
            limit = max_tokens if output_lens is None else output_lens[i % len(output_lens)]
            body = _payload(
                endpoint, model, prompts[i % len(prompts)], limit, temperature, ignore_eos, extra_body
            )
            return rec, body

        async def send(rec: RequestRecord, body: dict) -> None:
            await _one_request(client, url, headers, body, endpoint, rec, t0, timeout)
            next(ticks, None)

        tasks: list[asyncio.Task] = []
        try:
            if rate is None:  # closed loop: `in_flight` workers pull the next request id
                next_id = iter(range(n))

                async def worker() -> None:
                    for i in next_id:
                        await send(*record(i, time.perf_counter() - t0))

                tasks = [asyncio.ensure_future(worker()) for _ in range(min(in_flight, n))]
                await asyncio.gather(*tasks)
            else:  # open loop: Poisson arrivals on a schedule fixed in advance, capped in flight
                rng = random.Random(seed)
                gate = asyncio.Semaphore(in_flight)
                schedule, at = [], 0.0
                for _ in range(n):
                    schedule.append(at)
                    at += rng.expovariate(rate)

                async def gated(rec: RequestRecord, body: dict) -> None:
                    async with gate:  # the wait here is in the latency: `start` is the schedule
                        await send(rec, body)

                for i, due in enumerate(schedule):
                    delay = due - (time.perf_counter() - t0)
                    if delay > 0:  # absolute times: a late wake-up does not push later arrivals back
                        await asyncio.sleep(delay)
                    tasks.append(asyncio.ensure_future(gated(*record(i, due))))
                await asyncio.gather(*tasks)
        finally:  # interrupted (cancelled): stop every request before the client closes
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
    duration = time.perf_counter() - t0
    records.sort(key=lambda r: r.request_id)
    settings = {
        "num_requests": n,
        "concurrency": concurrency,
        "rate": rate,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "endpoint": endpoint,
        "ignore_eos": ignore_eos,
        "seed": seed,
        "duration_s": duration,
        **({"output_lens": list(output_lens)} if output_lens is not None else {}),
    }

    return LoadResult(records, summarize(records, duration), started_at, settings)


def run_load(base_url: str, model: str, prompts: Sequence[str | list[dict]], **kwargs) -> LoadResult:
    """`run_load_async` from ordinary code or a notebook (where an event loop already runs)."""
    from lab_utils.asyncrun import run_coroutine

    return run_coroutine(run_load_async(base_url, model, prompts, **kwargs))
