"""The HTTP side of the stand-in: TGI's routes and shapes over the engine worker (Starlette + uvicorn).

Routes (TGI v3.3.7's router/src/server.rs): POST /generate, POST /generate_stream (SSE), POST /
(what `text_generation.Client` calls: a JSON list, or SSE when "stream": true), GET /info,
GET /health, GET /metrics, POST /v1/chat/completions (Messages API). One extra route that real
TGI does not have, GET /stand-in/batches, returns the admission loop's per-step log for plots.
Every response carries the header `x-served-by: llm-serving-lab TGI-protocol stand-in`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import random
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .admission import TGIConfig
from .grammar import GrammarCompiler, GrammarError, GrammarLogitsProcessor
from .metrics import Metrics
from .protocol import (
    PAYLOAD_LIMIT,
    STAND_IN,
    GenerateParams,
    TGIError,
    parse_body,
    payload_too_large,
    validate,
    validation,
)
from .worker import EngineWorker, Job, LogprobRecorder

# Seconds a request may take from arrival to its last token (queueing included); the stand-in's
# own limit (`--request-timeout`): real TGI has none, a request runs until it ends or its client goes.
REQUEST_TIMEOUT = 600.0
# A body over the payload limit is read and dropped up to this size, so the client gets its 413
# instead of a reset connection; beyond it the connection is closed.
_DRAIN_LIMIT = 64 << 20


class _Guard:
    """Runs one request's logits processor; an exception marks THAT request failed (the worker
    aborts it after the step) instead of failing the engine step for every request in the batch."""

    def __init__(self, fn, fault: list) -> None:
        self.fn, self.fault = fn, fault

    def __call__(self, output_token_ids, logits):
        if self.fault:
            return logits
        try:
            return self.fn(output_token_ids, logits)
        except Exception as e:  # noqa: BLE001 - reported to this request only
            self.fault.append(f"{type(e).__name__}: {e}")
            return logits


HEADERS = {"x-served-by": STAND_IN}


class Service:
    """Everything a request handler needs: the worker, the tokenizer, the limits."""

    def __init__(
        self,
        worker: EngineWorker,
        config: TGIConfig,
        model_id: str,
        api_key: str | None = None,
        *,
        payload_limit: int = PAYLOAD_LIMIT,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        if not payload_limit >= 1:
            raise ValueError(f"payload_limit must be a positive number of bytes, got {payload_limit!r}")
        if not request_timeout > 0:
            raise ValueError(f"request_timeout must be positive seconds, got {request_timeout!r}")
        self.worker = worker
        self.config = config
        self.model_id = model_id
        self.api_key = api_key
        self.payload_limit = int(payload_limit)
        self.request_timeout = float(request_timeout)
        # parsing, tokenizing, chat templates and grammar compiles: never on the event loop
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tgi-validate")
        self.engine = worker.engine
        self.tok = self.engine.tokenizer
        self.metrics: Metrics = worker.metrics
        self.vocab_size = self.engine.model_config.vocab_size
        self.grammars = GrammarCompiler(self.tok, self.vocab_size)
        self.special_ids = set(getattr(self.tok, "all_special_ids", []) or [])
        self.in_flight = 0

    # ------------------------------------------------------------------ off the event loop
    async def off_loop(self, fn, *args):
        """`fn(*args)` on the validation threads, so the event loop keeps answering (/health)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _compile(self, p: GenerateParams) -> GenerateParams:
        if p.grammar is not None and "compiled_grammar" not in p.extra:
            try:
                p.extra["compiled_grammar"] = self.grammars.compile(p.grammar)
            except GrammarError as e:
                raise validation(str(e)) from None
        return p

    def prepare(self, body: Any, stream: bool) -> GenerateParams:
        """Validate, tokenize and compile the grammar of a `/generate` body (runs off the loop)."""
        try:
            return self._compile(validate(body, self.config, self.tok.encode, stream=stream))
        except TGIError:
            self.metrics.inc("tgi_request_failure", err="validation")
            raise

    def prepare_chat(self, body: Any) -> tuple[GenerateParams, bool]:
        """The same for a Messages API body: template, tokenize, compile (runs off the loop)."""
        from .chat import to_params

        try:
            p, stream = to_params(self, body)
            return self._compile(p), stream
        except TGIError:
            self.metrics.inc("tgi_request_failure", err="validation")
            raise

    # ------------------------------------------------------------------ one generation
    def _sampling_params(
        self, p: GenerateParams, seed: int | None, recorder: LogprobRecorder, fault: list | None = None
    ):
        from lab_utils.engine import SamplingParams

        fault = [] if fault is None else fault
        procs = []
        if p.grammar is not None:
            compiled = self._compile(p).extra["compiled_grammar"]
            procs.append(_Guard(GrammarLogitsProcessor(compiled, self.vocab_size), fault))
        procs.append(_Guard(recorder, fault))  # after the grammar: it reports the masked distribution
        return SamplingParams(
            temperature=p.temperature,
            top_k=p.top_k,
            top_p=p.top_p,
            seed=seed,
            max_tokens=p.max_new_tokens,
            stop=p.stop or None,
            logits_processors=procs,
        )

    def start_job(self, p: GenerateParams, seed: int | None) -> Job:
        recorder = LogprobRecorder(p.top_n_tokens)
        fault: list[str] = []
        sp = self._sampling_params(p, seed, recorder, fault)
        job = Job(p.input_ids, sp, asyncio.get_running_loop(), asyncio.Queue(), recorder, fault=fault)
        job.deadline = job.arrival + self.request_timeout
        self.worker.submit(job)
        self.metrics.observe("tgi_request_input_length", len(p.input_ids))
        self.metrics.observe("tgi_request_max_new_tokens", p.max_new_tokens)
        return job

    def token(self, tid: int, logprob: float | None) -> dict:
        special = tid in self.special_ids
        text = self.tok.convert_ids_to_tokens(tid) if special else self.tok.decode([tid])
        return {"id": int(tid), "text": text, "logprob": logprob, "special": special}

    def top_tokens(self, job: Job, k: int) -> list[dict]:
        if k >= len(job.recorder.top):
            return []
        return [self.token(i, lp) for i, lp in job.recorder.top[k]]

    @staticmethod
    def finish_reason(reason: str | None, stop_reason: Any) -> str:
        if reason == "length":
            return "length"
        return "stop_sequence" if isinstance(stop_reason, str) else "eos_token"

    def record_done(self, job: Job, n_tokens: int) -> None:
        m = self.metrics
        m.inc("tgi_request_success")
        end = job.finished or time.monotonic()
        m.observe("tgi_request_duration", end - job.arrival)
        if job.first_scheduled is not None:
            m.observe("tgi_request_queue_duration", job.first_scheduled - job.arrival)
            m.observe("tgi_request_inference_duration", end - job.first_scheduled)
            if n_tokens:
                m.observe("tgi_request_mean_time_per_token_duration", (end - job.first_scheduled) / n_tokens)
        m.observe("tgi_request_generated_tokens", n_tokens)

    async def collect(self, job: Job) -> dict:
        """Wait for a job to finish; its tokens, finish reason and text."""
        ids: list[int] = []
        while True:
            kind, value = await job.events.get()
            if kind == "token":
                ids.append(value)
            elif kind == "done":
                reason, stop_reason, text = value
                self.record_done(job, len(ids))
                return {"ids": ids, "reason": self.finish_reason(reason, stop_reason), "text": text}
            elif kind == "error":
                self.metrics.inc("tgi_request_failure", err="generation")
                raise TGIError(424, "generation", value)
            elif kind == "timeout":
                self.metrics.inc("tgi_request_failure", err="timeout")
                raise TGIError(408, "timeout", value)
            else:
                raise TGIError(424, "generation", "request cancelled")

    def details(self, p: GenerateParams, job: Job, res: dict, seed: int | None) -> dict:
        lps = job.recorder.logprobs
        tokens = [self.token(t, lps[k] if k < len(lps) else None) for k, t in enumerate(res["ids"])]
        d = {
            "finish_reason": res["reason"],
            "generated_tokens": len(res["ids"]),
            "seed": seed,
            # prompt logprobs are not computed by the course engine: ids and texts only
            "prefill": ([self.token(t, None) for t in p.input_ids] if p.decoder_input_details else []),
            "tokens": tokens,
        }
        if p.top_n_tokens:
            d["top_tokens"] = [self.top_tokens(job, k) for k in range(len(res["ids"]))]
        return d

    def seed_for(self, p: GenerateParams) -> int | None:
        if p.temperature == 0:
            return None
        return p.seed if p.seed is not None else random.getrandbits(63)

    async def generate(self, p: GenerateParams) -> dict:
        """A TGI GenerateResponse ({"generated_text", "details"?})."""
        runs = []
        try:
            for _ in range(p.best_of):
                seed = self.seed_for(p)
                runs.append((seed, self.start_job(p, seed)))
            results = [await self.collect(job) for _, job in runs]
        finally:  # an error, a timeout or a cancelled handler: the worker aborts what still runs
            for _, job in runs:
                if job.finished is None:
                    job.cancelled = True
        # best_of: n samples, keep the one with the highest total log-probability (TGI's rule).
        scores = [sum(job.recorder.logprobs) for _, job in runs]
        best = max(range(len(runs)), key=scores.__getitem__)
        seed, job = runs[best]
        res = results[best]
        text = (self.tok.decode(p.input_ids) if p.return_full_text else "") + res["text"]
        out: dict = {"generated_text": text}
        if p.details:
            out["details"] = self.details(p, job, res, seed)
            if p.best_of > 1:
                out["details"]["best_of_sequences"] = [
                    {"generated_text": r["text"], **self.details(p, j, r, s)}
                    for i, ((s, j), r) in enumerate(zip(runs, results))
                    if i != best
                ]
        return out

    async def generate_watched(self, p: GenerateParams, request: Any = None) -> dict | None:
        """`generate`, cancelled (and its KV blocks freed) if the client disconnects: None then."""
        if request is None:
            return await self.generate(p)
        gen = asyncio.ensure_future(self.generate(p))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({gen, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not gen.done():
                gen.cancel()
        if not gen.done() or gen.cancelled():
            try:
                await gen
            except asyncio.CancelledError:
                pass
            self.metrics.inc("tgi_request_failure", err="cancelled")
            return None
        return gen.result()

    async def stream(self, p: GenerateParams):
        """TGI's StreamResponse events, one per token; the last has generated_text and details."""
        seed = self.seed_for(p)
        job = self.start_job(p, seed)
        try:
            async for ev in self._events(p, job, seed):
                yield ev
        finally:
            if job.finished is None:
                job.cancelled = True  # the client went away: the worker aborts the request

    async def _events(self, p: GenerateParams, job: Job, seed: int | None):
        k = 0
        pending = None
        while True:
            kind, value = await job.events.get()
            if kind == "token":
                if pending is not None:
                    yield pending
                lp = job.recorder.logprobs[k] if k < len(job.recorder.logprobs) else None
                pending = {
                    "index": k + 1,
                    "token": self.token(value, lp),
                    "top_tokens": self.top_tokens(job, k) if p.top_n_tokens else None,
                    "generated_text": None,
                    "details": None,
                }
                k += 1
            elif kind == "done":
                reason, stop_reason, text = value
                self.record_done(job, k)
                if pending is None:
                    return
                pending["generated_text"] = (
                    self.tok.decode(p.input_ids) if p.return_full_text else ""
                ) + text
                pending["details"] = {
                    "finish_reason": self.finish_reason(reason, stop_reason),
                    "generated_tokens": k,
                    "seed": seed,
                    "input_length": len(p.input_ids),
                }
                yield pending
                return
            else:
                err = "timeout" if kind == "timeout" else "generation"
                self.metrics.inc("tgi_request_failure", err=err)
                yield {"error": str(value or "request cancelled"), "error_type": err}
                return

    def info(self) -> dict:
        c = self.config
        return {
            "model_id": self.model_id,
            "model_sha": None,
            "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": c.max_concurrent_requests,
            "max_best_of": c.max_best_of,
            "max_stop_sequences": c.max_stop_sequences,
            "max_input_tokens": c.max_input_tokens,
            "max_total_tokens": c.max_total_tokens,
            "validation_workers": 1,
            "max_client_batch_size": 4,
            "router": STAND_IN,
            "version": "3.3.7-compatible",
            "sha": None,
            "docker_label": None,
            "stand_in": {
                "engine": "lab_utils.engine (course engine)",
                "admission": {
                    "max_batch_prefill_tokens": c.max_batch_prefill_tokens,
                    "max_batch_total_tokens": c.max_batch_total_tokens,
                    "waiting_served_ratio": c.waiting_served_ratio,
                    "max_waiting_tokens": c.max_waiting_tokens,
                    "max_batch_size": c.max_batch_size,
                },
                "not_implemented": [
                    "repetition_penalty",
                    "frequency_penalty",
                    "typical_p",
                    "watermark",
                    "adapter_id",
                    "prompt logprobs (prefill tokens have logprob null)",
                    "tools",
                ],
            },
        }


# ---------------------------------------------------------------------- the ASGI application
def build_app(service: Service):
    """The Starlette application serving TGI's routes."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    cfg = service.config

    def error(e: TGIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=HEADERS)

    def sse(events) -> StreamingResponse:
        async def gen():
            async for ev in events:
                yield f"data:{json.dumps(ev)}\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream", headers=HEADERS)

    async def read_json(request: Request) -> Any:
        """The body, at most payload_limit bytes (413 beyond), parsed off the event loop (422)."""
        limit = service.payload_limit
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > _DRAIN_LIMIT:
            raise payload_too_large(limit)
        parts, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                if size > _DRAIN_LIMIT:
                    break
                parts.clear()  # keep reading to the end, keeping nothing, so the 413 is heard
                continue
            parts.append(chunk)
        if size > limit:
            raise payload_too_large(limit)
        return await service.off_loop(parse_body, b"".join(parts))

    def check_key(request: Request) -> None:
        if not service.api_key:
            return
        sent = request.headers.get("authorization", "").encode("utf-8", "replace")
        if not hmac.compare_digest(sent, f"Bearer {service.api_key}".encode()):  # constant time
            raise TGIError(401, "authentication", "Unauthorized: send 'Authorization: Bearer <api key>'")

    class Slot:
        """One of max_concurrent_requests; 429 "overloaded" when none is free (TGI's semaphore)."""

        def __enter__(self):
            if service.in_flight >= cfg.max_concurrent_requests:
                service.metrics.inc("tgi_request_failure", err="overloaded")
                raise TGIError(429, "overloaded", "Model is overloaded")
            service.in_flight += 1
            service.metrics.inc("tgi_request_count")
            return self

        def __exit__(self, *exc):
            service.in_flight -= 1

    async def handle(request: Request, stream: bool | None):
        try:
            check_key(request)
            body = await read_json(request)
            if stream is None:  # POST /: the body says
                stream = bool(isinstance(body, dict) and body.get("stream"))
            elif isinstance(body, dict):
                body = {k: v for k, v in body.items() if k != "stream"}
            # validation, tokenizing and the grammar compile (a broken grammar is a 422 before any
            # slot or stream starts), all on the validation threads
            p = await service.off_loop(service.prepare, body, stream)
            slot = Slot().__enter__()
            if not stream:
                try:
                    out = await service.generate_watched(p, request)
                finally:
                    slot.__exit__()
                if out is None:  # the client went away; nobody reads this
                    return JSONResponse({}, status_code=499, headers=HEADERS)
                if request.url.path == "/":
                    return JSONResponse([out], headers=HEADERS)
                return JSONResponse(out, headers=HEADERS)

            async def events():
                try:
                    async for ev in service.stream(p):
                        yield ev
                finally:
                    slot.__exit__()

            return sse(events())
        except TGIError as e:
            return error(e)
        except GrammarError as e:
            return error(validation(str(e)))

    async def generate(request):
        return await handle(request, False)

    async def generate_stream(request):
        return await handle(request, True)

    async def compat(request):
        return await handle(request, None)

    async def info(request):
        return JSONResponse(service.info(), headers=HEADERS)

    async def health(request):
        return PlainTextResponse("", headers=HEADERS)

    async def metrics(request):
        return PlainTextResponse(service.metrics.render(), headers=HEADERS)

    async def batches(request):
        return JSONResponse(
            {
                "router": STAND_IN,
                "steps": list(service.worker.batch_log),
                "kv_blocks": {
                    "total": service.engine.scheduler.kv.num_blocks,
                    "free": service.engine.scheduler.kv.num_free_blocks,
                },
                "in_flight": service.in_flight,
                "note": "not a TGI route: the stand-in's per-step admission log",
            },
            headers=HEADERS,
        )

    async def chat(request):
        from .chat import chat_completion

        try:
            check_key(request)
            body = await read_json(request)
            return await chat_completion(service, body, Slot, sse, HEADERS, request)
        except TGIError as e:
            return error(e)
        except GrammarError as e:
            return error(validation(str(e)))

    routes = [
        Route("/generate", generate, methods=["POST"]),
        Route("/generate_stream", generate_stream, methods=["POST"]),
        Route("/", compat, methods=["POST"]),
        Route("/info", info, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/stand-in/batches", batches, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ]
    return Starlette(routes=routes)


async def _disconnected(request: Any) -> None:
    """Return when the client of a request whose body was read disconnects."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


def make_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]
