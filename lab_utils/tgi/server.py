"""The HTTP side of the stand-in: TGI's routes and shapes over the engine worker (Starlette + uvicorn).

Routes (TGI v3.3.7's router/src/server.rs): POST /generate, POST /generate_stream (SSE), POST /
(what `text_generation.Client` calls: a JSON list, or SSE when "stream": true), GET /info,
GET /health, GET /metrics, POST /v1/chat/completions (Messages API). One extra route that real
TGI does not have, GET /stand-in/batches, returns the admission loop's per-step log for plots.
Every response carries the header `x-served-by: llm-serving-lab TGI-protocol stand-in`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from typing import Any

from .admission import TGIConfig
from .grammar import GrammarCompiler, GrammarError, GrammarLogitsProcessor
from .metrics import Metrics
from .protocol import STAND_IN, GenerateParams, TGIError, validate, validation
from .worker import EngineWorker, Job, LogprobRecorder

HEADERS = {"x-served-by": STAND_IN}


class Service:
    """Everything a request handler needs: the worker, the tokenizer, the limits."""

    def __init__(
        self, worker: EngineWorker, config: TGIConfig, model_id: str, api_key: str | None = None
    ) -> None:
        self.worker = worker
        self.config = config
        self.model_id = model_id
        self.api_key = api_key
        self.engine = worker.engine
        self.tok = self.engine.tokenizer
        self.metrics: Metrics = worker.metrics
        self.vocab_size = self.engine.model_config.vocab_size
        self.grammars = GrammarCompiler(self.tok, self.vocab_size)
        self.special_ids = set(getattr(self.tok, "all_special_ids", []) or [])
        self.in_flight = 0

    # ------------------------------------------------------------------ one generation
    def _sampling_params(self, p: GenerateParams, seed: int | None, recorder: LogprobRecorder):
        from lab_utils.engine import SamplingParams

        procs = []
        if p.grammar is not None:
            try:
                compiled = self.grammars.compile(p.grammar)
            except GrammarError as e:
                raise validation(str(e)) from None
            procs.append(GrammarLogitsProcessor(compiled, self.vocab_size))
        procs.append(recorder)  # after the grammar: it reports the masked distribution
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
        sp = self._sampling_params(p, seed, recorder)
        job = Job(p.input_ids, sp, asyncio.get_running_loop(), asyncio.Queue(), recorder)
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
        for _ in range(p.best_of):
            seed = self.seed_for(p)
            runs.append((seed, self.start_job(p, seed)))
        results = [await self.collect(job) for _, job in runs]
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
                self.metrics.inc("tgi_request_failure", err="generation")
                yield {"error": str(value), "error_type": "generation"}
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
        try:
            return json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            raise validation(f"Failed to deserialize the JSON body: {e}") from None

    def check_key(request: Request) -> None:
        if service.api_key and request.headers.get("authorization") != f"Bearer {service.api_key}":
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
            try:
                p = validate(body, cfg, service.tok.encode, stream=stream)
            except TGIError:
                service.metrics.inc("tgi_request_failure", err="validation")
                raise
            if p.grammar is not None:  # a broken grammar is a 422 before any slot or stream starts
                service.grammars.compile(p.grammar)
            slot = Slot().__enter__()
            if not stream:
                try:
                    out = await service.generate(p)
                finally:
                    slot.__exit__()
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
                "note": "not a TGI route: the stand-in's per-step admission log",
            },
            headers=HEADERS,
        )

    async def chat(request):
        from .chat import chat_completion

        try:
            check_key(request)
            body = await read_json(request)
            return await chat_completion(service, body, Slot, sse, HEADERS)
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


def make_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]
