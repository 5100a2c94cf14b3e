"""Lab 10 — choosing and deploying: routing predicted then measured through vLLM's router, tensor-
parallel degrees and a parallelism planner graded on unseen models, a broken Kubernetes manifest
found and fixed (graded by kubernetes-validate and by behaviour on unseen broken copies), and the
seeds' Modal arguments rewritten for today's API (graded by Modal itself, offline).

Every answer is a function. The routing measurement is graded as an analysis: `routing_report`
on counter snapshots and TTFTs the hidden check makes up, `best_policy` on made-up reports; the real
run fills the lab's table through them.
"""

from __future__ import annotations

import copy
import random

from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import limits, question, scenario

POLICIES = ("round_robin", "consistent_hash", "cache_aware")


# graded as submitted (LIGHT = False): the kernel and its vLLM server(s), proportional set size
limits("10", memory_mb=12288, timeout=1800)


@scenario("10")
def _(rng):
    """The tenants of the routing run, the model and SLO to plan for, and the pools to simulate."""
    return {
        "num_tenants": rng.choice([6, 8, 10, 12]),
        "requests_per_tenant": rng.choice([2, 3, 4]),
        "num_replicas": 2,
        "plan": {
            "model": rng.choice(["Llama-3-8B", "Qwen2.5-14B", "Llama-3-70B", "Qwen2.5-72B"]),
            "gpu": rng.choice(["L40S", "A100-80GB", "H100-80GB"]),
            "max_model_len": rng.choice([4096, 8192, 16384]),
            "concurrent_requests": rng.choice([16, 32, 64, 128]),
        },
        "pools": {
            "num_gpus": rng.choice([4, 6]),
            "rate": rng.choice([6.0, 8.0, 10.0]),
            "prompt_len": rng.choice([2000, 3000, 4000]),
            "output_len": rng.choice([128, 256]),
            "link_gb_s": rng.choice([12.5, 25.0, 50.0]),
        },
        "manifest_seed": rng.randint(0, 10_000),
        "modal_old": {
            "gpu": rng.choice(
                [
                    {"type": "A100", "count": rng.choice([1, 2]), "size": rng.choice(["80GB", None])},
                    {"type": "H100", "count": rng.choice([1, 2]), "size": None},
                ]
            ),
            "container_idle_timeout": rng.choice([120, 300, 600]),
            "allow_concurrent_inputs": rng.choice([16, 32, 64]),
            "keep_warm": rng.choice([0, 1]),
            "timeout": 3600,
        },
    }


def _close(a: float, b: float, tol: float) -> bool:
    return abs(float(a) - float(b)) <= tol


# --- 10.hit_fraction (predict, then measure) -----------------------------------------------------


@question(
    "10.hit_fraction",
    points=2,
    answers=["predict_hit_fraction", "predicted_gain"],
    predict=True,  # the model's reference lives in grader/hidden/lab10.py: nothing in lab_utils computes it
)
def _(predict_hit_fraction, predicted_gain):
    """Expected share of requests that find their tenant's prefix cached, per policy; and the gain
    of consistent_hash over round_robin for a scenario dict."""
    rr = float(predict_hit_fraction("round_robin", 8, 2, 3))
    ch = float(predict_hit_fraction("consistent_hash", 8, 2, 3))
    assert 0 <= rr <= 1 and 0 <= ch <= 1, "a fraction of requests lies between 0 and 1"
    assert ch > rr, "a policy that keeps a tenant on one replica pays fewer cold prefills"
    assert _close(predict_hit_fraction("round_robin", 8, 1, 3), ch, 1e-9), (
        "with one replica every policy sends a tenant to the same place"
    )
    g = float(predicted_gain({"num_tenants": 8, "num_replicas": 2, "requests_per_tenant": 3}))
    assert 0 < g < 1, "predicted_gain(scenario) is a difference of two fractions"
    assert _close(predicted_gain({"num_tenants": 8, "num_replicas": 1, "requests_per_tenant": 3}), 0, 1e-9), (
        "one replica: nothing to gain"
    )


# --- 10.routing_measured --------------------------------------------------------------------------


@question(
    "10.routing_measured",
    points=2,
    answers=["routing_report", "best_policy"],
    forbid=refs("routing_run", "percentiles", "percentile_summaries"),
)
def _(routing_report, best_policy):
    """routing_report(before, after, ttfts) -> {"hit_rate", "replica_share", "ttft_p95"};
    best_policy(reports, ttft_slo_s) -> the policy name, or None."""
    r = routing_report([[0.0, 0.0], [0.0, 0.0]], [[30.0, 100.0], [10.0, 100.0]], [0.1, 0.2, None])
    r = dict(r)
    assert set(r) == {"hit_rate", "replica_share", "ttft_p95"}, (
        "return {'hit_rate': ..., 'replica_share': [...], 'ttft_p95': ...}"
    )
    share = [float(x) for x in r["replica_share"]]
    assert len(share) == 2 and _close(sum(share), 1.0, 1e-9), (
        "one share per replica; together all the traffic"
    )
    assert 0 < float(r["hit_rate"]) < 1 and 0.1 <= float(r["ttft_p95"]) <= 0.2, (
        "a rate over both replicas, and a p95 among the requests that got a first token"
    )
    reports = {
        "a": {"hit_rate": 0.2, "replica_share": [0.5, 0.5], "ttft_p95": 0.5},
        "b": {"hit_rate": 0.6, "replica_share": [0.5, 0.5], "ttft_p95": 0.4},
    }
    assert str(best_policy(dict(reports), 1.0)) == "b", "the most prefix-cache hits, within the SLO"


# --- 10.valid_tp ------------------------------------------------------------------------------------


@question(
    "10.valid_tp",
    points=2,
    answers=["valid_tp_degrees"],
    forbid=refs("tp_checks", "kv_heads"),
)
def _(valid_tp_degrees):
    """Tensor-parallel degrees vLLM accepts for a model, within one NVLink domain."""
    got = [int(t) for t in valid_tp_degrees(32, 8, 8)]
    assert got == sorted(set(got)) and got[0] == 1, "an ascending list of distinct degrees, starting at 1"
    assert max(got) <= 8, "tensor parallelism stays inside one NVLink domain"
    assert 3 not in got, "32 heads on 3 GPUs: what would each GPU compute?"
    small = [int(t) for t in valid_tp_degrees(9, 3, 8)]
    assert 9 not in small and 2 not in small, "think about the course model's 9 query and 3 KV heads"


# --- 10.planner ---------------------------------------------------------------------------------------


@question(
    "10.planner",
    points=3,
    answers=["plan_parallelism"],
    forbid=refs("tp_checks"),
)
def _(plan_parallelism):
    """(TP, PP, replicas) for a model, a GPU and an SLO: the fewest GPUs that hold the load."""
    from lab_utils.deploy.parallel import per_gpu_memory
    from lab_utils.drills.shapes import MODELS

    spec = MODELS["Llama-3-8B"]
    tp, pp, n = (
        int(v)
        for v in plan_parallelism(spec, "H100-80GB", {"max_model_len": 8192, "concurrent_requests": 16})
    )
    assert tp >= 1 and pp >= 1 and n >= 1, "three whole numbers, each at least 1"
    assert per_gpu_memory(spec, "H100-80GB", tp, pp).concurrency(8192) * n >= 16, (
        "the replicas together must hold every concurrent request"
    )
    big = MODELS["Llama-3-70B"]
    tp2, pp2, _ = (
        int(v) for v in plan_parallelism(big, "L40S", {"max_model_len": 8192, "concurrent_requests": 8})
    )
    assert tp2 * pp2 > 1 and tp2 <= 8, "a 70B model in bf16 does not fit one 48 GB GPU; TP stays in the node"


# --- 10.fix_manifest -------------------------------------------------------------------------------


@question("10.fix_manifest", points=3, answers=["manifest_faults", "fix_manifest"])
def _(manifest_faults, fix_manifest):
    """Name the faults of a broken vLLM Deployment, and return a repaired copy."""
    from lab_utils.deploy.manifests import FAULTS, break_deployment, deployment_problems, kept_settings

    for seed in (0, 1):
        doc, _faults = break_deployment(random.Random(seed))
        named = {str(f) for f in manifest_faults(copy.deepcopy(doc))}
        assert named <= set(FAULTS), "name faults with the keys of lab_utils.deploy.manifests.FAULTS"
        assert named, "a broken manifest has at least one fault"
        fixed = fix_manifest(copy.deepcopy(doc))
        assert not deployment_problems(fixed), (
            "the repaired Deployment still fails the validator or a behaviour check"
        )
        assert not kept_settings(doc, fixed), (
            "repair the faults; keep the name, replica count and model arguments"
        )


# --- 10.modal_upgrade ---------------------------------------------------------------------------------


def _builds(new: dict) -> bool:
    """True when Modal 1.6 accepts the new arguments (offline construction, nothing deployed)."""
    import modal

    app = modal.App("lab10-check")

    def f():
        return None

    fn_kwargs = dict(new.get("function") or {})
    wrapped = f
    if new.get("concurrent"):
        wrapped = modal.concurrent(**new["concurrent"])(wrapped)
    app.function(serialized=True, **fn_kwargs)(wrapped)
    return True


@question(
    "10.modal_upgrade",
    points=2,
    answers=["modernize_modal"],
    # the reference rewrite and its GPU string are the grader's (grader/hidden/lab10.py), not in lab_utils
)
def _(modernize_modal):
    """The seeds' @app.function arguments rewritten for Modal 1.6."""
    old = {
        "gpu": {"type": "A100", "count": 2, "size": "80GB"},
        "container_idle_timeout": 300,
        "allow_concurrent_inputs": 32,
    }
    new = modernize_modal(copy.deepcopy(old))
    assert set(new) == {"function", "concurrent"}, "return {'function': {...}, 'concurrent': {...} or None}"
    assert isinstance(new["function"].get("gpu"), str), "Modal 1.x takes the GPU as a string"
    assert "container_idle_timeout" not in new["function"], "that parameter was renamed"
    try:
        _builds(new)
    except Exception as exc:
        raise AssertionError(f"Modal refused the new arguments: {type(exc).__name__}") from None
