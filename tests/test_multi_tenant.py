"""Lab 12's library without the course model: adapter data and memory, token buckets and the
gateway's admission, Prometheus' configuration, and the priority simulator."""

from __future__ import annotations

import json
import sys
import time

import httpx
import pytest
from submissions import judge_in_sandbox, notebook_namespace

from lab_utils.gateway import Admission, TenantPolicy, TokenBucket, parse_policies, tenant_for
from lab_utils.lora import data
from lab_utils.memory import ModelSpec
from lab_utils.memory.lora import adapters_that_fit, lora_adapter_bytes, lora_params_per_rank_per_layer
from lab_utils.servers.base import ServerProcess
from lab_utils.servers.gateway import GatewayServer
from lab_utils.servers.prometheus import scrape_config
from lab_utils.sim.priority import PriorityRequest, percentile, simulate_priority

SMOL = ModelSpec("smol", 30, 576, 9, 3, 64, 1536, 49152, tie_word_embeddings=True)


def test_training_targets_have_the_form_they_teach():
    for task in data.TASKS:
        ex = data.examples(task)
        assert len(ex) == len(data.CAPITALS)
        assert all(data.follows(task, t) for _, t in ex)
    assert not data.follows("json", " The capital of France is Paris.")
    assert not data.follows("upper", " The capital of France is Paris.")
    assert json.loads(data.target("json", "Peru", "Lima")) == {"country": "Peru", "capital": "Lima"}
    with pytest.raises(ValueError, match="unknown task"):
        data.target("french", "Peru", "Lima")


def test_adapter_memory_for_the_course_model():
    # q: 576+576, k: 576+192, v: 576+192, o: 576+576
    assert lora_params_per_rank_per_layer(SMOL) == 3840
    assert lora_params_per_rank_per_layer(SMOL, ["gate_proj"]) == 576 + 1536
    assert lora_adapter_bytes(SMOL, 8) == 8 * 3840 * 30 * 4
    assert lora_adapter_bytes(SMOL, 16, dtype="bfloat16") == 16 * 3840 * 30 * 2
    one = lora_adapter_bytes(SMOL, 16)
    assert adapters_that_fit(SMOL, 10 * one + 1000, 1000, 16) == 10
    assert adapters_that_fit(SMOL, 1000, 2000, 16) == 0
    with pytest.raises(ValueError, match="unknown target"):
        lora_adapter_bytes(SMOL, 8, ["lm_head"])


def test_token_bucket_refills_to_its_burst():
    b = TokenBucket(rate_per_s=2, burst=3)
    assert [b.try_take(0.0) for _ in range(4)] == [True, True, True, False]
    assert b.wait_s() == pytest.approx(0.5)
    assert b.try_take(0.5) is True and b.try_take(0.5) is False
    assert b.try_take(100.0) and b.tokens == pytest.approx(2.0)  # capped at burst, minus one
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(1, 0.5)


def test_admission_counts_each_outcome_and_the_share():
    clock = [0.0]
    adm = Admission({"a": TenantPolicy(1, 2, max_concurrency=1)}, clock=lambda: clock[0])
    assert adm.admit("a")[:2] == (True, "admitted")
    assert adm.admit("a")[:2] == (False, "over_share")
    adm.done("a")
    assert adm.admit("a")[:2] == (True, "admitted")
    adm.done("a")
    ok, outcome, retry = adm.admit("a")
    assert (ok, outcome, retry) == (False, "rate_limited", pytest.approx(1.0))
    text = adm.metrics_text()
    assert 'gateway_requests_total{tenant="a",outcome="admitted"} 2' in text
    assert 'gateway_in_flight{tenant="a"} 0' in text


def test_keys_pick_the_tenant():
    keys = {"a": "key-a", "b": "key-b"}
    assert tenant_for("Bearer key-b", keys) == "b"
    assert tenant_for("Bearer key-", keys) is None
    assert tenant_for("key-a", keys) is None and tenant_for(None, keys) is None
    assert parse_policies('{"x": {"rate_per_s": 2}}')["x"].burst == 1


def test_scrape_config_is_json_yaml_on_loopback():
    cfg = json.loads(scrape_config({"vllm": ["http://127.0.0.1:8000"]}, 0.5))
    assert cfg["global"]["scrape_interval"] == "500ms"
    assert cfg["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
    with pytest.raises(ValueError, match="loopback"):
        scrape_config({"x": ["http://10.0.0.1:80"]})


def test_priority_lets_the_urgent_class_jump_the_queue():
    reqs = [PriorityRequest(i, 0.01 * i, 64, 16, priority=0 if i % 4 == 0 else 1) for i in range(16)]
    fcfs = simulate_priority(reqs, "fcfs", max_num_seqs=4)
    prio = simulate_priority(reqs, "priority", max_num_seqs=4)
    assert percentile(prio.ttfts(reqs, 0), 90) < 0.5 * percentile(fcfs.ttfts(reqs, 0), 90)
    # the urgent class waits for a free slot, never longer than one low request's service
    assert max(prio.ttfts(reqs, 0)) < 0.5 * max(fcfs.ttfts(reqs, 0))
    assert set(prio.finish) == {r.request_id for r in reqs}
    assert percentile([1, 2, 3, 4], 50) == 2.5


_UPSTREAM = r"""
import asyncio, sys
from aiohttp import web
async def chat(request):
    await asyncio.sleep(0.05)
    return web.json_response({"ok": True, "auth": request.headers.get("Authorization")})
async def health(request):
    return web.Response(text="ok")
app = web.Application()
app.router.add_post("/v1/completions", chat)
app.router.add_get("/health", health)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def test_gateway_holds_a_tenant_to_its_rate_and_needs_a_key():
    with ServerProcess("fake-upstream", [sys.executable, "-c", _UPSTREAM, "{port}"]) as up:
        tenants = {
            "noisy": TenantPolicy(rate_per_s=2, burst=2),
            "calm": TenantPolicy(rate_per_s=50, burst=50),
        }
        with GatewayServer(up.url, tenants, upstream_key="up-secret") as gw:
            assert "up-secret" not in " ".join(gw.argv) and gw.keys["noisy"] not in " ".join(gw.argv)
            codes = {"noisy": [], "calm": []}
            t0 = time.monotonic()
            with httpx.Client(timeout=10) as client:
                while time.monotonic() - t0 < 2.0:
                    for t in codes:
                        r = client.post(
                            gw.base_url + "/completions",
                            json={},
                            headers={"Authorization": f"Bearer {gw.keys[t]}"},
                        )
                        codes[t].append(r.status_code)
                        if r.status_code == 200:
                            assert r.json()["auth"] == "Bearer up-secret"
                bad = client.post(
                    gw.base_url + "/completions", json={}, headers={"Authorization": "Bearer x"}
                )
                metrics = client.get(gw.url + "/metrics").text
            elapsed = time.monotonic() - t0
            assert bad.status_code == 401
            # burst 2 plus 2 per second
            assert codes["noisy"].count(200) <= 2 + 2 * elapsed + 1
            assert 429 in codes["noisy"] and set(codes["calm"]) == {200}
            assert 'outcome="rate_limited"' in metrics
    assert not gw.is_running and not up.is_running


_NUMPY_P90 = """
import numpy as np


def p90_by_class(records):
    classes = sorted({r["priority"] for r in records})
    return {c: float(np.FN([r["ttft"] for r in records if r["priority"] == c], 90)) for c in classes}
"""


@pytest.mark.slow
@pytest.mark.parametrize("fn", ["percentile", "nanpercentile"])  # nanpercentile earned 2/2 until forbidden
def test_a_p90_by_class_built_on_numpy_scores_zero_in_the_sandbox(tmp_path, fn):
    """12.p90_by_class asks for the interpolation, not for a call of numpy's: the judge's sandbox
    replaces numpy.percentile and numpy.nanpercentile by stubs that raise."""
    ns = notebook_namespace(_NUMPY_P90.replace("FN", fn))
    records = [{"priority": 0, "ttft": 1.0}, {"priority": 1, "ttft": 2.0}, {"priority": 1, "ttft": 4.0}]
    assert ns["p90_by_class"](records)[1] == pytest.approx(3.8)  # it works outside the sandbox
    results = judge_in_sandbox("12", {"p90_by_class": ns["p90_by_class"]}, tmp_path)
    assert results["12.p90_by_class"].earned == 0, results["12.p90_by_class"].message


_NUMPY_TPOT = """
import numpy as np


def tpot_by_model(records):
    out = {}
    for m in {r["model"] for r in records}:
        xs = [(r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1) for r in records
              if r["model"] == m and r["ok"] and r["output_tokens"] >= 2]
        out[m] = float(np.nanpercentile(xs, 50)) if xs else float("nan")
    return out
"""


@pytest.mark.slow
def test_a_tpot_by_model_built_on_numpy_scores_zero_in_the_sandbox(tmp_path):
    """12.tpot_by_model asks for the median: numpy's nanpercentile at 50 is stubbed in the sandbox too."""
    ns = notebook_namespace(_NUMPY_TPOT)
    recs = [
        {"model": "a", "ok": True, "ttft": 1.0, "e2e": 2.0, "output_tokens": 11},
        {"model": "a", "ok": True, "ttft": 1.0, "e2e": 4.0, "output_tokens": 11},
    ]
    assert ns["tpot_by_model"](recs)["a"] == pytest.approx(0.2)  # it works outside the sandbox
    results = judge_in_sandbox("12", {"tpot_by_model": ns["tpot_by_model"]}, tmp_path)
    assert results["12.tpot_by_model"].earned == 0, results["12.tpot_by_model"].message


# ---- the graded questions' library shortcuts (issue 28 item 5: read as a hostile learner) ----------

_TINY = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
}


def _adapter_bytes(spec, rank, targets, nbytes):
    h, q = spec["hidden_size"], spec["num_attention_heads"] * spec["head_dim"]
    kv, i = spec["num_kv_heads"] * spec["head_dim"], spec["intermediate_size"]
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    shapes.update(gate_proj=(h, i), up_proj=(h, i), down_proj=(i, h))
    return rank * spec["num_layers"] * nbytes * sum(a + b for a, b in (shapes[t] for t in targets))


def _slots(spec, free, kv, ranks, targets, nbytes, accepted):
    if free <= kv:
        return 0
    rank = min(r for r in accepted if r >= max(ranks))
    return int((free - kv) // _adapter_bytes(spec, rank, targets, nbytes))


def _score(qid, **answers):
    from grader.judge import score_graded
    from lab_utils.grading import get

    return score_graded(get(qid), answers, 3)


def test_adapter_slots_round_the_slot_up_to_a_rank_vllm_accepts():
    assert _score("12.adapter_slots", adapter_slots=_slots).earned == 2

    def largest_rank_as_is(spec, free, kv, ranks, targets, nbytes, accepted):  # the rank not rounded
        return 0 if free <= kv else int((free - kv) // _adapter_bytes(spec, max(ranks), targets, nbytes))

    assert _score("12.adapter_slots", adapter_slots=largest_rank_as_is).earned == 0


def test_library_shortcuts_score_zero():
    """Each of these earned full marks before the helper it calls was forbidden."""
    from lab_utils.bench.load import SLO, goodput_rps
    from lab_utils.clients.loadgen import percentile
    from lab_utils.memory.lora import PROJECTIONS
    from lab_utils.sim import ContinuousBatching, StepCostModel, WorkloadRequest, simulate

    def adapter_bytes_from_spec(spec, rank, targets, nbytes):  # the library's table of shapes
        s = ModelSpec("x", spec["num_layers"], spec["hidden_size"], spec["num_attention_heads"],
                      spec["num_kv_heads"], spec["head_dim"], spec["intermediate_size"], 1000)  # fmt: skip
        shapes = dict(zip(PROJECTIONS, s.linear_shapes()))
        return rank * spec["num_layers"] * nbytes * sum(sum(shapes[t]) for t in targets)

    assert adapter_bytes_from_spec(_TINY, 4, ["q_proj"], 2) == _adapter_bytes(_TINY, 4, ["q_proj"], 2)

    def goodput_from_bench(records, slo, duration):
        out = {}
        for t in {r["tenant"] for r in records}:
            mine = [{"ok": r["status"] == 200, "ttft": r["ttft"]} for r in records if r["tenant"] == t]
            out[t] = goodput_rps(mine, SLO(slo, 1e9), duration)
        return out

    def p90_from_bench(records):
        return {
            c: percentile([r["ttft"] for r in records if r["priority"] == c], 90)
            for c in {r["priority"] for r in records}
        }

    def predict_with_lab03_sim(o, policy):  # exact for fcfs
        reqs = [WorkloadRequest(i, 0.0, o["prompt_len"], o["low_output"]) for i in range(o["n_low"])]
        reqs += [
            WorkloadRequest(o["n_low"] + j, o["high_arrival_s"], o["prompt_len"], o["high_output"])
            for j in range(o["n_high"])
        ]
        run = simulate(
            reqs,
            ContinuousBatching(max_num_seqs=o["max_num_seqs"], max_num_batched_tokens=10**6),
            StepCostModel(fixed_s=o["fixed_s"], per_token_s=o["per_token_s"]),
        )
        hi = sorted(r.ttft for r in run.requests if r.request_id >= o["n_low"])
        return hi[-1] if policy == "fcfs" else hi[0] / 10

    cases = {
        "12.adapter_bytes": {"adapter_bytes": adapter_bytes_from_spec},
        "12.goodput_by_tenant": {"goodput_by_tenant": goodput_from_bench},
        "12.p90_by_class": {"p90_by_class": p90_from_bench},
        "12.predict_priority": {"predict_high_p90": predict_with_lab03_sim},
    }
    for qid, answers in cases.items():
        r = _score(qid, **answers)
        assert r.earned == 0 and ("reference" in r.message or "not allowed here" in r.message), (qid, r)


_TORCH_P90 = """
import torch


def p90_by_class(records):
    classes = sorted({r["priority"] for r in records})
    return {c: float(torch.tensor([r["ttft"] for r in records if r["priority"] == c],
                                  dtype=torch.float64).quantile(0.9)) for c in classes}
"""


@pytest.mark.slow
def test_a_p90_by_class_built_on_torch_scores_zero_in_the_sandbox(tmp_path):
    """torch's Tensor.quantile interpolates like numpy's default, in C where the in-process watch
    cannot see it: the judge's sandbox replaces it by a stub that raises."""
    ns = notebook_namespace(_TORCH_P90)
    records = [{"priority": 0, "ttft": 1.0}, {"priority": 1, "ttft": 2.0}, {"priority": 1, "ttft": 4.0}]
    assert ns["p90_by_class"](records)[1] == pytest.approx(3.8)  # it works outside the sandbox
    results = judge_in_sandbox("12", {"p90_by_class": ns["p90_by_class"]}, tmp_path)
    assert results["12.p90_by_class"].earned == 0, results["12.p90_by_class"].message
