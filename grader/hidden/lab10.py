"""Lab 10: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab10`.
"""

from __future__ import annotations

import copy
import random

from grader.registry import hidden
from lab_utils.grading.questions.lab10 import _builds, _close, _runs

_GPUS = ["L4", "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H200"]


@hidden("10.hit_fraction")
def _(predict_hit_fraction, predicted_gain, rng, scenario):
    from lab_utils.routing import reference_hit_fraction

    wrong = 0
    for _ in range(30):
        pol = rng.choice(["round_robin", "consistent_hash", "cache_aware", "random"])
        t, r, n = rng.randint(1, 40), rng.randint(1, 16), rng.randint(1, 12)
        wrong += not _close(predict_hit_fraction(pol, t, r, n), reference_hit_fraction(pol, t, r, n), 1e-6)
    assert not wrong, f"wrong on {wrong} of 30 unseen (policy, tenants, replicas, requests) cases"
    t, r, n = scenario["num_tenants"], scenario["num_replicas"], scenario["requests_per_tenant"]
    want = reference_hit_fraction("consistent_hash", t, r, n) - reference_hit_fraction("round_robin", t, r, n)
    assert _close(predicted_gain, want, 0.01), (
        "predicted_gain is not the difference for this lab's scenario (within 0.01)"
    )


@hidden("10.routing_measured")
def _(routing_runs, best_policy, rng, scenario):
    from lab_utils.routing import RoutingRun

    runs = _runs(routing_runs)
    rates = {}
    for name, run in runs.items():
        again = RoutingRun.from_raw(run.raw_samples())
        if again.policy != name or again.load.summary.num_ok < 1:
            raise AssertionError(f"routing_runs[{name!r}] is not a completed run of that policy")
        rates[name] = again.hit_rate
    assert str(best_policy) == max(rates, key=lambda k: (rates[k], k)), (
        "best_policy is not the policy with the highest measured hit rate"
    )


def _ref_tp(heads: int, kv: int, node: int) -> list[int]:
    return [t for t in range(1, node + 1) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]


@hidden("10.valid_tp")
def _(valid_tp_degrees, rng, scenario):
    wrong = 0
    for _ in range(25):
        kv = rng.choice([1, 2, 4, 5, 8, 16, 3, 6])
        heads = kv * rng.choice([1, 2, 3, 4, 5, 7, 8])
        node = rng.choice([2, 4, 8, 16])
        wrong += [int(t) for t in valid_tp_degrees(heads, kv, node)] != _ref_tp(heads, kv, node)
    assert not wrong, f"wrong on {wrong} of 25 unseen (heads, KV heads, node size) cases"


def _random_spec(rng: random.Random):
    from lab_utils.drills.shapes import MODELS
    from lab_utils.memory import ModelSpec

    base = MODELS[rng.choice(sorted(MODELS))]
    if rng.random() < 0.5:
        return base
    kv = rng.choice([4, 8])
    heads = kv * rng.choice([4, 5, 6, 8])
    hidden_size = heads * 128
    return ModelSpec(
        f"synthetic-{heads}h",
        rng.choice([24, 32, 40, 48, 60, 80]),
        hidden_size,
        heads,
        kv,
        128,
        hidden_size * rng.choice([3, 4]),
        rng.choice([32000, 128256]),
    )


@hidden("10.planner")
def _(plan_parallelism, rng, scenario):
    from lab_utils.deploy.parallel import reference_plan

    wrong = total = 0
    for _ in range(12):
        spec = _random_spec(rng)
        gpu = rng.choice(_GPUS)
        slo = {
            "max_model_len": rng.choice([2048, 4096, 8192, 32768]),
            "concurrent_requests": rng.choice([1, 8, 32, 100, 256]),
            "gpus_per_node": rng.choice([4, 8]),
        }
        try:
            want = reference_plan(spec, gpu, slo)
        except ValueError:
            continue
        total += 1
        got = tuple(int(v) for v in plan_parallelism(spec, gpu, dict(slo)))
        wrong += got != want
    if wrong:
        raise AssertionError(f"wrong on {wrong} of {total} unseen (model, GPU, SLO) cases")


@hidden("10.fix_manifest")
def _(manifest_faults, fix_manifest, rng, scenario):
    from lab_utils.deploy.manifests import break_deployment, deployment_problems, kept_settings

    found = fixed_ok = 0
    n = 10
    for _ in range(n):
        doc, faults = break_deployment(rng)
        found += {str(f) for f in manifest_faults(copy.deepcopy(doc))} == faults
        fixed = fix_manifest(copy.deepcopy(doc))
        fixed_ok += not deployment_problems(fixed) and not kept_settings(doc, fixed)
    frac = (found + fixed_ok) / (2 * n)
    if frac == 0:
        raise AssertionError(
            f"no fault named exactly and no manifest repaired on {n} unseen broken manifests"
        )
    return None if frac == 1 else frac


def _random_old(rng: random.Random) -> dict:
    old = {}
    if rng.random() < 0.9:
        old["gpu"] = rng.choice(
            [
                "A10G",
                "L4",
                {
                    "type": rng.choice(["A100", "H100", "L40S"]),
                    "count": rng.choice([1, 2, 4, 8]),
                    "size": rng.choice([None, "80GB"]),
                },
            ]
        )
        if isinstance(old["gpu"], dict) and old["gpu"]["type"] != "A100":
            old["gpu"]["size"] = None
    for key, values in (
        ("container_idle_timeout", [60, 120, 300, 900]),
        ("allow_concurrent_inputs", [8, 16, 100]),
        ("keep_warm", [0, 1, 2]),
        ("concurrency_limit", [2, 5, 10]),
        ("timeout", [600, 3600]),
        ("memory", [8192, 32768]),
    ):
        if rng.random() < 0.6:
            old[key] = rng.choice(values)
    if old.get("keep_warm") and old.get("concurrency_limit") and old["keep_warm"] > old["concurrency_limit"]:
        old["keep_warm"] = old["concurrency_limit"]
    return old


@hidden("10.modal_upgrade")
def _(modernize_modal, rng, scenario):
    from lab_utils.deploy.modal_app import reference_modernize

    wrong = 0
    cases = [scenario["modal_old"]] + [_random_old(rng) for _ in range(14)]
    for old in cases:
        new = modernize_modal(copy.deepcopy(old))
        want = reference_modernize(old)
        ok = (
            isinstance(new, dict)
            and dict(new.get("function") or {}) == want["function"]
            and (new.get("concurrent") or None) == want["concurrent"]
        )
        if ok:
            try:
                _builds(new)
            except Exception:
                ok = False
        wrong += not ok
    assert not wrong, f"wrong on {wrong} of {len(cases)} unseen argument sets"
