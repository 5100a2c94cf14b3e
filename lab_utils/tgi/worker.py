"""The engine side of the stand-in: one thread runs the course engine under TGI's admission policy.

HTTP handlers (asyncio) hand a `Job` to `EngineWorker.submit`; the worker thread adds it to the
engine, steps the engine (schedule -> execute -> update, with `TGIAdmission` as the scheduler's
policy) and pushes every new token back to the job's asyncio queue.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .admission import TGIAdmission, TGIConfig
from .metrics import Metrics

# Rows kept in the per-step log, and records kept by the admission policy and the engine: the
# stand-in runs for hours in a lab, so what it remembers for plots is bounded.
BATCH_LOG_ROWS = 10_000


class LogprobRecorder:
    """A logits processor that only watches: the log-probability of each sampled token and the top-n.

    Logprobs are taken after the grammar mask (when there is one) and before temperature, top-k
    and top-p.
    """

    def __init__(self, top_n: int = 0) -> None:
        self.top_n = top_n
        self._last = None  # log-softmax of the step whose token is not known yet
        self.logprobs: list[float] = []
        self.top: list[list[tuple[int, float]]] = []

    def __call__(self, output_token_ids: list[int], logits):
        import torch

        self.catch_up(output_token_ids)
        lp = torch.log_softmax(logits.float(), dim=-1)
        self._last = lp
        if self.top_n:
            v, i = lp.topk(self.top_n)
            self.top.append(list(zip(i.tolist(), v.tolist())))
        return logits

    def catch_up(self, output_token_ids: list[int]) -> None:
        """Record the logprob of the token sampled from the last distribution seen."""
        if self._last is not None and len(self.logprobs) < len(output_token_ids):
            self.logprobs.append(float(self._last[output_token_ids[len(self.logprobs)]]))
            self._last = None


@dataclass
class Job:
    """One engine request and the channel its tokens go back on."""

    prompt_ids: list[int]
    sampling_params: Any
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    recorder: LogprobRecorder
    request_id: str = ""
    arrival: float = field(default_factory=time.monotonic)
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    sent: int = 0  # tokens already pushed
    cancelled: bool = False
    # what went wrong inside this request's own step work (its logits processors); see server._Guard
    fault: list = field(default_factory=list)
    deadline: float = math.inf  # time.monotonic() by which it must be done (queueing included)

    def push(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the handler's loop is closed: nobody is listening any more
            pass


class EngineWorker:
    """Owns the LLMEngine; all engine calls happen on its thread."""

    def __init__(self, engine: Any, config: TGIConfig, metrics: Metrics) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.policy: TGIAdmission = engine.scheduler.schedule_fn
        self.inbox: queue.Queue[Job] = queue.Queue()
        self.jobs: dict[str, Job] = {}
        self._ids = itertools.count()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="tgi-engine", daemon=True)
        # one row per step: time, kind, batch size, queue length (the last BATCH_LOG_ROWS steps)
        self.batch_log: collections.deque[dict] = collections.deque(maxlen=BATCH_LOG_ROWS)
        self.t0 = time.monotonic()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)

    def submit(self, job: Job) -> None:
        job.request_id = f"r{next(self._ids)}"
        self.inbox.put(job)

    def _drain_inbox(self, block: bool) -> None:
        try:
            job = self.inbox.get(timeout=0.05) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if job.cancelled:
                job.push(("cancelled", None))
            elif time.monotonic() > job.deadline:
                job.push(("timeout", "Request timed out before it was scheduled"))
            else:
                try:
                    self.engine.add_request(
                        job.request_id, job.prompt_ids, job.sampling_params, arrival_time=job.arrival
                    )
                    self.jobs[job.request_id] = job
                except Exception as e:  # noqa: BLE001 - becomes a 424 for this request only
                    job.push(("error", f"Request failed during generation: {e}"))
            try:
                job = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _run(self) -> None:
        eng = self.engine
        while not self._stop.is_set():
            self._drain_inbox(block=not eng.has_unfinished_requests())
            now = time.monotonic()
            for rid in [r for r, j in self.jobs.items() if j.cancelled or now > j.deadline]:
                eng.abort_request(rid)  # frees its KV blocks now
                job = self.jobs.pop(rid)
                if job.cancelled:
                    job.push(("cancelled", None))
                else:
                    self.metrics.inc("tgi_request_timeout")
                    job.push(("timeout", "Request timed out after its deadline (--request-timeout)"))
            if not eng.has_unfinished_requests():
                continue
            sched = eng.scheduler
            self.metrics.set("tgi_queue_size", len(sched.waiting))
            t = time.monotonic()
            try:
                outputs = eng.step(finished_only=True)
            except Exception as e:  # noqa: BLE001 - a failed forward fails the batch, as in TGI
                for rid, job in list(self.jobs.items()):
                    job.push(("error", f"Request failed during generation: {e}"))
                    eng.abort_request(rid)
                self.jobs.clear()
                self.metrics.inc("tgi_batch_inference_failure")
                continue
            now = time.monotonic()
            rec = self.policy.records[-1] if self.policy.records else None
            kind = rec.kind if rec else "decode"
            self.metrics.inc("tgi_batch_inference_count", method=kind)
            self.metrics.observe("tgi_batch_forward_duration", now - t, method=kind)
            if rec is not None and rec.admitted:
                self.metrics.observe("tgi_batch_next_size", rec.admitted)
                if rec.reason in ("backpressure", "wait_exceeded"):
                    self.metrics.inc("tgi_batch_concat", reason=rec.reason)
            self.metrics.set("tgi_batch_current_size", len(sched.running))
            self.metrics.set("tgi_batch_current_max_tokens", self.policy._reserved(sched.running))
            self.metrics.set("tgi_queue_size", len(sched.waiting))
            self.batch_log.append(
                {
                    "t": t - self.t0,
                    "end": now - self.t0,
                    "kind": kind,
                    "batch_size": len(sched.running),
                    "waiting": len(sched.waiting),
                    "admitted": rec.admitted if rec else 0,
                }
            )
            self._trim()
            finished = {o.request_id: o for o in outputs}
            for rid, job in list(self.jobs.items()):
                if job.fault:  # its own logits processor failed: it alone fails, the batch goes on
                    eng.abort_request(rid)
                    self.jobs.pop(rid)
                    job.push(("error", f"Request failed during generation: {job.fault[0]}"))
                    continue
                req = eng._requests.get(rid)
                out = finished.get(rid)
                ids = out.outputs[0].token_ids if out is not None else (req.output_token_ids if req else [])
                if job.first_scheduled is None and (req is None or req.num_computed_tokens > 0):
                    job.first_scheduled = t
                job.recorder.catch_up(ids)
                while job.sent < len(ids):
                    if job.first_token is None:
                        job.first_token = now
                    job.push(("token", ids[job.sent]))
                    job.sent += 1
                if out is not None:
                    job.finished = now
                    c = out.outputs[0]
                    job.push(("done", (c.finish_reason, c.stop_reason, c.text)))
                    self.jobs.pop(rid)

    def _trim(self) -> None:
        """Keep the policy's and the engine's per-request records bounded."""
        records = self.policy.records
        if len(records) > 2 * BATCH_LOG_ROWS:
            del records[:-BATCH_LOG_ROWS]
        stats = getattr(self.engine, "request_stats", None)
        if isinstance(stats, dict) and len(stats) > 2 * BATCH_LOG_ROWS:
            for rid in list(itertools.islice(stats, len(stats) - BATCH_LOG_ROWS)):
                del stats[rid]
