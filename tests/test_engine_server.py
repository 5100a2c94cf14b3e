"""The course engine's OpenAI-style server (`lab_utils.engine.serve`) through the course's clients."""

from __future__ import annotations

import os
import threading
import time

import pytest

KEY = "test-key-123"


@pytest.fixture(scope="module")
def server(course_model):
    from lab_utils.servers import EngineServer

    srv = EngineServer(course_model, max_num_seqs=4, num_threads=1, enable_prefix_caching=False, api_key=KEY)
    srv.start()
    yield srv
    pid = srv.pid
    srv.stop()
    assert not srv.is_running
    with pytest.raises(ProcessLookupError):  # SIGTERM stopped it, engine thread and all
        os.kill(pid, 0)


def _post(srv, body: dict, key: str = KEY):
    import httpx

    return httpx.post(
        srv.base_url + "/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


@pytest.mark.slow
def test_loadgen_streams_with_exact_usage(server):
    from lab_utils.clients.loadgen import run_load

    result = run_load(
        server.base_url,
        server.model_name,
        ["The capital of France is", "Once upon a time"],
        concurrency=2,
        num_requests=4,
        output_lens=[5, 9],
        ignore_eos=True,
        api_key=KEY,
    )
    assert result.summary.num_errors == 0, result.summary.errors
    # ignore_eos: exactly max_tokens each, counted by the server's usage report
    assert [r.output_tokens for r in result.records] == [5, 9, 5, 9]
    assert all(r.ttft is not None and r.ttft > 0 and r.text for r in result.records)


@pytest.mark.slow
def test_openai_client_greedy_is_deterministic(server):
    import openai

    client = openai.OpenAI(**server.client_kwargs())
    assert [m.id for m in client.models.list().data] == [server.model_name]
    kw = dict(model=server.model_name, prompt="The capital of France is", max_tokens=6, temperature=0)
    plain = client.completions.create(**kw)
    streamed = client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens <= 6
    assert plain.usage.prompt_tokens == len(_tokens(server, "The capital of France is"))


def _tokens(server, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(server.model).encode(text)


@pytest.mark.slow
def test_bad_requests_get_400_and_spare_a_concurrent_request(server):
    good: dict = {}

    def long_request():
        good["r"] = _post(server, {"prompt": "Count: 1, 2, 3,", "max_tokens": 24, "ignore_eos": True})

    t = threading.Thread(target=long_request)
    t.start()
    bad = [
        ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"prompt": [10**9]}, "vocabulary"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ]
    for body, word in bad:
        r = _post(server, body)
        assert r.status_code == 400, r.text
        assert word in r.json()["error"]["message"]
    t.join(timeout=60)
    assert good["r"].status_code == 200
    assert good["r"].json()["usage"]["completion_tokens"] == 24


@pytest.mark.slow
def test_wrong_key_is_401_and_health_needs_none(server):
    import httpx

    assert _post(server, {"prompt": "x", "max_tokens": 1}, key="wrong").status_code == 401
    assert httpx.get(server.base_url + "/models").status_code == 401
    assert httpx.get(server.url + "/health").status_code == 200


def _aborted(server) -> int:
    import httpx

    text = httpx.get(server.url + "/metrics").text
    return int(text.split("engine_requests_aborted_total ")[1].split()[0])


@pytest.mark.slow
def test_client_disconnect_aborts_the_request(server):
    import httpx

    before = _aborted(server)
    body = {"prompt": "Tell me a story.", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", server.base_url + "/completions", json=body, headers=headers) as r:
        next(r.iter_lines())  # the first token came; hang up
    deadline = time.monotonic() + 20  # far less than 2000 tokens would take
    while _aborted(server) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _aborted(server) == before + 1
    assert "engine_num_requests_running 0" in httpx.get(server.url + "/metrics").text
    r = _post(server, {"prompt": "Hi", "max_tokens": 3, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 3
