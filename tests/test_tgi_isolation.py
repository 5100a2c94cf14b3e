"""The TGI stand-in under abuse, in-process: validation before tokenizing, NaN-safe sampling, one
failing request failing alone, deadlines and cancellation freeing KV blocks, bounded records.

The fast tests need no model. The slow ones load the course engine once for the module (in this
process, no server) and drive `Service` and `EngineWorker` directly.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest

from lab_utils.tgi import TGIConfig
from lab_utils.tgi.protocol import MAX_JSON_DEPTH, TGIError, parse_body, validate

CFG = TGIConfig(max_input_tokens=100, max_total_tokens=200, max_batch_total_tokens=1000)


def _never(_text):
    raise AssertionError("tokenized a request that validation should have refused first")


# ---------------------------------------------------------------------------- fast: validation
@pytest.mark.parametrize(
    "raw, message",
    [
        (b'{"inputs": "hi", "parameters": {"temperature": NaN}}', "NaN"),
        (b'{"inputs": "hi", "parameters": {"temperature": Infinity}}', "Infinity"),
        (b'{"inputs": "hi", "parameters": {"top_p": -Infinity}}', "Infinity"),
        (b'{"inputs": "hi", "parameters": {"temperature": 1e999}}', "overflows"),
        (b"[" * 100_000 + b"]" * 100_000, "recursion limit"),
        (b'{"inputs": ' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}", "recursion"),
        (b"\xff\xfe", "deserialize"),
    ],
)
def test_bodies_serde_json_refuses_are_422(raw, message):
    with pytest.raises(TGIError, match=message) as e:
        parse_body(raw)
    assert e.value.status == 422 and set(e.value.body()) == {"error", "error_type"}


def test_a_body_at_the_depth_limit_parses():
    assert parse_body(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH) is not None
    assert parse_body(b'{"a": 1.5e300}') == {"a": 1.5e300}


@pytest.mark.parametrize(
    "params, message",
    [
        ({"temperature": 1e-300}, "temperature"),
        ({"temperature": 5e-324}, "temperature"),
        ({"temperature": 10**400}, "finite"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -1}, "seed"),
        ({"seed": 10**30}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"max_new_tokens": 10**400}, "max_new_tokens"),
        ({"top_k": "5"}, "top_k"),
    ],
)
def test_numbers_that_would_break_the_engine_are_422_before_tokenizing(params, message):
    with pytest.raises(TGIError, match=message) as e:
        validate({"inputs": "hello", "parameters": params}, CFG, _never, stream=False)
    assert e.value.status == 422


def test_the_largest_seed_is_a_u64_and_passes():
    p = validate({"inputs": "hi", "parameters": {"seed": 2**64 - 1}}, CFG, lambda s: [1, 2], stream=False)
    assert p.seed == 2**64 - 1


def test_a_huge_input_is_refused_without_tokenizing_it():
    with pytest.raises(TGIError, match="refused before tokenizing"):
        validate({"inputs": "x" * 1_000_000}, CFG, _never, stream=False)
    seen = []
    validate(
        {"inputs": "y" * 1_000_000, "parameters": {"truncate": 10}},
        CFG,
        lambda s: seen.append(len(s)) or [1] * 10,
        stream=False,
    )
    assert seen and seen[0] <= 10 * 64  # with truncate only the end is tokenized


def test_sampler_never_raises_on_nan_or_overflowing_temperature():
    import torch

    from lab_utils.engine.sampler import Sampler
    from lab_utils.engine.sampling_params import SamplingParams

    s = Sampler()
    logits = torch.tensor([[0.0, 3.0, 1.0], [1.0, 0.0, 2.0], [float("nan")] * 3])
    params = [
        SamplingParams(temperature=1e-300, max_tokens=2),  # logits / T overflow: NaN probabilities
        SamplingParams(temperature=1.0, seed=2**64 - 1, max_tokens=2),
        SamplingParams(temperature=1.0, max_tokens=2),
    ]
    tokens = s.sample(logits, ["a", "b", "c"], params)
    assert tokens[0] == 1 and 0 <= tokens[1] < 3 and 0 <= tokens[2] < 3


def test_a_failing_logits_processor_marks_its_request_and_returns_the_logits():
    from lab_utils.tgi.server import _Guard

    fault: list = []

    def bad(ids, logits):
        raise RuntimeError("matcher exploded")

    g = _Guard(bad, fault)
    assert g([1], "logits") == "logits" and fault == ["RuntimeError: matcher exploded"]
    assert g([1, 2], "again") == "again" and len(fault) == 1  # not called again once failed


# ---------------------------------------------------------------------------- slow: the engine
@pytest.fixture(scope="module")
def service():
    from lab_utils.tgi import create_service

    cfg = TGIConfig(
        max_input_tokens=256, max_total_tokens=512, max_batch_total_tokens=2048, max_concurrent_requests=8
    )
    svc = create_service(cfg, num_threads=2, request_timeout=30)
    yield svc
    svc.worker.stop()
    svc.executor.shutdown(wait=False)


def _params(svc, text: str, max_new: int, **extra):
    body = {"inputs": text, "parameters": {"max_new_tokens": max_new, **extra}}
    return validate(body, svc.config, svc.tok.encode, stream=False)


# the grammar forbids EOS until 150 repeats are written: a request that surely runs for a while
LONG = {"grammar": {"type": "regex", "value": "(ab ){150}"}}


def _kv_free(svc) -> int:
    return svc.engine.scheduler.kv.num_free_blocks


async def _wait_idle(svc, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while svc.worker.jobs or svc.engine.has_unfinished_requests():
        assert time.monotonic() < deadline, "the worker still holds requests"
        await asyncio.sleep(0.05)


@pytest.mark.slow
def test_a_request_failing_inside_the_step_fails_alone(service):
    from lab_utils.tgi.server import _Guard
    from lab_utils.tgi.worker import Job, LogprobRecorder

    free0 = _kv_free(service)

    async def main():
        good = [service.start_job(_params(service, f"Count: {i}, {i + 1},", 12), None) for i in range(2)]
        # a third request whose own logits processor raises at its 4th token, mid-batch
        p = _params(service, "Count: 7, 8,", 12)
        rec, fault = LogprobRecorder(), []
        sp = service._sampling_params(p, None, rec, fault)

        def explode(ids, logits):
            if len(ids) >= 3:
                raise RuntimeError("this request's grammar broke")
            return logits

        sp.logits_processors.append(_Guard(explode, fault))
        bad = Job(p.input_ids, sp, asyncio.get_running_loop(), asyncio.Queue(), rec, fault=fault)
        service.worker.submit(bad)
        results = await asyncio.gather(*(service.collect(j) for j in good), return_exceptions=True)
        with pytest.raises(TGIError, match="grammar broke") as e:
            await service.collect(bad)
        assert e.value.status == 424
        await _wait_idle(service)
        return results, bad

    results, bad = asyncio.run(main())
    assert all(isinstance(r, dict) and len(r["ids"]) == 12 for r in results), results
    assert bad.sent == 3  # the tokens it made before failing were delivered, then it stopped
    assert _kv_free(service) == free0  # its blocks went back


@pytest.mark.slow
def test_cancelled_and_timed_out_requests_free_their_kv_blocks(service):
    free0 = _kv_free(service)

    async def main():
        job = service.start_job(_params(service, "Repeat:", 300, **LONG), None)
        t0 = time.monotonic()
        while job.sent < 3:
            assert job.finished is None and time.monotonic() - t0 < 60
            await asyncio.sleep(0.02)
        assert _kv_free(service) < free0
        job.cancelled = True  # what a disconnected client's handler does
        kind, _ = await asyncio.wait_for(_last_event(job), 20)
        assert kind == "cancelled"
        await _wait_idle(service)
        assert _kv_free(service) == free0

        old = service.request_timeout
        service.request_timeout = 0.5
        try:
            t0 = time.monotonic()
            with pytest.raises(TGIError) as e:
                await service.generate(_params(service, "Repeat:", 300, **LONG))
            assert e.value.status == 408 and e.value.error_type == "timeout"
            assert time.monotonic() - t0 < 10
        finally:
            service.request_timeout = old
        await _wait_idle(service)
        assert _kv_free(service) == free0

        # a non-streaming generate cancelled mid-way (its handler's task is cancelled)
        task = asyncio.ensure_future(service.generate(_params(service, "Repeat:", 300, **LONG)))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _wait_idle(service)
        assert _kv_free(service) == free0

    asyncio.run(main())


async def _last_event(job):
    while True:
        kind, value = await job.events.get()
        if kind != "token":
            return kind, value


@pytest.mark.slow
def test_records_are_bounded(service, monkeypatch):
    from lab_utils.tgi import worker as worker_mod

    monkeypatch.setattr(worker_mod, "BATCH_LOG_ROWS", 5)
    w = service.worker
    w.policy.records.extend(w.policy.records[-1:] * 20)
    service.engine.request_stats.update({f"x{i}": {} for i in range(20)})
    w._trim()
    assert len(w.policy.records) == 5 and len(service.engine.request_stats) == 5
    assert w.batch_log.maxlen == worker_mod.BATCH_LOG_ROWS or w.batch_log.maxlen is not None
    assert math.isfinite(service.request_timeout)
    json.dumps(list(w.batch_log))
