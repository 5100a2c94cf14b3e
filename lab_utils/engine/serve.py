"""`python -m lab_utils.engine.serve --port PORT`: the course engine behind an OpenAI-style HTTP API.

Just enough of vLLM's OpenAI server for the course's load generator and the `openai` client to
drive the course engine the way they drive vLLM, so the two can be measured on the same prompts:

    GET  /health            200 once the model is loaded (no key needed)
    GET  /metrics           requests running and waiting, and aborted so far (Prometheus text)
    GET  /v1/models         the one model served
    POST /v1/completions    prompt (text or token ids), max_tokens, temperature, top_p, seed,
                            ignore_eos, stream (+ stream_options.include_usage)

One thread owns the engine (`EngineLoop`): every engine call (add_request, step, abort_request)
happens there, as in vLLM's EngineCore. HTTP handlers run on asyncio; each request gets an
asyncio queue, and the engine thread pushes the new text of every step onto it. A client that
disconnects has its request aborted, which frees its KV blocks at once.

Binds 127.0.0.1 only. When ENGINE_API_KEY is set, /v1/* needs `Authorization: Bearer <key>`
(the key travels in the environment, never on the command line, which `ps` shows to everyone).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import itertools
import json
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

API_KEY_ENV = "ENGINE_API_KEY"


class BadRequest(Exception):
    """A request the client must change; becomes an OpenAI-style error body with this status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param

    def body(self) -> dict:
        kind = {401: "authentication_error", 404: "not_found_error"}.get(self.status, "invalid_request_error")
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.status}}


@dataclass
class Job:
    """One HTTP request inside the engine: its inputs and the queue its text goes back on."""

    prompt: str | list[int]
    params: Any  # SamplingParams
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    request_id: str = ""
    text_sent: str = ""  # text already pushed (a step's delta is what lies beyond it)

    def push(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the server's loop is closed: nobody is listening any more
            pass


class EngineLoop:
    """The engine thread: add the inbox's requests, step, and push each request's new text.

    Events on a job's queue: ("accepted", prompt_tokens), ("rejected", message),
    ("text", delta), ("done", (finish_reason, prompt_tokens, completion_tokens)), ("error", message).
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.jobs: dict[str, Job] = {}
        self._ids = itertools.count()
        self.num_aborted = 0  # requests aborted because their client went away
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)

    def submit(self, job: Job) -> None:
        job.request_id = f"cmpl-{next(self._ids)}"
        self.inbox.put(("add", job))

    def abort(self, job: Job) -> None:
        self.inbox.put(("abort", job))

    def _drain_inbox(self, block: bool) -> None:
        try:  # an idle engine waits here (no busy loop); a busy one only looks
            item = self.inbox.get(timeout=0.05) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, job = item
            if kind == "add":
                try:  # tokenizing and the prompt checks happen in add_request, on this thread
                    self.engine.add_request(job.request_id, job.prompt, job.params)
                except (ValueError, TypeError) as e:
                    job.push(("rejected", str(e)))
                else:
                    self.jobs[job.request_id] = job
                    n = self.engine._requests[job.request_id].num_prompt_tokens
                    job.push(("accepted", n))
            elif self.jobs.pop(job.request_id, None) is not None:  # abort a live request
                self.engine.abort_request(job.request_id)
                self.num_aborted += 1
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _run(self) -> None:
        eng = self.engine
        threads = eng.config.num_threads
        if threads:  # OpenMP's thread count is per thread: the one that steps must set it too
            import torch

            torch.set_num_threads(threads)
        while not self._stop.is_set():
            self._drain_inbox(block=not eng.has_unfinished_requests())
            if not eng.has_unfinished_requests():
                continue
            try:
                outputs = eng.step()
            except Exception as e:  # noqa: BLE001 - a failed forward fails the batch, not the server
                for rid, job in list(self.jobs.items()):
                    job.push(("error", f"generation failed: {e}"))
                    eng.abort_request(rid)
                self.jobs.clear()
                continue
            for out in outputs:
                job = self.jobs.get(out.request_id)
                if job is None:
                    continue
                c = out.outputs[0]
                text = c.text
                # a token that ends inside a multi-byte character decodes to U+FFFD: wait for the rest
                if not out.finished and text.endswith("\ufffd"):
                    text = text.rstrip("\ufffd")
                if len(text) > len(job.text_sent) and text.startswith(job.text_sent):
                    job.push(("text", text[len(job.text_sent) :]))
                    job.text_sent = text
                if out.finished:
                    self.jobs.pop(out.request_id)
                    job.push(("done", (c.finish_reason, len(out.prompt_token_ids), len(c.token_ids))))


# ---------------------------------------------------------------------------------- requests
def sampling_params(body: dict, max_model_len: int):
    """SamplingParams from an OpenAI completions body; BadRequest naming the field to change."""
    from .sampling_params import SamplingParams

    def number(name: str, default, kind=float):
        value = body.get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadRequest(f"{name} must be a number, got {value!r}", param=name)
        if kind is int and int(value) != value:
            raise BadRequest(f"{name} must be a whole number, got {value!r}", param=name)
        return kind(value)

    max_tokens = number("max_tokens", 16, int)
    if max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    if max_tokens >= max_model_len:
        raise BadRequest(
            f"max_tokens={max_tokens} leaves no room for the prompt in max_model_len={max_model_len}; "
            "ask for fewer tokens",
            param="max_tokens",
        )
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise BadRequest(f"stop must be a string or a list of strings, got {stop!r}", param="stop")
    if body.get("n", 1) != 1 or body.get("best_of", 1) not in (1, None):
        raise BadRequest("this server makes one completion per request: leave n and best_of at 1", param="n")
    try:
        return SamplingParams(
            temperature=number("temperature", 1.0),
            top_p=number("top_p", 1.0),
            top_k=number("top_k", 0, int),
            seed=number("seed", None, int),
            max_tokens=max_tokens,
            stop=stop,
            ignore_eos=bool(body.get("ignore_eos", False)),
        )
    except ValueError as e:  # SamplingParams' own message says which value to change
        raise BadRequest(str(e)) from None


def prompt_of(body: dict) -> str | list[int]:
    """The prompt as text or token ids; BadRequest for anything else."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one, as the openai client may send it
    if isinstance(prompt, str) and prompt:
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return prompt
    raise BadRequest(
        "prompt must be a non-empty string or a non-empty list of token ids (one prompt per "
        f"request), got {type(prompt).__name__}",
        param="prompt",
    )


def chunk(job: Job, model: str, text: str, finish_reason: str | None) -> dict:
    """One streamed completions event, as vLLM and OpenAI send it."""
    return {
        "id": job.request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


# ---------------------------------------------------------------------------------- the app
def build_app(loop: EngineLoop, model_name: str, api_key: str | None = None):
    """The Starlette app: /health, /v1/models, /v1/completions over `loop`."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    max_model_len = loop.engine.max_model_len

    def check_key(request: Request) -> None:
        if not api_key:
            return
        sent = request.headers.get("authorization", "").encode("utf-8", "replace")
        if not hmac.compare_digest(sent, f"Bearer {api_key}".encode()):  # constant time
            raise BadRequest("send the server's key as 'Authorization: Bearer <key>'", status=401)

    async def health(request: Request):
        return PlainTextResponse("")

    async def metrics(request: Request):
        # vLLM's gauges' names, without the "vllm:" prefix; read from another thread, so a snapshot
        lines = [
            f"engine_num_requests_running {len(loop.jobs)}",
            f"engine_num_requests_waiting {loop.inbox.qsize()}",
            f"engine_requests_aborted_total {loop.num_aborted}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n")

    async def models(request: Request):
        try:
            check_key(request)
        except BadRequest as e:
            return JSONResponse(e.body(), status_code=e.status)
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "llm-serving-lab"}
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(request: Request):
        try:
            check_key(request)
            try:
                body = json.loads(await request.body())
            except ValueError:
                raise BadRequest("the body must be JSON") from None
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            if body.get("model") not in (None, model_name):
                raise BadRequest(
                    f"model {body.get('model')!r} is not served here; use {model_name!r} (GET /v1/models)",
                    status=404,
                    param="model",
                )
            job = Job(prompt_of(body), sampling_params(body, max_model_len), asyncio.get_running_loop())
            loop.submit(job)
            kind, value = await job.events.get()
            if kind == "rejected":
                raise BadRequest(value, param="prompt")
        except BadRequest as e:
            return JSONResponse(e.body(), status_code=e.status)
        prompt_tokens = value
        if body.get("stream"):
            options = body.get("stream_options") or {}
            return StreamingResponse(
                _sse(loop, job, model_name, bool(options.get("include_usage"))),
                media_type="text/event-stream",
            )
        result = await _collect(loop, job, request)
        if result is None:  # the client went away; nobody reads this
            return JSONResponse({}, status_code=499)
        if isinstance(result, str):
            return JSONResponse({"error": {"message": result, "type": "server_error"}}, status_code=500)
        text, reason, completion_tokens = result
        out = chunk(job, model_name, text, reason)
        out["usage"] = usage(prompt_tokens, completion_tokens)
        return JSONResponse(out)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    return Starlette(routes=routes)


async def _sse(loop: EngineLoop, job: Job, model: str, include_usage: bool):
    """The event stream; if the client disconnects, Starlette cancels it and `finally` aborts."""
    done = False
    try:
        while True:
            kind, value = await job.events.get()
            if kind == "text":
                yield f"data: {json.dumps(chunk(job, model, value, None))}\n\n"
            elif kind == "done":
                done = True
                reason, prompt_tokens, completion_tokens = value
                yield f"data: {json.dumps(chunk(job, model, '', reason))}\n\n"
                if include_usage:
                    last = chunk(job, model, "", None)
                    last["choices"] = []
                    last["usage"] = usage(prompt_tokens, completion_tokens)
                    yield f"data: {json.dumps(last)}\n\n"
                yield "data: [DONE]\n\n"
                return
            else:  # ("error", message): the engine step failed
                done = True
                yield f"data: {json.dumps({'error': {'message': value, 'type': 'server_error'}})}\n\n"
                return
    finally:
        if not done:
            loop.abort(job)


async def _collect(loop: EngineLoop, job: Job, request: Any) -> tuple | str | None:
    """(text, finish_reason, completion_tokens); an error message; or None if the client left."""

    async def gather():
        text = ""
        while True:
            kind, value = await job.events.get()
            if kind == "text":
                text += value
            elif kind == "done":
                return text, value[0], value[2]
            else:
                return value

    async def disconnected():
        while (await request.receive()).get("type") != "http.disconnect":
            pass

    work, gone = asyncio.ensure_future(gather()), asyncio.ensure_future(disconnected())
    await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    gone.cancel()
    if work.done():
        return work.result()
    work.cancel()
    loop.abort(job)
    return None


# ---------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m lab_utils.engine.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default=None, help="model folder (default: the course model)")
    ap.add_argument("--served-model-name", default=None, help="the name clients send (default: --model)")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--kv-cache-gib", type=float, default=1.0)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--num-speculative-tokens", type=int, default=0)
    ap.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True, help="as vLLM's flag"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import uvicorn

    from . import LLMEngine
    from .config import resolve_model

    try:
        engine = LLMEngine(
            args.model,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            kv_cache_gib=args.kv_cache_gib,
            dtype=args.dtype,
            num_threads=args.num_threads,
            num_speculative_tokens=args.num_speculative_tokens,
            enable_prefix_caching=args.enable_prefix_caching,
            record_steps=False,  # a server runs for hours: no per-step records
        )
    except ValueError as e:  # a bad flag: the config's message, and a usage error code
        print(f"error: {e}", file=sys.stderr)
        return 2
    model_name = args.served_model_name or str(args.model or resolve_model(None))
    loop = EngineLoop(engine)
    loop.start()
    app = build_app(loop, model_name, os.environ.get(API_KEY_ENV) or None)
    # uvicorn turns SIGTERM and Ctrl-C into a shutdown; streams still open get 5 s to end
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=args.port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
    )
    print(
        f"course engine on http://127.0.0.1:{args.port}/v1 serving {model_name} "
        f"(max_num_seqs={args.max_num_seqs}, max_num_batched_tokens={args.max_num_batched_tokens}, "
        f"prefix caching {'on' if args.enable_prefix_caching else 'off'}, "
        f"key {'required' if os.environ.get(API_KEY_ENV) else 'not required'})",
        flush=True,
    )
    try:
        server.run()
    finally:
        loop.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
