"""Lab 14: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab14`. The disaggregation question is graded against lab 10's
simulator (`lab_utils.deploy.disagg`), the model the lab states; every other reference is here.
"""

from __future__ import annotations

import math

from grader.registry import hidden
from lab_utils.grading.checks import close


def _ref_bytes(spec, prompt_len, block_size, dtype_bytes):
    tokens = (prompt_len - 1) // block_size * block_size  # whole blocks; the last token is computed
    return tokens * 2 * spec["num_layers"] * spec["num_kv_heads"] * spec["head_dim"] * dtype_bytes


def _spec(rng):
    return {
        "num_layers": rng.randint(1, 96),
        "num_kv_heads": rng.choice([1, 2, 3, 4, 8, 16]),
        "head_dim": rng.choice([32, 64, 80, 96, 128, 256]),
    }


@hidden("14.kv_bytes_stored")
def _(kv_bytes_stored, rng, scenario):
    wrong, n = 0, 30
    for _ in range(n):
        spec, bs = _spec(rng), rng.choice([1, 8, 16, 32, 64, 128, 256])
        length = rng.choice([1, 2, bs, bs + 1, bs + 2, 2 * bs + 1, rng.randint(1, 20_000)])
        db = rng.choice([1, 2, 4])
        wrong += int(kv_bytes_stored(dict(spec), length, bs, db)) != _ref_bytes(spec, length, bs, db)
    assert not wrong, f"wrong on {wrong} of {n} unseen prompts"


def _ref_ttft(prompt_len, tier, path):
    compute = tier["fixed_s"] + prompt_len / tier["prefill_tok_s"]
    stored = (prompt_len - 1) // tier["block_size"] * tier["block_size"]
    if path == "recompute" or stored == 0:
        return compute
    read = stored * tier["kv_bytes_per_token"] / (tier["tier_gb_s"] * 1e9)
    return tier["fixed_s"] + tier["load_overhead_s"] + read + (prompt_len - stored) / tier["prefill_tok_s"]


def _tier(rng):
    return {
        "prefill_tok_s": rng.choice([300.0, 1000.0, 2500.0, 10_000.0, 50_000.0]) * rng.uniform(0.8, 1.2),
        "fixed_s": rng.uniform(0.005, 0.1),
        "kv_bytes_per_token": rng.choice([23040, 46080, 65536, 131072, 327680]),
        "block_size": rng.choice([16, 32, 128]),
        "tier_gb_s": rng.choice([0.05, 0.2, 1.0, 3.0, 12.0, 50.0]) * rng.uniform(0.8, 1.2),
        "load_overhead_s": rng.choice([0.0, 0.001, 0.01, 0.05, 0.2]),
    }


@hidden("14.predict_ttft")
def _(predict_ttft, rng, scenario):
    wrong, n = 0, 30
    for _ in range(n):
        tier, path = _tier(rng), rng.choice(["recompute", "load"])
        length = rng.choice([1, tier["block_size"], tier["block_size"] + 1, rng.randint(2, 32_000)])
        wrong += not close(float(predict_ttft(length, dict(tier), path)), _ref_ttft(length, tier, path), 1e-6)
    assert not wrong, f"wrong on {wrong} of {n} unseen tiers and prompts"


def _ref_crossover(tier, max_len):
    for length in range(1, max_len + 1):
        if _ref_ttft(length, tier, "load") < _ref_ttft(length, tier, "recompute"):
            return length
    return None


def _clear_crossover(tier, max_len):
    """A tier whose answer no rounding can move: no length within 1e-9 s of a tie."""
    for length in range(1, max_len + 1):
        gap = _ref_ttft(length, tier, "load") - _ref_ttft(length, tier, "recompute")
        if gap != 0 and abs(gap) < 1e-9:
            return False
    return True


@hidden("14.crossover")
def _(crossover_len, rng, scenario):
    wrong, n, nones = 0, 16, 0
    for _ in range(n):
        max_len = rng.choice([512, 2048, 8192])
        tier = _tier(rng)
        while not _clear_crossover(tier, max_len):
            tier = _tier(rng)
        want = _ref_crossover(tier, max_len)
        nones += want is None
        got = crossover_len(dict(tier), max_len)
        wrong += (got is None) != (want is None) or (want is not None and int(got) != want)
    assert not wrong, f"wrong on {wrong} of {n} unseen tiers"


_NAMES = {
    "prompt": "vllm:prompt_tokens_total",
    "device": "vllm:prefix_cache_hits_total",
    "queries": "vllm:external_prefix_cache_queries_total",
    "external": "vllm:external_prefix_cache_hits_total",
}


def _page(series: dict, rng) -> str:
    """A /metrics page: every series of `series` ((name, engine) -> value) plus the look-alikes."""
    lines = []
    for (name, engine), value in series.items():
        if rng.random() < 0.5:
            lines.append(f"# HELP {name[:-6]} some help text mentioning {name}")
            lines.append(f"# TYPE {name[:-6]} counter")
        labels = f'engine="{engine}",model_name="course"'
        lines.append(f"{name}{{{labels}}} {value!r}")
        lines.append(f"{name[:-6]}_created{{{labels}}} {1.79e9 + rng.random()!r}")
    lines.append(
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="course"}} {rng.randint(0, 10**6)}.0'
    )
    lines.append(
        f'vllm:prompt_tokens_by_source_total{{engine="0",source="local_compute"}} {rng.randint(0, 99)}.0'
    )
    rng.shuffle(lines)
    return "\n".join(lines) + "\n"


def _ref_sources(before: dict, after: dict) -> dict:
    delta = {k: 0.0 for k in _NAMES}
    for (name, engine), v in after.items():
        b = before.get((name, engine), 0.0)
        key = next(k for k, n in _NAMES.items() if n == name)
        delta[key] += v - b if v >= b else v  # a series that went down restarted from zero
    if not delta["prompt"]:  # no prompt tokens scheduled between the scrapes: no shares to give
        return dict.fromkeys(("device", "external", "computed", "connector_hit_rate"), math.nan)
    out = {
        "device": delta["device"] / delta["prompt"],
        "external": delta["external"] / delta["prompt"],
    }
    out["computed"] = 1.0 - out["device"] - out["external"]
    out["connector_hit_rate"] = delta["external"] / delta["queries"] if delta["queries"] else math.nan
    return out


@hidden("14.cache_sources")
def _(cache_sources, rng, scenario):
    wrong, n = 0, 16
    for i in range(n):
        engines = [str(e) for e in range(rng.randint(1, 3))]
        before, after = {}, {}
        for e in engines:
            restarted = rng.random() < 0.3
            b = {k: float(rng.randint(0, 50_000)) for k in _NAMES}
            # case 1: no prompt tokens scheduled between the scrapes (the text: nan for all four)
            prompt = 0.0 if i == 1 else float(rng.randint(100, 20_000))
            dev = float(rng.randint(0, int(prompt) // 2))
            queries = 0.0 if i == 0 else prompt - dev
            ext = float(rng.randint(0, int(queries) // 2)) if queries else 0.0
            inc = {"prompt": prompt, "device": dev, "queries": queries, "external": ext}
            for k, name in _NAMES.items():
                before[(name, e)] = b[k]
                after[(name, e)] = inc[k] if restarted else b[k] + inc[k]
        want = _ref_sources(before, after)
        try:
            got = {
                str(k): float(v)
                for k, v in dict(cache_sources(_page(before, rng), _page(after, rng))).items()
            }
        except (TypeError, ValueError):
            wrong += 1
            continue
        wrong += set(got) != set(want) or not all(close(got[k], want[k], 1e-9, 1e-12) for k in want)
    assert not wrong, f"wrong on {wrong} of {n} unseen pairs of scrapes"


def _median(xs):
    xs = sorted(xs)
    if not xs:
        return math.nan
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def _ref_ttft_tpot(records):
    ttft = [r["token_times"][0] - r["sent"] for r in records if r["ok"] and r["token_times"]]
    tpot = [
        (r["token_times"][-1] - r["token_times"][0]) / (len(r["token_times"]) - 1)
        for r in records
        if r["ok"] and len(r["token_times"]) >= 2
    ]
    return {"ttft_p50": _median(ttft), "tpot_p50": _median(tpot)}


@hidden("14.ttft_tpot")
def _(ttft_tpot, rng, scenario):
    wrong, n = 0, 20
    for _ in range(n):
        recs = []
        for _ in range(rng.randint(1, 25)):
            sent = rng.uniform(0, 100)
            ok = rng.random() > 0.15
            k = rng.choice([0, 1, 1, 2, 5, 16, 64]) if ok else rng.choice([0, 3])
            t, times = sent + rng.lognormvariate(-1.5, 0.8), []
            for _ in range(k):
                times.append(round(t, 6))
                t += rng.lognormvariate(-4, 0.5)
            recs.append({"sent": round(sent, 6), "token_times": times, "ok": ok})
        want = _ref_ttft_tpot(recs)
        got = {str(k): float(v) for k, v in dict(ttft_tpot([dict(r) for r in recs])).items()}
        wrong += set(got) != set(want) or not all(close(got[k], want[k], 1e-9) for k in want)
    assert not wrong, f"wrong on {wrong} of {n} unseen sets of records"


def _ref_pick(prompt, replicas, block_size):
    def blocks(cached):
        n = 0
        for a, b in zip(prompt, cached):
            if a != b:
                break
            n += 1
        return n // block_size

    scores = [max([blocks(c) for c in r["cached"]] or [0]) for r in replicas]
    return min(range(len(replicas)), key=lambda i: (-scores[i], replicas[i]["load"], i))


@hidden("14.pick_replica")
def _(pick_replica, rng, scenario):
    wrong, n = 0, 24
    for _ in range(n):
        bs = rng.choice([2, 4, 16])
        system = [rng.randint(0, 50) for _ in range(rng.randint(0, 6 * bs))]
        prompt = system + [rng.randint(0, 50) for _ in range(rng.randint(1, 4 * bs))]
        replicas = []
        for _ in range(rng.randint(1, 6)):
            cached = []
            for _ in range(rng.randint(0, 4)):
                cut = rng.randint(0, len(prompt))
                tail = [rng.randint(51, 99) for _ in range(rng.randint(0, 3 * bs))]
                cached.append(prompt[:cut] + tail if rng.random() < 0.8 else tail)
            replicas.append({"cached": cached, "load": rng.randint(0, 4)})
        got = pick_replica(
            list(prompt),
            [{"cached": [list(c) for c in r["cached"]], "load": r["load"]} for r in replicas],
            bs,
        )
        wrong += int(got) != _ref_pick(prompt, replicas, bs)
    assert not wrong, f"wrong on {wrong} of {n} unseen replica sets"


def _ref_layout(workload, num_gpus, cost, link, slo):
    from lab_utils.deploy.disagg import colocated, disaggregated
    from lab_utils.sim import StepCostModel, WorkloadRequest

    work = [
        WorkloadRequest(w["request_id"], w["arrival_time"], w["prompt_len"], w["output_len"])
        for w in workload
    ]
    step = StepCostModel(**cost)
    options = [("colocated", colocated(work, num_gpus, step))]
    for p in range(1, num_gpus):
        options.append((p, disaggregated(work, p, num_gpus - p, step, **link)))
    slack = []
    for layout, r in options:
        if r["ttft_p95"] <= slo["ttft_s"] and r["tpot_p95"] <= slo["tpot_s"]:
            slack.append((min(slo["ttft_s"] / r["ttft_p95"], slo["tpot_s"] / r["tpot_p95"]), layout))
    if not slack:
        return None, False
    slack.sort(key=lambda s: -s[0])
    tie = len(slack) > 1 and abs(slack[0][0] - slack[1][0]) < 1e-6 * slack[0][0]
    return slack[0][1], tie


def _workload(rng):
    heavy = rng.choice(["prefill", "decode"])
    rate = rng.uniform(2, 12)
    t, out = 0.0, []
    for i in range(rng.randint(15, 40)):
        t += rng.expovariate(rate)
        p = rng.randint(800, 3000) if heavy == "prefill" else rng.randint(50, 300)
        o = rng.randint(8, 40) if heavy == "prefill" else rng.randint(100, 300)
        out.append({"request_id": i, "arrival_time": round(t, 4), "prompt_len": p, "output_len": o})
    return out


@hidden("14.disagg_layout")
def _(best_layout, rng, scenario):
    wrong, n = 0, 10
    for _ in range(n):
        while True:
            work, gpus = _workload(rng), rng.randint(2, 4)
            cost = {"fixed_s": rng.uniform(0.01, 0.04), "per_token_s": rng.uniform(0.0001, 0.001)}
            link = {
                "kv_bytes_per_token": rng.choice([46080, 131072]),
                "link_gb_s": rng.choice([0.1, 1.0, 10.0, 50.0]),
                "link_latency_s": rng.choice([0.0, 0.003, 0.05]),
            }
            slo = {"ttft_s": rng.choice([0.2, 0.5, 1.0, 3.0]), "tpot_s": rng.choice([0.03, 0.06, 0.1, 0.3])}
            want, tie = _ref_layout(work, gpus, cost, link, slo)
            if not tie:
                break
        got = best_layout([dict(w) for w in work], gpus, dict(cost), dict(link), dict(slo))
        wrong += (got is None) != (want is None) or (want is not None and str(got) != str(want))
    assert not wrong, f"wrong on {wrong} of {n} unseen workloads"
