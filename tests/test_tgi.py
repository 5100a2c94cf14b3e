"""lab_utils.tgi: TGI's admission rules, request validation, and the stand-in router driven by the
official clients (`text-generation`, `huggingface_hub.InferenceClient`, the openai SDK).

The server tests share ONE router per module (starting it loads the course model, ~25 s here).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from lab_utils.sim import ContinuousBatching, simulate
from lab_utils.sim.workload import WorkloadRequest
from lab_utils.tgi import TGIAdmission, TGIConfig, min_batch_size, next_batch, reserved_tokens
from lab_utils.tgi.protocol import TGIError, validate


# ---------------------------------------------------------------------------- admission rules
def test_reserved_tokens_counts_prompt_and_max_new_minus_one_in_blocks():
    assert reserved_tokens(100, 50) == 149
    assert reserved_tokens(100, 50, block_size=16) == 160


def test_min_batch_size_follows_the_ratio_until_the_wait_is_exceeded():
    assert min_batch_size(10, 1, 0.3, 20) == 3
    assert min_batch_size(3, 5, 0.3, 20) == 0  # floor(0.9): any waiting request qualifies
    assert min_batch_size(10, 20, 0.3, 20) is None


def test_next_batch_is_fifo_and_stops_at_the_first_request_that_does_not_fit():
    q = [(100, 10), (500, 10), (50, 10)]
    assert next_batch(q, min_size=None, max_size=None, prefill_token_budget=400, token_budget=10_000) == 1
    assert next_batch(q, min_size=None, max_size=None, prefill_token_budget=1000, token_budget=10_000) == 3
    assert next_batch(q, min_size=None, max_size=2, prefill_token_budget=1000, token_budget=10_000) == 2
    # the total budget counts max_new_tokens as well
    assert next_batch(q, min_size=None, max_size=None, prefill_token_budget=1000, token_budget=600) == 1
    # a batch smaller than min_size is refused whole
    assert next_batch(q, min_size=2, max_size=None, prefill_token_budget=400, token_budget=10_000) == 0
    assert next_batch(q[:1], min_size=2, max_size=None, prefill_token_budget=1000, token_budget=10_000) == 0


def test_config_checks_are_the_launchers():
    with pytest.raises(ValueError, match="must be < `max_total_tokens`"):
        TGIConfig(max_input_tokens=2048, max_total_tokens=2048)
    with pytest.raises(ValueError, match="max_batch_total_tokens"):
        TGIConfig(max_total_tokens=4096, max_batch_total_tokens=2048)
    assert TGIConfig(max_input_tokens=1000).max_batch_prefill_tokens == 1050
    assert "--waiting-served-ratio" in TGIConfig().launcher_args()


def _sim(cfg: TGIConfig, reqs, max_new=None):
    policy = TGIAdmission(cfg, max_new_tokens=max_new)
    res = simulate(
        reqs,
        ContinuousBatching(
            max_num_seqs=cfg.max_concurrent_requests,
            max_num_batched_tokens=max(cfg.max_batch_prefill_tokens, cfg.max_concurrent_requests),
            enable_chunked_prefill=False,
        ),
        schedule_fn=policy,
    )
    return policy, res


def test_policy_in_the_simulator_pauses_the_batch_to_prefill_and_respects_budgets():
    cfg = TGIConfig(
        max_input_tokens=256,
        max_total_tokens=512,
        max_batch_prefill_tokens=512,
        max_batch_total_tokens=2048,
        max_concurrent_requests=64,
    )
    reqs = [WorkloadRequest(i, 0.02 * i, 200, 40) for i in range(20)]
    policy, res = _sim(cfg, reqs)
    assert all(r.finish_time is not None for r in res.requests)
    for step in res.steps:  # a step is a prefill of new requests OR a decode, never both
        assert not (step.prefill and step.decode)
        assert sum(step.prefill.values()) <= cfg.max_batch_prefill_tokens
    assert max(r.reserved for r in policy.records) <= cfg.max_batch_total_tokens
    assert {r.kind for r in policy.records} >= {"prefill", "decode"}


def test_waiting_served_ratio_holds_back_a_lone_request_until_max_waiting_tokens():
    cfg = TGIConfig(
        max_input_tokens=64,
        max_total_tokens=256,
        max_batch_prefill_tokens=1024,
        max_batch_total_tokens=8192,
        waiting_served_ratio=1.0,
        max_waiting_tokens=7,
    )
    # ten requests running, then one arrives: min_size = 10, so it waits for the wait limit
    reqs = [WorkloadRequest(i, 0.0, 32, 100) for i in range(10)] + [WorkloadRequest(10, 0.05, 32, 10)]
    policy, _ = _sim(cfg, reqs)
    late = [r for r in policy.records if r.kind == "prefill" and r.step > 0]
    assert late and late[0].reason == "wait_exceeded"
    decodes_before = sum(1 for r in policy.records[1 : late[0].step] if r.kind == "decode")
    assert decodes_before >= cfg.max_waiting_tokens - 1


# ---------------------------------------------------------------------------- validation
def _v(params, stream=False, cfg=None):
    return validate(
        {"inputs": "hello", "parameters": params},
        cfg or TGIConfig(max_input_tokens=100, max_total_tokens=200, max_batch_total_tokens=1000),
        lambda s: [1] * 10,
        stream=stream,
    )


@pytest.mark.parametrize(
    "params, message",
    [
        ({"max_new_tokens": 500}, "must be <= 200"),
        ({"max_new_tokens": -1}, "strictly positive"),
        ({"max_new_tokens": 0}, "strictly positive"),
        ({"temperature": 0}, "temperature"),
        ({"top_p": 1.0}, "top_p"),
        ({"frobnicate": 1}, "unknown parameter"),
        ({"best_of": 2}, "sampling"),
        ({"best_of": 2, "do_sample": True}, None),
        ({"best_of": 3, "do_sample": True}, "best_of"),
        ({"top_n_tokens": 9}, "top_n_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"repetition_penalty": 1.2}, "not implemented"),
    ],
)
def test_validation_messages(params, message):
    if message is None:
        assert _v(params).best_of == 2
        return
    with pytest.raises(TGIError, match=message) as e:
        _v(params)
    assert e.value.status == 422 and e.value.body()["error_type"] == "validation"


def test_defaults_are_greedy_and_fill_the_room_left():
    p = _v({})
    assert p.temperature == 0 and p.max_new_tokens == 190
    assert _v({"top_k": 5}).temperature == 1.0  # a warper turns sampling on, as in TGI


def test_text_generation_imports_with_the_installed_huggingface_hub():
    import huggingface_hub
    import text_generation
    from text_generation.errors import OverloadedError, ValidationError  # noqa: F401

    assert int(huggingface_hub.__version__.split(".")[0]) >= 1  # the pin it declares is not what we run
    text_generation.Client("http://127.0.0.1:9")  # builds without contacting anything


# ---------------------------------------------------------------------------- the router
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def router():
    from lab_utils.servers.tgi import TGIServer

    srv = TGIServer(
        max_input_tokens=512,
        max_total_tokens=1024,
        max_batch_total_tokens=4096,
        max_concurrent_requests=3,
        num_threads=2,
    )
    srv.start()
    yield srv
    pid = srv.pid
    srv.stop()
    assert not srv.is_running
    with pytest.raises(ProcessLookupError):  # SIGTERM stopped it and its engine thread
        os.kill(pid, 0)


@pytest.mark.slow
def test_info_and_headers_say_it_is_the_stand_in(router):
    import httpx

    r = httpx.get(router.url + "/info")
    assert r.json()["router"] == "llm-serving-lab TGI-protocol stand-in"
    assert r.headers["x-served-by"] == "llm-serving-lab TGI-protocol stand-in"
    assert r.json()["max_total_tokens"] == 1024


@pytest.mark.slow
def test_client_generate_with_details_is_the_course_engines_greedy_output(router):
    from text_generation import Client

    from lab_utils.engine import LLMEngine, SamplingParams

    resp = Client(router.url, timeout=120).generate("The capital of France is", max_new_tokens=8)
    d = resp.details
    assert d.generated_tokens == len(d.tokens) == 8 and d.finish_reason.value == "length"
    assert all(t.logprob is not None and t.logprob <= 0 for t in d.tokens)
    ref = LLMEngine(max_num_seqs=2, num_kv_blocks=64, num_threads=1, record_steps=False)
    out = ref.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))[0]
    assert [t.id for t in d.tokens] == out.outputs[0].token_ids
    assert resp.generated_text == out.outputs[0].text


@pytest.mark.slow
def test_client_generate_stream_token_by_token(router):
    from text_generation import Client

    events = list(Client(router.url, timeout=120).generate_stream("Hello, my name is", max_new_tokens=6))
    assert len(events) == 6
    assert all(e.generated_text is None for e in events[:-1])
    assert events[-1].details.generated_tokens == 6
    assert "".join(e.token.text for e in events) == events[-1].generated_text


@pytest.mark.slow
def test_grammar_output_parses_against_the_schema(router):
    jsonschema = pytest.importorskip("jsonschema")
    from text_generation import Client

    resp = Client(router.url, timeout=120).generate(
        "A person as JSON:", max_new_tokens=48, grammar={"type": "json", "value": SCHEMA}
    )
    jsonschema.validate(json.loads(resp.generated_text), SCHEMA)


@pytest.mark.slow
def test_validation_error_is_the_clients_exception(router):
    from text_generation import Client
    from text_generation.errors import ValidationError

    with pytest.raises(ValidationError, match="max_new_tokens"):
        Client(router.url, timeout=60).generate("hi", max_new_tokens=5000)


@pytest.mark.slow
def test_over_max_concurrent_requests_is_overloaded(router):
    import requests
    from text_generation import Client
    from text_generation.errors import OverloadedError

    # a regex grammar masks EOS until 150 repeats are written, so no stream can end early and free
    # its slot before the fourth request arrives (greedy text alone may stop at any point)
    body = {
        "inputs": "Count to five hundred: 1, 2, 3, 4, 5,",
        "parameters": {"max_new_tokens": 300, "grammar": {"type": "regex", "value": "(ab ){150}"}},
    }
    streams = [
        requests.post(router.url + "/generate_stream", json=body, stream=True, timeout=60) for _ in range(3)
    ]
    # keep each line iterator alive: a dropped iterator is garbage-collected, urllib3 then closes the
    # connection, and the server rightly frees that stream's slot
    lines = [s.iter_lines() for s in streams]
    try:
        for it in lines:  # every slot is now held by a live stream
            assert next(it).startswith(b"data:"), "a stream did not start"
        with pytest.raises(OverloadedError):
            Client(router.url, timeout=60).generate("hi", max_new_tokens=2)
    finally:
        for s in streams:
            s.close()
    deadline = time.monotonic() + 30  # closed streams free their slots
    while True:
        try:
            Client(router.url, timeout=60).generate("hi", max_new_tokens=2)
            break
        except OverloadedError:
            assert time.monotonic() < deadline, "slots were not released after the clients left"
            time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "body, status",
    [
        (b"{not json", 422),
        (json.dumps({"inputs": "hi", "parameters": {"max_new_tokens": -3}}).encode(), 422),
        (json.dumps({"inputs": "hi", "parameters": {"max_new_tokens": 10**9}}).encode(), 422),
        (json.dumps({"inputs": "hi", "parameters": {"colour": "red"}}).encode(), 422),
        (
            json.dumps(
                {"inputs": "hi", "parameters": {"grammar": {"type": "regex", "value": "(["}}}
            ).encode(),
            422,
        ),
        (
            json.dumps(
                {"inputs": "hi", "parameters": {"grammar": {"type": "json", "value": {"type": "object"}}}}
            ).encode(),
            422,
        ),
    ],
)
def test_bad_requests_get_tgis_error_shape_and_the_router_keeps_serving(router, body, status):
    import httpx

    r = httpx.post(
        router.url + "/generate", content=body, headers={"content-type": "application/json"}, timeout=60
    )
    assert r.status_code == status
    assert set(r.json()) == {"error", "error_type"} and r.json()["error_type"] == "validation"
    ok = httpx.post(
        router.url + "/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": 2}}, timeout=60
    )
    assert ok.status_code == 200


def _bad_bodies() -> list[tuple[str, bytes, int]]:
    def gen(params):
        return json.dumps({"inputs": "hi", "parameters": {"max_new_tokens": 4, **params}}).encode()

    return [
        ("NaN", b'{"inputs": "hi", "parameters": {"temperature": NaN}}', 422),
        ("Infinity", b'{"inputs": "hi", "parameters": {"top_p": Infinity}}', 422),
        ("underflowing temperature", gen({"temperature": 1e-300}), 422),
        ("seed 2**64", gen({"seed": 2**64}), 422),
        ("negative seed", gen({"seed": -1}), 422),
        ("deep nesting", b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 422),
        ("3 MB body", json.dumps({"inputs": "word " * 600_000}).encode(), 413),
        ("40 MB body", b'{"inputs": "' + b"a" * (40 << 20) + b'"}', 413),
    ]


@pytest.mark.slow
def test_bad_requests_fail_at_once_while_a_long_stream_completes_and_health_answers(router):
    """Each abusive request gets its 4xx within 2 s; the long stream is untouched; /health stays fast."""
    import threading

    import httpx

    long_body = {
        "inputs": "Repeat after me:",
        "parameters": {"max_new_tokens": 300, "grammar": {"type": "regex", "value": "(ab ){140}"}},
    }
    state: dict = {"events": [], "first": threading.Event()}

    def long_stream():
        with httpx.stream("POST", router.url + "/generate_stream", json=long_body, timeout=300) as r:
            state["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data:"):
                    state["events"].append(json.loads(line[5:]))
                    state["first"].set()
        state["end"] = time.monotonic()
        state["first"].set()

    health: list[float] = []
    stop = threading.Event()

    def probe():
        with httpx.Client(timeout=5) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    ok = c.get(router.url + "/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                health.append(time.monotonic() - t0 if ok else float("inf"))
                time.sleep(0.1)

    streamer = threading.Thread(target=long_stream)
    prober = threading.Thread(target=probe)
    streamer.start()
    prober.start()
    try:
        assert state["first"].wait(120), "the long stream never started"
        with httpx.Client(timeout=30) as c:
            for what, raw, status in _bad_bodies():
                t0 = time.monotonic()
                r = c.post(
                    router.url + "/generate", content=raw, headers={"content-type": "application/json"}
                )
                took = time.monotonic() - t0
                assert r.status_code == status, (what, r.status_code, r.text[:200])
                assert set(r.json()) == {"error", "error_type"}, what
                assert took < 2.0, f"{what} took {took:.1f} s"
            chat = c.post(
                router.url + "/v1/chat/completions",
                content=b'{"model": "tgi", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
                headers={"content-type": "application/json"},
            )
            assert chat.status_code == 422
        bad_done = time.monotonic()
        streamer.join(timeout=300)
    finally:
        stop.set()
        prober.join(timeout=10)
    assert state.get("status") == 200
    last = state["events"][-1]
    assert "error" not in last and last["details"]["generated_tokens"] == len(state["events"])
    assert state["end"] > bad_done, "the long stream ended before the abuse did: make it longer"
    assert health and max(health) < 2.0, f"/health took up to {max(health):.2f} s"


@pytest.mark.slow
def test_a_client_that_leaves_a_non_streaming_request_frees_its_slot_and_kv(router):
    import httpx

    # the grammar forbids EOS until 250 repeats are written: far longer than the client waits
    body = {
        "inputs": "Repeat after me:",
        "parameters": {"max_new_tokens": 500, "grammar": {"type": "regex", "value": "(ab ){250}"}},
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(router.url + "/generate", json=body, timeout=1.5)  # the client gives up and closes
    deadline = time.monotonic() + 15
    while True:
        b = httpx.get(router.url + "/stand-in/batches").json()
        if b["in_flight"] == 0 and b["kv_blocks"]["free"] == b["kv_blocks"]["total"]:
            break
        assert time.monotonic() < deadline, f"the abandoned request still runs: {b['kv_blocks']}"
        time.sleep(0.2)
    assert 'err="cancelled"' in httpx.get(router.url + "/metrics").text


@pytest.mark.slow
def test_huggingface_hub_inference_client(router):
    from huggingface_hub import InferenceClient

    c = InferenceClient(base_url=router.url)
    text = c.text_generation("The capital of France is", max_new_tokens=5)
    assert isinstance(text, str) and text
    pieces = list(c.text_generation("The capital of France is", max_new_tokens=5, stream=True))
    assert "".join(pieces) == text  # greedy: the same tokens either way
    chat = c.chat_completion([{"role": "user", "content": "Say hi"}], max_tokens=6, temperature=0)
    assert chat.choices[0].message.content


@pytest.mark.slow
def test_openai_sdk_on_the_messages_api(router):
    import openai

    c = openai.OpenAI(base_url=router.url + "/v1", api_key="unused")
    msgs = [{"role": "user", "content": "Say hi"}]
    full = c.chat.completions.create(model="tgi", messages=msgs, max_tokens=8, temperature=0)
    streamed = "".join(
        ch.choices[0].delta.content or ""
        for ch in c.chat.completions.create(
            model="tgi", messages=msgs, max_tokens=8, temperature=0, stream=True
        )
    )
    assert full.choices[0].message.content == streamed
    assert full.usage.completion_tokens <= 8


@pytest.mark.slow
def test_metrics_have_tgis_names(router):
    import httpx

    text = httpx.get(router.url + "/metrics").text
    for name in (
        "tgi_queue_size",
        "tgi_batch_current_size",
        "tgi_request_count",
        "tgi_request_success",
        "tgi_request_duration_bucket",
        "tgi_request_failure",
    ):
        assert name in text, name


def test_launchers_build_the_commands_without_starting():
    from lab_utils.servers.tgi import TGIContainer, TGIServer

    srv = TGIServer(api_key="k3y", max_input_tokens=64, max_total_tokens=128, max_batch_total_tokens=512)
    assert "-m" in srv.argv and "lab_utils.tgi" in srv.argv and "k3y" not in " ".join(srv.argv)
    assert srv.env == {"TGI_STAND_IN_API_KEY": "k3y"}  # the key stays off the command line
    cmd = TGIContainer.docker_command(
        "m",
        volume="/tmp/d",
        image="ghcr.io/huggingface/text-generation-inference:3.3.7",
        num_shard=2,
        quantize="awq",
        shm_size="1g",
        config=TGIConfig(),
    )
    assert cmd[cmd.index("--num-shard") + 1] == "2" and "--shm-size" in cmd and "HF_TOKEN" in cmd
    box = TGIContainer("m", volume="/tmp/d")
    name = box.command[box.command.index("--name") + 1]
    assert name.startswith("llm-serving-lab-tgi-") and "--rm" in box.command
    assert box.cleanup_command == ["docker", "rm", "-f", name]  # run on stop, and by the reaper
    with pytest.raises(ValueError, match="pin"):
        TGIContainer("m", image="ghcr.io/huggingface/text-generation-inference:latest")


def test_chat_response_format_becomes_a_grammar():
    from lab_utils.tgi.chat import _grammar

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert _grammar({"type": "json", "value": schema}) == {"type": "json", "value": schema}
    assert _grammar({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}) == {
        "type": "json",
        "value": schema,
    }
    assert _grammar(None) is None
