"""Lab 12: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab12`. The priority prediction is graded against the course's
simulator (`lab_utils.sim.priority`), the model the lab states; every other reference is here.
"""

from __future__ import annotations

import math

from grader.registry import hidden
from lab_utils.facts import fact
from lab_utils.grading.checks import close

_SHAPES = {
    "q_proj": lambda s: (s["hidden_size"], s["num_attention_heads"] * s["head_dim"]),
    "k_proj": lambda s: (s["hidden_size"], s["num_kv_heads"] * s["head_dim"]),
    "v_proj": lambda s: (s["hidden_size"], s["num_kv_heads"] * s["head_dim"]),
    "o_proj": lambda s: (s["num_attention_heads"] * s["head_dim"], s["hidden_size"]),
    "gate_proj": lambda s: (s["hidden_size"], s["intermediate_size"]),
    "up_proj": lambda s: (s["hidden_size"], s["intermediate_size"]),
    "down_proj": lambda s: (s["intermediate_size"], s["hidden_size"]),
}


def _ref_bytes(spec, rank, targets, nbytes):
    return rank * spec["num_layers"] * nbytes * sum(sum(_SHAPES[t](spec)) for t in targets)


def _spec(rng):
    kv = rng.choice([1, 2, 4, 8])
    heads = kv * rng.choice([1, 2, 4])
    hd = rng.choice([32, 64, 128])
    return {
        "num_layers": rng.randint(2, 80),
        "hidden_size": heads * hd,
        "num_attention_heads": heads,
        "num_kv_heads": kv,
        "head_dim": hd,
        "intermediate_size": heads * hd * rng.choice([2, 3, 4]),
    }


def _targets(rng):
    names = list(_SHAPES)
    return [n for n in names if rng.random() < 0.5] or [rng.choice(names)]


@hidden("12.adapter_bytes")
def _(adapter_bytes, rng, scenario):
    wrong = 0
    for _ in range(20):
        s, r, t, b = _spec(rng), rng.choice([1, 4, 8, 16, 64]), _targets(rng), rng.choice([1, 2, 4])
        wrong += not close(float(adapter_bytes(dict(s), r, list(t), b)), _ref_bytes(s, r, t, b), 1e-9)
    assert not wrong, f"wrong on {wrong} of 20 unseen models"


# vLLM's accepted --max-lora-rank values (lab_utils.facts, checked against the installed vLLM), and
# made-up lists, so an answer that hard-codes vLLM's list gets no further than one that reads its argument
_VLLM_RANKS = tuple(fact("vllm.max_lora_ranks"))


@hidden("12.adapter_slots")
def _(adapter_slots, rng, scenario):
    wrong = 0
    for i in range(24):
        s, t, b = _spec(rng), _targets(rng), rng.choice([2, 4])
        accepted = (
            _VLLM_RANKS if i % 2 else tuple(sorted(rng.sample([1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64], 5)))
        )
        ranks = [rng.randint(1, accepted[-1]) for _ in range(rng.randint(1, 5))]
        slot_rank = min(r for r in accepted if r >= max(ranks))
        one = _ref_bytes(s, slot_rank, t, b)
        kv = rng.randint(0, 50) * one + rng.randint(0, one)
        free = kv + rng.randint(-3, 40) * one + rng.randint(0, one - 1)
        want = max(0, (free - kv) // one) if free > kv else 0
        wrong += int(adapter_slots(dict(s), free, kv, list(ranks), list(t), b, list(accepted))) != want
    assert not wrong, f"wrong on {wrong} of 24 unseen budgets"


def _ref_admitted(arrivals, rate, burst):
    tokens, last, out = float(burst), None, []
    for t in arrivals:
        if last is not None:
            tokens = min(burst, tokens + (t - last) * rate)
        last = t
        ok = tokens >= 1
        tokens -= ok
        out.append(ok)
    return out


@hidden("12.token_bucket")
def _(admitted, rng, scenario):
    wrong = 0
    for _ in range(20):
        n, t, arrivals = rng.randint(1, 60), 0.0, []
        for _ in range(n):
            t += rng.choice([0.0, rng.expovariate(rng.choice([0.5, 2.0, 10.0]))])
            arrivals.append(round(t, 4))
        rate, burst = rng.choice([0.5, 1.0, 2.0, 5.0]), rng.choice([1, 2, 3, 5, 10])
        got = [bool(x) for x in admitted(list(arrivals), rate, burst)]
        wrong += got != _ref_admitted(arrivals, rate, burst)
    assert not wrong, f"wrong on {wrong} of 20 unseen arrival traces"


def _ref_rate(samples, window, at):
    inside = [(t, v) for t, v in samples if at - window <= t <= at]
    if len(inside) < 2:
        return 0.0
    inc = 0.0
    for (_, a), (_, b) in zip(inside, inside[1:]):
        inc += b - a if b >= a else b
    return inc / (inside[-1][0] - inside[0][0])


@hidden("12.counter_rate")
def _(counter_rate, rng, scenario):
    wrong = 0
    for _ in range(20):
        t, v, samples = 0.0, float(rng.randint(0, 100)), []
        for _ in range(rng.randint(3, 60)):
            t += rng.choice([1.0, 1.0, 2.0, 0.5])
            v = float(rng.randint(0, 20)) if rng.random() < 0.05 else v + rng.choice([0, 0, 1, 3, 10])
            samples.append((t, v))
        window, at = rng.choice([5.0, 10.0, 30.0]), rng.uniform(samples[0][0], samples[-1][0] + 2)
        wrong += not close(
            float(counter_rate(list(samples), window, at)), _ref_rate(samples, window, at), 1e-6, 1e-9
        )
    assert not wrong, f"wrong on {wrong} of 20 unseen scrapes"


def _pct(xs, q):
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@hidden("12.p90_by_class")
def _(p90_by_class, rng, scenario):
    wrong = 0
    for _ in range(20):
        recs = [
            {"priority": rng.choice([0, 1, 5, 10]), "ttft": round(rng.lognormvariate(-1, 1), 5)}
            for _ in range(rng.randint(1, 50))
        ]
        want = {}
        for c in {r["priority"] for r in recs}:
            want[c] = _pct([r["ttft"] for r in recs if r["priority"] == c], 90)
        got = {int(k): float(v) for k, v in dict(p90_by_class([dict(r) for r in recs])).items()}
        wrong += set(got) != set(want) or not all(close(got[c], want[c], 1e-9) for c in want)
    assert not wrong, f"wrong on {wrong} of 20 unseen sets of records"


@hidden("12.goodput_by_tenant")
def _(goodput_by_tenant, rng, scenario):
    wrong = 0
    for _ in range(20):
        recs = []
        for _ in range(rng.randint(1, 40)):
            status = rng.choice([200, 200, 200, 429, 401, 500])
            recs.append(
                {
                    "tenant": rng.choice(["noisy", "a", "b", "c"]),
                    "status": status,
                    "ttft": round(rng.expovariate(2.0), 4) if status == 200 else None,
                }
            )
        slo, dur = rng.choice([0.25, 0.5, 1.0]), rng.uniform(1, 30)
        want = {t: 0.0 for t in {r["tenant"] for r in recs}}
        for r in recs:
            if r["status"] == 200 and r["ttft"] is not None and r["ttft"] <= slo:
                want[r["tenant"]] += 1 / dur
        got = {
            str(k): float(v) for k, v in dict(goodput_by_tenant([dict(r) for r in recs], slo, dur)).items()
        }
        wrong += set(got) != set(want) or not all(close(got[t], want[t], 1e-6, 1e-9) for t in want)
    assert not wrong, f"wrong on {wrong} of 20 unseen load runs"


def _ref_p90(case, policy):
    from lab_utils.sim.cost import StepCostModel
    from lab_utils.sim.priority import PriorityRequest, simulate_priority

    reqs = [PriorityRequest(i, 0.0, case["prompt_len"], case["low_output"], 1) for i in range(case["n_low"])]
    reqs += [
        PriorityRequest(case["n_low"] + j, case["high_arrival_s"], case["prompt_len"], case["high_output"], 0)
        for j in range(case["n_high"])
    ]
    cost = StepCostModel(fixed_s=case["fixed_s"], per_token_s=case["per_token_s"])
    run = simulate_priority(reqs, policy, case["max_num_seqs"], cost)
    return _pct(run.ttfts(reqs, 0), 90)


@hidden("12.predict_priority")
def _(predict_high_p90, rng, scenario):
    wrong = 0
    for i in range(20):
        case = (
            dict(scenario["priority"])
            if i == 0
            else {
                "max_num_seqs": rng.choice([1, 2, 3, 4]),
                "n_low": rng.randint(3, 12),
                "n_high": rng.randint(1, 3),
                "low_output": rng.choice([16, 32, 48, 64]),
                "high_output": rng.choice([2, 4, 8]),
                "prompt_len": rng.choice([8, 16, 32, 64]),
                "high_arrival_s": rng.choice([0.1, 0.3, 0.5, 0.8, 1.5]),
                "fixed_s": rng.choice([0.01, 0.02, 0.025, 0.03]),
                "per_token_s": rng.choice([0.0005, 0.001, 0.002]),
            }
        )
        for policy in ("fcfs", "priority"):
            got = float(predict_high_p90(dict(case), policy))
            wrong += not (math.isfinite(got) and close(got, _ref_p90(case, policy), 0.05, 1e-6))
    assert not wrong, f"wrong on {wrong} of 40 unseen overloads (20 cases x 2 policies, 5% tolerance)"


def _median(xs):
    xs = sorted(xs)
    if not xs:
        return math.nan
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


@hidden("12.tpot_by_model")
def _(tpot_by_model, rng, scenario):
    wrong = 0
    for _ in range(20):
        recs = []
        for _ in range(rng.randint(1, 40)):
            ok = rng.random() < 0.85
            ttft = round(rng.lognormvariate(-1, 1), 5)
            tokens = rng.choice([1, 2, 3, 16, 32, 64]) if ok else 0
            recs.append(
                {
                    "model": rng.choice(["base", "json", "upper", "json2", "sql"]),
                    "ok": ok,
                    "ttft": ttft if ok else None,
                    "e2e": round(ttft + max(tokens - 1, 0) * rng.uniform(0.01, 0.2), 5) if ok else None,
                    "output_tokens": tokens,
                }
            )
        want = {}
        for m in {r["model"] for r in recs}:
            tpots = [
                (r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1)
                for r in recs
                if r["model"] == m and r["ok"] and r["output_tokens"] >= 2
            ]
            want[m] = _median(tpots)
        got = {str(k): float(v) for k, v in dict(tpot_by_model([dict(r) for r in recs])).items()}
        wrong += set(got) != set(want) or not all(close(got[m], want[m], 1e-6, 1e-12) for m in want)
    assert not wrong, f"wrong on {wrong} of 20 unseen mixed batches"
