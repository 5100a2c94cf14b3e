"""Lab 10's offline pieces: parallelism planning, disaggregated pools on the simulator, the replica
manifests (valid, and broken copies fail), compose behaviour checks, the Modal app built offline,
the routing model, the framework table, and lab 10's graded questions (right answers pass under
any seed, stubs and memorised answers do not). No server here; tests/test_router.py has those."""

from __future__ import annotations

import copy
import random

import pytest

from grader.hidden.lab10 import _expected_distinct, reference_hit_fraction, reference_plan
from lab_utils.deploy.compose import check_all, service_problems
from lab_utils.deploy.disagg import colocated, compare_pools, disaggregated
from lab_utils.deploy.frameworks import ALTERNATIVES, decision_table
from lab_utils.deploy.manifests import (
    FAULTS,
    REPLICAS_DIR,
    break_deployment,
    deployment_problems,
    kept_settings,
    replica_deployment,
    validate_replica_files,
)
from lab_utils.deploy.parallel import bubble_fraction, parallel_problems, per_gpu_memory
from lab_utils.drills.shapes import MODELS
from lab_utils.memory import ModelSpec
from lab_utils.routing import RoutingRun, tenant_workload
from lab_utils.sim import StepCostModel, poisson_workload

COURSE = ModelSpec("SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49152)


# --- parallelism ------------------------------------------------------------------------------------


def test_tp_rules():
    assert parallel_problems(MODELS["Llama-3-8B"], 8) == []
    assert parallel_problems(MODELS["Llama-3-8B"], 16)  # beyond one node
    assert parallel_problems(COURSE, 2)  # 9 heads do not split in two
    assert parallel_problems(COURSE, 3) == [] and parallel_problems(COURSE, 9, gpus_per_node=16) == []
    assert parallel_problems(MODELS["Qwen2.5-7B"], 8)  # 28 heads


def test_memory_splits_and_kv_grows_with_tp():
    spec = MODELS["Llama-3-70B"]
    one, four = per_gpu_memory(spec, "H100-80GB", 1, 1), per_gpu_memory(spec, "H100-80GB", 4, 1)
    assert not one.fits and four.fits
    assert abs(four.weights_bytes * 4 - one.weights_bytes) <= 4
    pp2 = per_gpu_memory(spec, "H100-80GB", 4, 2)
    assert pp2.kv_bytes_per_token * 2 == four.kv_bytes_per_token and pp2.kv_tokens > four.kv_tokens


def test_bubble():
    assert bubble_fraction(1, 4) == 0
    assert bubble_fraction(4, 1) == 0.75
    assert bubble_fraction(4, 64) < bubble_fraction(4, 8)


def test_decode_bubble_vanishes_with_a_batch_per_stage():
    from lab_utils.deploy.parallel import decode_bubble_fraction

    assert decode_bubble_fraction(1, 1) == 0
    assert decode_bubble_fraction(4, 1) == 0.75 and decode_bubble_fraction(4, 2) == 0.5
    assert decode_bubble_fraction(4, 4) == 0 == decode_bubble_fraction(4, 9)


def test_reference_plan_prefers_tp_and_uses_pp_only_past_a_node():
    slo = {"max_model_len": 8192, "concurrent_requests": 64}
    assert reference_plan(MODELS["Llama-3-8B"], "H100-80GB", slo) == (1, 1, 2)
    tp, pp, n = reference_plan(MODELS["Llama-3-70B"], "H100-80GB", slo)
    assert pp == 1 and tp in (2, 4, 8)
    big = ModelSpec("405B-like", 126, 16384, 128, 8, 128, 53248, 128256)
    tp, pp, n = reference_plan(big, "H100-80GB", {"max_model_len": 8192, "concurrent_requests": 8})
    assert tp == 8 and pp >= 2
    for plan_gpu in ("L40S", "A100-80GB"):
        tp, pp, n = reference_plan(MODELS["Qwen2.5-14B"], plan_gpu, slo)
        assert per_gpu_memory(MODELS["Qwen2.5-14B"], plan_gpu, tp, pp).concurrency(8192) * n >= 64


# --- disaggregation ---------------------------------------------------------------------------------


def test_disaggregation_flattens_tpot_and_needs_enough_prefill():
    cost = StepCostModel.from_gpu("H100-80GB", 8e9)
    wl = poisson_workload(120, rate=10.0, prompt_len=3000, output_len=128, seed=1)
    link = {"kv_bytes_per_token": 131072, "link_gb_s": 50.0, "kv_capacity_tokens": 400_000}
    out = compare_pools(wl, 4, 2, cost, **link)
    assert out["disaggregated"]["tpot_p95"] < out["colocated"]["tpot_p95"]
    starved = disaggregated(wl, 1, 3, cost, **link)
    assert starved["ttft_p95"] > out["disaggregated"]["ttft_p95"]
    assert colocated(wl, 4, cost)["requests"] == 120


def test_kv_transfer_grows_with_the_prompt_and_shows_in_ttft():
    from lab_utils.deploy.disagg import decode_slots, transfer_seconds

    assert transfer_seconds(4000, 131072, 50.0) == 2 * transfer_seconds(2000, 131072, 50.0)
    cost = StepCostModel.from_gpu("H100-80GB", 8e9)
    wl = poisson_workload(80, rate=5.0, prompt_len=3000, output_len=64, seed=2)
    fast = disaggregated(wl, 2, 2, cost, kv_bytes_per_token=131072, link_gb_s=900.0)
    slow = disaggregated(wl, 2, 2, cost, kv_bytes_per_token=131072, link_gb_s=5.0)
    assert slow["ttft_p50"] - fast["ttft_p50"] > 0.9 * (slow["transfer_p50"] - fast["transfer_p50"])
    # in the pools' comparison itself: twice the prompt, twice the transfer, and TTFT pays it
    longer = disaggregated(
        poisson_workload(80, rate=5.0, prompt_len=6000, output_len=64, seed=2),
        2,
        2,
        cost,
        kv_bytes_per_token=131072,
        link_gb_s=5.0,
    )
    assert longer["transfer_p50"] == pytest.approx(2 * slow["transfer_p50"])
    assert longer["ttft_p50"] - slow["ttft_p50"] > 0.9 * (longer["transfer_p50"] - slow["transfer_p50"])
    # the decode GPU holds whole prompts: its KV capacity bounds the requests it runs at once
    assert decode_slots(wl, 3064 * 10, 64) == 10
    tight = disaggregated(
        wl, 2, 2, cost, kv_bytes_per_token=131072, link_gb_s=50.0, kv_capacity_tokens=3064 * 2
    )
    roomy = disaggregated(wl, 2, 2, cost, kv_bytes_per_token=131072, link_gb_s=50.0)
    assert tight["decode_slots"] == 2 and tight["ttft_p95"] > roomy["ttft_p95"]


# --- manifests --------------------------------------------------------------------------------------


def test_replica_manifests_validate_and_behave():
    problems = validate_replica_files()
    assert set(problems) == {"vllm-replicas.yaml", "vllm-router.yaml"}
    assert all(not p for p in problems.values()), problems
    from lab_utils.bench.manifests import load_documents

    kinds = {d["kind"] for f in REPLICAS_DIR.glob("*.yaml") for d in load_documents(f)}
    assert kinds == {"PersistentVolumeClaim", "Deployment", "Service"}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_is_caught(fault):
    from lab_utils.deploy.manifests import _apply

    doc = replica_deployment()
    _apply(doc, fault, random.Random(0))
    assert deployment_problems(doc), f"{fault} passed the checks"


def test_broken_copies_fail_and_kept_settings():
    rng = random.Random(4)
    for _ in range(6):
        doc, faults = break_deployment(rng)
        assert faults and deployment_problems(doc)
    good = replica_deployment()
    other = copy.deepcopy(good)
    other["spec"]["replicas"] = 9
    assert kept_settings(good, good) == [] and kept_settings(good, other)


def test_broken_manifest_file_fails_strict_cli(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    text = (REPLICAS_DIR / "vllm-replicas.yaml").read_text().replace("readinessProbe:", "readinesProbe:")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    exe = Path(sys.executable).with_name("kubernetes-validate")
    good = subprocess.run(
        [str(exe), "--strict", "--quiet", str(REPLICAS_DIR / "vllm-replicas.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert good.returncode == 0, good.stdout + good.stderr
    out = subprocess.run(
        [str(exe), "--strict", "--quiet", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0


# --- compose ----------------------------------------------------------------------------------------


def test_course_compose_files_pass_and_the_seed_style_fails():
    assert all(not p for p in check_all().values()), check_all()
    seed_style = {
        "image": "vllm/vllm-openai:latest",
        "runtime": "nvidia",
        "environment": {"HUGGING_FACE_HUB_TOKEN": "hf_abc"},
    }
    problems = " ".join(service_problems("vllm", seed_style))
    for word in ("pinned", "runtime", "written into the file", "HF_TOKEN", "healthcheck", "model cache"):
        assert word in problems, word


# --- Modal ------------------------------------------------------------------------------------------


def test_modal_app_is_built_offline_with_todays_api():
    modal = pytest.importorskip("modal")
    from grader.hidden.lab10 import reference_modernize  # the judge's, not in lab_utils
    from lab_utils.deploy.modal_app import build_app, function_report

    app, fn, settings = build_app()
    report = function_report(fn)
    assert report["gpu"] == "H100" and report["web_server"] and report["web_server_port"] == 8000
    assert report["volumes"] == ["/root/.cache/huggingface"] and "huggingface" in report["secrets"][0]
    assert settings.scaledown_window == 300 and settings.max_inputs == 64
    new = reference_modernize(
        {
            "gpu": {"type": "A100", "count": 2, "size": "80GB"},
            "container_idle_timeout": 300,
            "allow_concurrent_inputs": 32,
            "keep_warm": 1,
        }
    )
    assert new == {
        "function": {"gpu": "A100-80GB:2", "scaledown_window": 300, "min_containers": 1},
        "concurrent": {"max_inputs": 32},
    }
    app2 = modal.App("old-names")
    with pytest.raises(modal.exception.DeprecationError):
        app2.function(container_idle_timeout=300)(lambda: None)
    with pytest.raises(AttributeError):
        modal.gpu.A100(count=2)


# --- routing model and framework table --------------------------------------------------------------


def test_routing_model():
    assert _expected_distinct(1, 2) == 1 and abs(_expected_distinct(2, 2) - 1.5) < 1e-12
    assert reference_hit_fraction("consistent_hash", 8, 2, 3) == pytest.approx(2 / 3)
    assert reference_hit_fraction("round_robin", 8, 2, 3) == pytest.approx((3 - 1.75) / 3)
    assert reference_hit_fraction("round_robin", 8, 1, 3) == reference_hit_fraction("cache_aware", 8, 1, 3)


def test_tenant_workload_shapes():
    wl = tenant_workload(4, 10, seed=3)
    assert len(wl) == 10 and {w.tenant for w in wl} == {f"tenant-{i}" for i in range(4)}
    systems = {w.tenant: w.messages[0]["content"] for w in wl}
    assert all(w.messages[0]["content"] == systems[w.tenant] for w in wl)
    assert len({w.messages[1]["content"] for w in wl}) == 10
    assert tenant_workload(4, 10, seed=3) == wl and tenant_workload(4, 10, seed=4) != wl


def test_decision_table_reports_missing_figures():
    rows, missing = decision_table(
        {"05": {"output_tokens_s_at_concurrency_4": {"value": 3.0, "unit": "tok/s"}}}
    )
    assert rows and rows[0]["value"] == 3.0
    assert any("lab 07" in m for m in missing) and any("lab 06" in m for m in missing)
    assert {a["framework"] for a in ALTERNATIVES} >= {"SGLang", "llama.cpp"}
    assert all("20" in a["source"] for a in ALTERNATIVES)  # every fact is dated


def test_routing_run_round_trips_its_raw_samples():
    from lab_utils.clients.loadgen import LoadResult, RequestRecord, summarize

    recs = [RequestRecord(0, 0.0, 0.1, 0.3, [0.1, 0.2, 0.3], 3, 300)]
    load = LoadResult(recs, summarize(recs), 0.0, {"duration_s": 0.3})
    run = RoutingRun("round_robin", ["tenant-0"], load, [[0, 0], [10, 100]], [[100, 300], [10, 100]])
    assert run.replica_hit_rates[0] == pytest.approx(1 / 3) and run.replica_share == [1.0, 0.0]
    again = RoutingRun.from_raw(run.raw_samples())
    assert again.hit_rate == run.hit_rate == pytest.approx(1 / 3)


# --- lab 10's questions -----------------------------------------------------------------------------


def _answers():
    import math

    from lab_utils.deploy.manifests import CACHE_PATH

    def predict_hit_fraction(policy, tenants, replicas, n):
        n = float(n)
        misses = (
            min(1.0, n)
            if policy in ("consistent_hash", "cache_aware")
            else replicas * (1 - (1 - 1 / replicas) ** n)
        )
        return (n - misses) / n

    def valid_tp_degrees(h, kv, node):
        return [t for t in range(1, node + 1) if h % t == 0 and (kv % t == 0 or t % kv == 0)]

    def plan_parallelism(spec, gpu, slo):
        node = slo.get("gpus_per_node", 8)
        tps = valid_tp_degrees(spec.num_attention_heads, spec.num_kv_heads, node)
        best = None
        for tp, pp in [(t, 1) for t in tps] + [(tps[-1], p) for p in range(2, 9)]:
            c = per_gpu_memory(spec, gpu, tp, pp).concurrency(slo["max_model_len"])
            if c < 1:
                continue
            n = math.ceil(slo["concurrent_requests"] / c)
            key = (tp * pp * n, pp, tp * pp)
            best = min(best, (key, (tp, pp, n))) if best else (key, (tp, pp, n))
        return best[1]

    def manifest_faults(doc):
        from lab_utils.deploy.manifests import _container

        c = _container(doc)
        f = set()
        tag = c["image"].rsplit("/", 1)[-1].partition(":")[2]
        f |= {"latest_tag"} if tag in ("", "latest") else set()
        f |= {"gpu_not_in_limits"} if "nvidia.com/gpu" not in c["resources"].get("limits", {}) else set()
        f |= (
            {"token_literal"}
            if any("value" in e for e in c.get("env", []) if e["name"] == "HF_TOKEN")
            else set()
        )
        f |= {"misspelt_probe"} if set(c) & {"readinesProbe", "startUpProbe", "livenesProbe"} else set()
        f |= {"port_as_string"} if isinstance(c["ports"][0]["containerPort"], str) else set()
        f |= (
            {"no_model_cache"}
            if not any(m["mountPath"] == CACHE_PATH for m in c.get("volumeMounts", []))
            else set()
        )
        t = doc["spec"]["template"]["metadata"]["labels"]
        f |= {"selector_mismatch"} if doc["spec"]["selector"]["matchLabels"] != t else set()
        return f

    def fix_manifest(doc):  # a repair of the faults found, nothing else
        out = copy.deepcopy(doc)
        pod = out["spec"]["template"]["spec"]
        c = pod["containers"][0]
        faults = manifest_faults(out)
        if "latest_tag" in faults:
            c["image"] = c["image"].rsplit("/", 1)[0] + "/" + c["image"].rsplit("/", 1)[1].split(":")[0]
            c["image"] += ":v0.32.0"
        if "gpu_not_in_limits" in faults:
            c["resources"].setdefault("limits", {})["nvidia.com/gpu"] = c["resources"]["requests"].pop(
                "nvidia.com/gpu"
            )
        if "token_literal" in faults:
            c["env"] = [e for e in c["env"] if e["name"] != "HF_TOKEN"] + [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}}
            ]
        for bad, good in (
            ("readinesProbe", "readinessProbe"),
            ("startUpProbe", "startupProbe"),
            ("livenesProbe", "livenessProbe"),
        ):
            if bad in c:
                c[good] = c.pop(bad)
        if "port_as_string" in faults:
            c["ports"][0]["containerPort"] = int(c["ports"][0]["containerPort"])
        if "no_model_cache" in faults:
            pod["volumes"].append(
                {"name": "cache", "persistentVolumeClaim": {"claimName": "vllm-model-cache"}}
            )
            c["volumeMounts"].append({"name": "cache", "mountPath": CACHE_PATH})
        if "selector_mismatch" in faults:
            out["spec"]["selector"]["matchLabels"] = dict(out["spec"]["template"]["metadata"]["labels"])
        return out

    def modernize_modal(old):
        names = {
            "container_idle_timeout": "scaledown_window",
            "keep_warm": "min_containers",
            "concurrency_limit": "max_containers",
        }
        fn, conc = {}, None
        for k, v in old.items():
            if k == "gpu" and isinstance(v, dict):
                name = v["type"].upper() + ("-" + v["size"].upper() if v.get("size") else "")
                v = name + (f":{v['count']}" if v.get("count", 1) > 1 else "")
            if k == "allow_concurrent_inputs":
                conc = {"max_inputs": v}
            else:
                fn[names.get(k, k)] = v
        return {"function": fn, "concurrent": conc}

    def predicted_gain(scenario):
        a = (scenario["num_tenants"], scenario["num_replicas"], scenario["requests_per_tenant"])
        return predict_hit_fraction("consistent_hash", *a) - predict_hit_fraction("round_robin", *a)

    def routing_report(before, after, ttfts):
        d = [
            (h1 - h0, q1 - q0) if q1 >= q0 and h1 >= h0 else (h1, q1)
            for (h0, q0), (h1, q1) in zip(before, after)
        ]
        total = sum(q for _, q in d)
        xs = sorted(t for t in ttfts if t is not None)
        pos = (len(xs) - 1) * 0.95
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return {
            "hit_rate": sum(h for h, _ in d) / total,
            "replica_share": [q / total for _, q in d],
            "ttft_p95": xs[lo] + (xs[hi] - xs[lo]) * (pos - lo),
        }

    def best_policy(reports, slo):
        ok = sorted((-r["hit_rate"], r["ttft_p95"], k) for k, r in reports.items() if r["ttft_p95"] <= slo)
        return ok[0][2] if ok else None

    return {
        "predict_hit_fraction": predict_hit_fraction,
        "predicted_gain": predicted_gain,
        "routing_report": routing_report,
        "best_policy": best_policy,
        "valid_tp_degrees": valid_tp_degrees,
        "plan_parallelism": plan_parallelism,
        "manifest_faults": manifest_faults,
        "fix_manifest": fix_manifest,
        "modernize_modal": modernize_modal,
    }


@pytest.mark.parametrize("seed", [0, 123])
def test_right_answers_score_full_and_stubs_zero(seed):
    from grader.judge import score_graded
    from lab_utils.grading import questions_for

    ans = _answers()
    for q in questions_for("10"):
        r = score_graded(q, ans, seed)
        assert r.earned == q.points, (q.id, r)

        def stub(*a, **k):
            raise NotImplementedError

        stubs = {name: stub for name in q.answers}
        assert score_graded(q, stubs, seed).earned == 0, q.id


def test_wrong_analyses_and_plans_fail():
    import math

    from grader.judge import score_graded
    from lab_utils.grading import get

    ans = _answers()
    good = ans["routing_report"]

    def no_restart(before, after, ttfts):  # a restarted replica's counters taken as negative traffic
        r = dict(
            good(
                [[0, 0]] * len(before),
                [[h1 - h0, q1 - q0] for (h0, q0), (h1, q1) in zip(before, after)],
                ttfts,
            )
        )
        return r

    def p95_nearest(before, after, ttfts):
        r = dict(good(before, after, ttfts))
        xs = sorted(t for t in ttfts if t is not None)
        r["ttft_p95"] = xs[min(len(xs) - 1, math.ceil(0.95 * len(xs)) - 1)]
        return r

    def ignores_slo(reports, slo):
        return max(reports, key=lambda k: (reports[k]["hit_rate"], k))

    def no_replication(h, kv, node):
        return [t for t in range(1, node + 1) if h % t == 0 and kv % t == 0]

    for wrong in (
        {"routing_report": no_restart},
        {"routing_report": p95_nearest},
        {"best_policy": ignores_slo},
    ):
        r = score_graded(get("10.routing_measured"), dict(ans, **wrong), 5)
        assert r.earned == 0, (wrong, r)
    assert score_graded(get("10.valid_tp"), dict(ans, valid_tp_degrees=no_replication), 5).earned == 0


def test_library_helpers_that_do_the_work_score_zero():
    """routing_report's p95 from numpy, valid TP degrees from lab 01's recommender: both forbidden;
    and the hit-fraction and planner references are not in lab_utils at all."""
    import types

    import numpy as np

    import lab_utils.deploy.parallel as parallel
    import lab_utils.routing as routing
    from grader.judge import score_graded
    from lab_utils.grading import get
    from lab_utils.memory.recommend import _tp_allowed

    ans = _answers()
    good = ans["routing_report"]

    def numpy_p95(before, after, ttfts):
        r = dict(good(before, after, ttfts))
        r["ttft_p95"] = float(np.percentile([t for t in ttfts if t is not None], 95))
        return r

    assert score_graded(get("10.routing_measured"), dict(ans, routing_report=numpy_p95), 5).earned == 0

    def recommender_tp(h, kv, node):
        spec = types.SimpleNamespace(num_attention_heads=h, num_kv_heads=kv)
        return [t for t in range(1, node + 1) if _tp_allowed(spec, t)]

    assert recommender_tp(32, 8, 8) == ans["valid_tp_degrees"](32, 8, 8)  # it would do the job
    assert score_graded(get("10.valid_tp"), dict(ans, valid_tp_degrees=recommender_tp), 5).earned == 0
    assert not hasattr(routing, "reference_hit_fraction") and not hasattr(routing, "expected_distinct")
    assert not hasattr(parallel, "reference_plan")


def test_a_fresh_correct_deployment_is_no_repair():
    """fix_manifest as the packaged correct Deployment with the broken one's name, replicas, args,
    ports and pinned image pasted in passed every check before the hidden Deployments got settings
    of their own (GPU count, memory, env, probe budget, Secret and claim names): now only the
    fault-naming half scores."""
    from grader.judge import score_graded
    from lab_utils.deploy.manifests import _container, replica_deployment
    from lab_utils.grading import get

    def swapped(doc):
        out = copy.deepcopy(doc)
        c = _container(out)
        args, image = c["args"], c["image"]
        ports = [{"name": "http", "containerPort": int(c["ports"][0]["containerPort"])}]
        out["spec"]["template"]["spec"] = replica_deployment()["spec"]["template"]["spec"]
        g = _container(out)
        g["args"], g["ports"] = args, ports
        if ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"):
            g["image"] = image
        out["spec"]["selector"]["matchLabels"] = dict(out["spec"]["template"]["metadata"]["labels"])
        return out

    ans = _answers()
    q = get("10.fix_manifest")
    for seed in (0, 5):
        assert score_graded(q, ans, seed).earned == q.points
        assert score_graded(q, dict(ans, fix_manifest=swapped), seed).earned <= q.points / 2


def test_router_compose_gives_each_replica_its_own_gpu_and_waits_for_them():
    import yaml

    from lab_utils.deploy.compose import DOCKER_DIR, compose_problems

    path = DOCKER_DIR / "vllm-router-compose.yml"
    doc = yaml.safe_load(path.read_text())
    svcs = doc["services"]
    ids = [
        svcs[r]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for r in ("replica0", "replica1")
    ]
    assert ids == [["0"], ["1"]]
    assert svcs["router"]["depends_on"] == {
        "replica0": {"condition": "service_healthy"},
        "replica1": {"condition": "service_healthy"},
    }
    assert (
        "--prometheus-port" in svcs["router"]["command"][0]
        and "vllm-router==0.1.17" in svcs["router"]["command"][0]
    )
    assert compose_problems(path) == []
    broken = dict(svcs["replica0"])
    broken.pop("deploy")
    broken["runtime"] = "nvidia"
    assert len(service_problems("replica0", broken)) == 2


def test_packaged_replica_deployment_is_the_manifest_file():
    from lab_utils.bench.manifests import load_documents
    from lab_utils.deploy.manifests import REPLICA_FILE

    on_disk = next(d for d in load_documents(REPLICA_FILE) if d["kind"] == "Deployment")
    assert replica_deployment() == on_disk
