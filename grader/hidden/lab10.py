"""Lab 10: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab10`.
"""

from __future__ import annotations

import copy
import random

from grader.registry import hidden
from lab_utils.deploy.modal_app import RENAMED
from lab_utils.deploy.parallel import NODE_GPUS, parallel_problems, per_gpu_memory
from lab_utils.grading.questions.lab10 import _builds, _close

_GPUS = ["L4", "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H200"]


# --- the references (here, not in lab_utils: the learner's package holds neither) ---------------


def _expected_distinct(n: int, k: int) -> float:
    """Expected number of distinct bins hit when n balls fall uniformly into k bins."""
    return k * (1 - (1 - 1 / k) ** n)


def reference_hit_fraction(
    policy: str, num_tenants: int, num_replicas: int, requests_per_tenant: float
) -> float:
    """Expected fraction of requests whose tenant prefix is already on the replica they land on.

    A model, not a measurement: requests of the tenants are interleaved at random, nothing is
    evicted, and prefill of a tenant's first request finishes before its second arrives.
    - `round_robin` and `random` ignore the tenant: each request lands on any replica, so a tenant
      pays one miss per distinct replica its requests touch.
    - `consistent_hash` (on the tenant key) and `cache_aware` send a tenant to one replica: one
      miss per tenant.
    """
    n = float(requests_per_tenant)
    if n <= 0 or num_tenants < 1 or num_replicas < 1:
        raise ValueError("need at least one tenant, one replica and a positive number of requests")
    if policy in ("round_robin", "random", "power_of_two"):
        misses = _expected_distinct(n, num_replicas) if n >= 1 else n
    elif policy in ("consistent_hash", "cache_aware"):
        misses = min(1.0, n)
    else:
        raise ValueError(f"unknown policy {policy!r}")
    return max(0.0, (n - misses) / n)


def reference_plan(spec, gpu: str, slo: dict, *, max_pp: int = 8) -> tuple[int, int, int]:
    """(TP, PP, replicas) serving slo["concurrent_requests"] requests of slo["max_model_len"] tokens.

    Candidates: every allowed TP within one node (slo.get("gpus_per_node", 8)) with PP = 1, and
    PP = 2..max_pp only at the largest allowed TP (pipeline stages cross nodes; inside a node TP
    is better: it cuts per-token latency, PP does not). Among the candidates that hold at least
    one request: the fewest GPUs in total (TP x PP x replicas); ties go to the smaller PP (fewer
    stages each token waits through), then to fewer GPUs per replica (more replicas, smaller
    failure domains).
    """
    length, want = int(slo["max_model_len"]), int(slo["concurrent_requests"])
    node = int(slo.get("gpus_per_node", NODE_GPUS))
    allowed = [tp for tp in range(1, node + 1) if not parallel_problems(spec, tp, 1, node)]
    candidates = [(tp, 1) for tp in allowed] + [(allowed[-1], pp) for pp in range(2, max_pp + 1)]
    best = None
    for tp, pp in candidates:
        if parallel_problems(spec, tp, pp, node):
            continue
        per_replica = per_gpu_memory(spec, gpu, tp, pp).concurrency(length)
        if per_replica < 1:
            continue
        replicas = -(-want // per_replica)
        key = (tp * pp * replicas, pp, tp * pp)
        if best is None or key < best[0]:
            best = (key, (tp, pp, replicas))
    if best is None:
        raise ValueError(
            f"{spec.name} with {length}-token requests fits no TP<={node} x PP<={max_pp} of {gpu}"
        )
    return best[1]


@hidden("10.hit_fraction")
def _(predict_hit_fraction, predicted_gain, rng, scenario):
    wrong = 0
    for _ in range(30):
        pol = rng.choice(["round_robin", "consistent_hash", "cache_aware", "random"])
        t, r, n = rng.randint(1, 40), rng.randint(1, 16), rng.randint(1, 12)
        wrong += not _close(predict_hit_fraction(pol, t, r, n), reference_hit_fraction(pol, t, r, n), 1e-6)
    assert not wrong, f"wrong on {wrong} of 30 unseen (policy, tenants, replicas, requests) cases"
    cases = [dict(scenario)] + [
        {
            "num_tenants": rng.randint(1, 40),
            "num_replicas": rng.randint(1, 16),
            "requests_per_tenant": rng.randint(1, 12),
        }
        for _ in range(14)
    ]
    for c in cases:
        t, r, n = c["num_tenants"], c["num_replicas"], c["requests_per_tenant"]
        want = reference_hit_fraction("consistent_hash", t, r, n) - reference_hit_fraction(
            "round_robin", t, r, n
        )
        wrong += not _close(predicted_gain(dict(c)), want, 1e-6)
    assert not wrong, f"predicted_gain is wrong on {wrong} of {len(cases)} unseen scenarios"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ref_report(before, after, ttfts) -> dict:
    hits, queries = [], []
    for (h0, q0), (h1, q1) in zip(before, after):
        if q1 < q0 or h1 < h0:  # the replica restarted between the snapshots: its counters began again
            h0 = q0 = 0.0
        hits.append(h1 - h0)
        queries.append(q1 - q0)
    total = sum(queries)
    return {
        "hit_rate": sum(hits) / total,
        "replica_share": [q / total for q in queries],
        "ttft_p95": _pct([t for t in ttfts if t is not None], 95),
    }


def _ref_best(reports: dict, slo: float):
    ok = [k for k, r in reports.items() if r["ttft_p95"] <= slo]
    if not ok:
        return None
    return min(ok, key=lambda k: (-reports[k]["hit_rate"], reports[k]["ttft_p95"], k))


@hidden("10.routing_measured")
def _(routing_report, best_policy, rng, scenario):
    wrong, n = 0, 20
    for _ in range(n):
        k = rng.randint(1, 6)
        before, after = [], []
        for _ in range(k):
            q0 = float(rng.randint(0, 50_000))
            h0 = float(rng.randint(0, int(q0)))
            dq = float(rng.randint(1, 20_000))
            dh = float(rng.randint(0, int(dq)))
            if rng.random() < 0.2:  # restarted: the counters count from zero again
                before.append([h0, q0 + dq + 10])
                after.append([dh, dq])
            else:
                before.append([h0, q0])
                after.append([h0 + dh, q0 + dq])
        ttfts = [round(rng.lognormvariate(-1, 0.8), 4) for _ in range(rng.randint(1, 60))]
        ttfts += [None] * rng.randint(0, 3)
        rng.shuffle(ttfts)
        want = _ref_report(before, after, ttfts)
        got = dict(routing_report([list(b) for b in before], [list(a) for a in after], list(ttfts)))
        share = [float(x) for x in list(got.get("replica_share", []))]
        wrong += not (
            set(got) == set(want)
            and _close(got["hit_rate"], want["hit_rate"], 1e-6)
            and _close(got["ttft_p95"], want["ttft_p95"], 1e-6)
            and len(share) == k
            and all(_close(a, b, 1e-6) for a, b in zip(share, want["replica_share"]))
        )
    assert not wrong, f"routing_report is wrong on {wrong} of {n} unseen runs"
    for _ in range(n):
        names = rng.sample(
            ["round_robin", "consistent_hash", "cache_aware", "random", "power_of_two"], rng.randint(1, 5)
        )
        reports = {
            p: {
                "hit_rate": rng.choice([0.1, 0.3, 0.5, 0.5, 0.7]),
                "replica_share": [0.5, 0.5],
                "ttft_p95": rng.choice([0.2, 0.4, 0.8, 1.6]),
            }
            for p in names
        }
        slo = rng.choice([0.3, 0.5, 1.0, 2.0])
        got = best_policy({p: dict(r) for p, r in reports.items()}, slo)
        want = _ref_best(reports, slo)
        wrong += (got is None) != (want is None) or (want is not None and str(got) != want)
    assert not wrong, f"best_policy is wrong on {wrong} of {n} unseen sets of reports"


def _ref_tp(heads: int, kv: int, node: int) -> list[int]:
    return [t for t in range(1, node + 1) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]


@hidden("10.valid_tp")
def _(valid_tp_degrees, rng, scenario):
    wrong = 0
    for _ in range(25):
        kv = rng.choice([1, 2, 4, 5, 8, 16, 3, 6])
        heads = kv * rng.choice([1, 2, 3, 4, 5, 7, 8])
        node = rng.choice([2, 4, 8, 16, 72])
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


def _plan_ok(plan, spec, gpu, slo, want) -> bool:
    """The plan's properties: degrees vLLM accepts, capacity for the load, and no GPU more than the
    reference needs, with no more pipeline stages than it uses (any tie in GPUs per replica passes)."""
    tp, pp, n = plan
    node = int(slo.get("gpus_per_node", 8))
    if tp not in _ref_tp(spec.num_attention_heads, spec.num_kv_heads, node) or not 1 <= pp <= min(
        8, spec.num_layers
    ):
        return False
    if pp > 1 and tp != max(_ref_tp(spec.num_attention_heads, spec.num_kv_heads, node)):
        return False  # pipeline stages cross domains: each stage is a whole domain's TP
    per_replica = per_gpu_memory(spec, gpu, tp, pp).concurrency(int(slo["max_model_len"]))
    if per_replica < 1 or per_replica * n < int(slo["concurrent_requests"]):
        return False
    return tp * pp * n == want[0] * want[1] * want[2] and pp == want[1]


@hidden("10.planner")
def _(plan_parallelism, rng, scenario):
    wrong = total = 0
    for _ in range(14):
        spec = _random_spec(rng)
        gpu = rng.choice(_GPUS)
        slo = {
            "max_model_len": rng.choice([2048, 4096, 8192, 32768]),
            "concurrent_requests": rng.choice([1, 8, 32, 100, 256]),
            "gpus_per_node": rng.choice([4, 8, 8, 72]),
        }
        try:
            want = reference_plan(spec, gpu, slo)
        except ValueError:
            continue
        total += 1
        got = tuple(int(v) for v in plan_parallelism(spec, gpu, dict(slo)))
        wrong += not _plan_ok(got, spec, gpu, slo, want)
    if wrong:
        raise AssertionError(f"wrong on {wrong} of {total} unseen (model, GPU, SLO) cases")


def _leaves(x, path=()):
    """{path: value} for every leaf of a YAML document (lists by index)."""
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            out.update(_leaves(v, (*path, str(k))))
        return out or {path: {}}
    if isinstance(x, list):
        out = {}
        for i, v in enumerate(x):
            out.update(_leaves(v, (*path, i)))
        return out or {path: []}
    return {path: x}


_C = ("spec", "template", "spec", "containers", 0)
_PROBES = {"readinessProbe", "readinesProbe", "startupProbe", "startUpProbe", "livenessProbe", "livenesProbe"}


def _fault_of(path: tuple) -> str | None:
    """The fault whose repair may change this leaf (None: no repair touches it)."""
    if path[: len(_C)] == _C and len(path) > len(_C):
        key = path[len(_C)]
        return {
            "image": "latest_tag",
            "resources": "gpu_not_in_limits",
            "env": "token_literal",
            "ports": "port_as_string",
            "volumeMounts": "no_model_cache",
        }.get(key, "misspelt_probe" if key in _PROBES else None)
    if path[:4] == ("spec", "template", "spec", "volumes"):
        return "no_model_cache"
    if path[:2] == ("spec", "selector"):
        return "selector_mismatch"
    return None


def _changed_beyond(broken: dict, fixed: dict, faults: set) -> bool:
    """True when the repair changed a part of the Deployment that none of its faults is in (a fresh
    copy of a correct Deployment with the name, replicas and args pasted in changes labels, ports,
    image, probes...: it repairs nothing, it replaces)."""
    a, b = _leaves(broken), _leaves(fixed)
    return any(
        _fault_of(p) not in faults for p in set(a) | set(b) if a.get(p, KeyError) != b.get(p, KeyError)
    )


def _vary(doc: dict, faults: set, rng: random.Random) -> dict:
    """Settings no fault touches, made this Deployment's own (a GPU count, a memory limit, a logging
    variable, a startup budget, a shared-memory size, the Secret's and the claim's names), so that a
    repair must keep what it did not need to change. Returns what a repaired copy must still hold."""
    c = doc["spec"]["template"]["spec"]["containers"][0]
    pod = doc["spec"]["template"]["spec"]
    res = c["resources"]
    gpus = str(rng.choice([1, 2, 4]))
    for part in ("limits", "requests"):
        if "nvidia.com/gpu" in (res.get(part) or {}):
            res[part]["nvidia.com/gpu"] = gpus
    memory = rng.choice(["24Gi", "48Gi", "64Gi"])
    res["limits"]["memory"] = memory
    level = rng.choice(["INFO", "DEBUG", "WARNING"])
    c.setdefault("env", []).insert(0, {"name": "VLLM_LOGGING_LEVEL", "value": level})
    budget = rng.choice([30, 90, 120])
    for key in ("startupProbe", "startUpProbe"):
        if key in c:
            c[key]["failureThreshold"] = budget
    shm = rng.choice(["4Gi", "16Gi"])
    for v in pod["volumes"]:
        if v["name"] == "shm":
            v["emptyDir"]["sizeLimit"] = shm
    want = {"gpus": gpus, "memory": memory, "level": level, "budget": budget, "shm": shm}
    if "token_literal" not in faults:
        secret = rng.choice(["hf-token-prod", "hub-credentials"])
        for e in c["env"]:
            if e["name"] == "HF_TOKEN":
                e["valueFrom"]["secretKeyRef"]["name"] = secret
        want["secret"] = secret
    if "no_model_cache" not in faults:
        claim = rng.choice(["models-eu", "vllm-cache-2"])
        for v in pod["volumes"]:
            if v.get("persistentVolumeClaim"):
                v["persistentVolumeClaim"]["claimName"] = claim
        want["claim"] = claim
    return want


def _kept(fixed: dict, want: dict) -> bool:
    """The repaired copy still holds the Deployment's own settings of `_vary`."""
    try:
        c = fixed["spec"]["template"]["spec"]["containers"][0]
        pod = fixed["spec"]["template"]["spec"]
        env = {e.get("name"): e for e in c.get("env") or []}
        ok = (
            str(c["resources"]["limits"]["nvidia.com/gpu"]) == want["gpus"]
            and c["resources"]["limits"].get("memory") == want["memory"]
            and (env.get("VLLM_LOGGING_LEVEL") or {}).get("value") == want["level"]
            and c["startupProbe"].get("failureThreshold") == want["budget"]
            and any(
                (v.get("emptyDir") or {}).get("sizeLimit") == want["shm"] for v in pod.get("volumes") or []
            )
        )
        if "secret" in want:
            ok = ok and env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == want["secret"]
        if "claim" in want:
            ok = ok and any(
                (v.get("persistentVolumeClaim") or {}).get("claimName") == want["claim"]
                for v in pod.get("volumes") or []
            )
        return bool(ok)
    except (KeyError, IndexError, TypeError, AttributeError):
        return False


@hidden("10.fix_manifest")
def _(manifest_faults, fix_manifest, rng, scenario):
    from lab_utils.deploy.manifests import break_deployment, deployment_problems, kept_settings

    found = fixed_ok = 0
    n = 10
    for _ in range(n):
        doc, faults = break_deployment(rng)
        want = _vary(doc, faults, rng)
        found += {str(f) for f in manifest_faults(copy.deepcopy(doc))} == faults
        fixed = fix_manifest(copy.deepcopy(doc))
        fixed_ok += (
            not deployment_problems(fixed)
            and not kept_settings(doc, fixed)
            and not _changed_beyond(doc, fixed, faults)
            and _kept(fixed, want)
        )
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


def gpu_string(gpu) -> str | None:
    """Modal's GPU string for the seeds' spelling: {"type": "A100", "count": 2, "size": "80GB"} -> "A100-80GB:2"."""
    if gpu is None or isinstance(gpu, str):
        return gpu
    name = str(gpu["type"]).upper()
    if gpu.get("size"):
        name += "-" + str(gpu["size"]).upper()
    count = int(gpu.get("count", 1))
    return name if count == 1 else f"{name}:{count}"


def reference_modernize(old: dict) -> dict:
    """{"function": kwargs for app.function(...), "concurrent": kwargs for @modal.concurrent or None}."""
    fn, concurrent = {}, None
    for key, value in old.items():
        if key == "gpu":
            fn["gpu"] = gpu_string(value)
        elif key == "allow_concurrent_inputs":
            concurrent = {"max_inputs": int(value)}
        elif key in RENAMED:
            fn[RENAMED[key]] = value
        else:
            fn[key] = value
    return {"function": fn, "concurrent": concurrent}


@hidden("10.modal_upgrade")
def _(modernize_modal, rng, scenario):
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
