"""Lab 06: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab06`.
"""

from __future__ import annotations

import math

from grader.registry import hidden
from lab_utils.grading.questions.lab06 import _FIELD_TYPES, _norm, _schema_ok


def _ref_admitted(batch, waiting, waiting_tokens, cfg) -> int:
    """TGI 2.x's router before a decode (`batching_task`): the ratio's floor (none for an idle
    router, none once max_waiting_tokens decode steps went by), the batch-size room, and what the
    running batch's reservations leave of max_batch_total_tokens, then the queue walk."""
    from lab_utils.tgi.admission import min_batch_size, next_batch, reserved_tokens

    min_size = (
        min_batch_size(len(batch), waiting_tokens, cfg["waiting_served_ratio"], cfg["max_waiting_tokens"])
        if batch
        else None
    )
    max_size = None if cfg["max_batch_size"] is None else cfg["max_batch_size"] - len(batch)
    budget = cfg["max_batch_total_tokens"] - sum(reserved_tokens(p, m) for p, m in batch)
    return next_batch(
        waiting,
        min_size=min_size,
        max_size=max_size,
        prefill_token_budget=cfg["max_batch_prefill_tokens"],
        token_budget=budget,
    )


def _admission_case(rng) -> tuple[list, list, int, dict]:
    """A running batch (sometimes none), a queue, a wait and launch limits; the total budget often
    tight enough that the running batch's reservations decide, the batch size often near its cap."""
    batch = [(rng.randint(1, 300), rng.randint(1, 200)) for _ in range(rng.choice([0, 1, 2, 3, 5, 8, 12]))]
    waiting = [(rng.randint(1, 300), rng.randint(1, 120)) for _ in range(rng.randint(0, 8))]
    max_wait = rng.randint(1, 25)
    waiting_tokens = rng.choice(
        [0, 1, max_wait - 1, max_wait, max_wait + rng.randint(1, 5), rng.randint(0, 30)]
    )
    held = sum(p + m - 1 for p, m in batch)
    cfg = {
        "waiting_served_ratio": rng.choice([0.0, 0.3, 0.5, 0.75, 1.0, 1.2, 2.0]),
        "max_waiting_tokens": max_wait,
        "max_batch_size": rng.choice([None, None, len(batch) + rng.randint(0, 3), rng.randint(1, 16)]),
        "max_batch_prefill_tokens": rng.randint(50, 1500),
        "max_batch_total_tokens": rng.choice([held + rng.randint(0, 1500), rng.randint(100, 20_000)]),
    }
    return batch, waiting, waiting_tokens, cfg


@hidden("06.admitted")
def _(tgi_admitted, rng, scenario):
    bad, n = 0, 40
    for _ in range(n):
        batch, waiting, waiting_tokens, cfg = _admission_case(rng)
        want = _ref_admitted(batch, waiting, waiting_tokens, cfg)
        got = int(tgi_admitted(list(batch), list(waiting), waiting_tokens, dict(cfg)))
        bad += got != want
    assert not bad, f"wrong on {bad} of {n} unseen router states"


@hidden("06.next_batch")
def _(tgi_next_batch, rng, scenario):
    from lab_utils.tgi.admission import next_batch

    bad = 0
    for _ in range(40):
        q = [(rng.randint(1, 400), rng.randint(1, 200)) for _ in range(rng.randint(0, 8))]
        min_size = rng.choice([None, 0, 1, 2, 3, 5])
        max_size = rng.choice([None, 1, 2, 4])
        prefill, total = rng.randint(50, 1200), rng.randint(50, 3000)
        want = next_batch(
            q, min_size=min_size, max_size=max_size, prefill_token_budget=prefill, token_budget=total
        )
        if int(tgi_next_batch(list(q), min_size, max_size, prefill, total)) != want:
            bad += 1
    assert not bad, f"wrong on {bad} of 40 unseen queues"


def _first_token_steps(
    n: int, prompt_len: int, prefill_budget: int, ratio: float, max_wait: int
) -> list[int]:
    from lab_utils.sim.workload import WorkloadRequest
    from lab_utils.tgi.admission import TGIConfig
    from lab_utils.tgi.measure import tgi_sim

    cfg = TGIConfig(
        max_input_tokens=prompt_len,
        max_total_tokens=prompt_len + 1000,
        max_batch_prefill_tokens=max(prefill_budget, prompt_len),
        max_batch_total_tokens=(n + 1) * (prompt_len + 1000),
        max_concurrent_requests=max(n, 1),
        waiting_served_ratio=ratio,
        max_waiting_tokens=max_wait,
    )
    work = [WorkloadRequest(i, 0.0, prompt_len, 400) for i in range(n)]
    res, _ = tgi_sim(work, cfg)
    first = {}
    for k, step in enumerate(res.steps, start=1):
        for rid in step.prefill:
            first.setdefault(rid, k)
    return [first[i] for i in range(n)]


@hidden("06.first_token_steps")
def _(first_token_steps, rng, scenario):
    bad = 0
    for _ in range(10):
        n, p = rng.randint(2, 10), rng.choice([16, 50, 100])
        budget = p * rng.randint(1, 4)
        args = (n, p, budget, rng.choice([0.3, 0.5, 1.0, 1.5]), rng.randint(2, 8))
        if [int(s) for s in first_token_steps(*args)] != _first_token_steps(*args):
            bad += 1
    assert not bad, f"wrong on {bad} of 10 unseen bursts"


_NO_EQUIVALENT = (
    "--max-input-tokens",
    "--max-batch-total-tokens",
    "--max-concurrent-requests",
    "--waiting-served-ratio",
    "--max-waiting-tokens",
)


_DIRECT = {
    "--model-id": "--model",
    "--num-shard": "--tensor-parallel-size",
    "--max-total-tokens": "--max-model-len",
    "--max-batch-prefill-tokens": "--max-num-batched-tokens",
    "--max-batch-size": "--max-num-seqs",
}


_QUANT = {
    "awq": "awq",
    "gptq": "gptq",
    "fp8": "fp8",
    "compressed-tensors": "compressed-tensors",
    "bitsandbytes-nf4": None,
    "bitsandbytes": None,
    "eetq": None,
    "exl2": None,
}


def _migrate(launch: dict) -> dict:
    out = {}
    for flag, value in launch.items():
        if flag in _DIRECT:
            out[flag] = [_DIRECT[flag], str(value)]
        elif flag == "--quantize":
            q = _QUANT[value]
            out[flag] = None if q is None else ["--quantization", q]
        else:
            out[flag] = None
    return out


def _random_launch(rng) -> dict:
    launch = {
        "--model-id": rng.choice(
            [
                "meta-llama/Llama-3.1-8B-Instruct",
                "Qwen/Qwen2.5-7B-Instruct",
                "HuggingFaceTB/SmolLM2-135M-Instruct",
            ]
        )
    }
    options = {
        "--num-shard": lambda: rng.choice([1, 2, 4, 8]),
        "--max-total-tokens": lambda: rng.choice([2048, 4096, 8192, 32768]),
        "--max-input-tokens": lambda: rng.choice([1024, 2047, 4000]),
        "--max-batch-prefill-tokens": lambda: rng.choice([2048, 4096, 8192]),
        "--max-batch-total-tokens": lambda: rng.choice([16000, 100000]),
        "--max-concurrent-requests": lambda: rng.choice([64, 128, 512]),
        "--waiting-served-ratio": lambda: rng.choice([0.3, 1.2]),
        "--max-waiting-tokens": lambda: rng.choice([10, 20, 40]),
        "--max-batch-size": lambda: rng.choice([16, 64, 256]),
        "--quantize": lambda: rng.choice(sorted(_QUANT)),
    }
    for flag in rng.sample(sorted(options), rng.randint(2, 6)):
        launch[flag] = options[flag]()
    return launch


@hidden("06.tgi_to_vllm")
def _(tgi_to_vllm, rng, scenario):
    bad = 0
    for _ in range(20):
        launch = _random_launch(rng)
        if _norm(tgi_to_vllm(dict(launch))) != _migrate(launch):
            bad += 1
    assert not bad, f"wrong on {bad} of 20 unseen launches"


@hidden("06.make_schema")
def _(make_schema, rng, scenario):
    cases = [dict(scenario["record_fields"])]
    for _ in range(8):
        case = {}
        for name in rng.sample(sorted(_FIELD_TYPES), rng.randint(1, 5)):
            spec = _FIELD_TYPES[name]
            if isinstance(spec, list):
                spec = rng.sample(spec, rng.randint(1, len(spec)))
            elif rng.random() < 0.3:  # the same field, nullable or not
                spec = spec[:-1] if spec.endswith("?") else spec + "?"
            case[name] = spec
        cases.append(case)
    bad = sum(not _schema_ok(dict(make_schema(dict(c))), c) for c in cases)
    assert not bad, f"wrong on {bad} of {len(cases)} unseen records"


def _sim_wait(s: dict) -> int:
    """The reference model: TGI's admission loop on the course simulator (never in a sandbox)."""
    from lab_utils.tgi.measure import late_arrival

    return late_arrival(s["running"], s["waiting_served_ratio"], s["max_waiting_tokens"]).decodes_sat_out


def _wait_scenarios(rng, scenario: dict, n: int = 20) -> list[dict]:
    """The notebook's scenario, then unseen ones: half where the ratio holds the late request back."""
    out = [dict(scenario)]
    ratios = [0.0, 0.2, 0.3, 0.5, 0.75, 0.8, 1.0, 1.2, 1.5, 2.0, 3.0]
    while len(out) < n:
        held = len(out) % 2 == 0
        running, ratio = rng.randint(1, 16), rng.choice(ratios)
        if (math.floor(running * ratio) > 1) != held:
            continue
        wait = rng.randint(3, 24) if rng.random() < 0.85 else rng.randint(1, 2)
        out.append(dict(scenario, running=running, waiting_served_ratio=ratio, max_waiting_tokens=wait))
    return out


@hidden("06.predicted_wait")
def _(predicted_decodes_sat_out, rng, scenario):
    cases = _wait_scenarios(rng, scenario)
    bad = sum(abs(int(predicted_decodes_sat_out(dict(c))) - _sim_wait(c)) > 1 for c in cases)
    assert not bad, (
        f"wrong on {bad} of {len(cases)} unseen scenarios (within 1 step of TGI's loop): compare the "
        "late request's batch with the floor the ratio sets, and see when that floor stops applying"
    )


def _queue_trace(rng) -> tuple[list[dict], list[int]]:
    """A step log of a FIFO queue (kind, queue length at planning, admitted), and each admitted
    request's decode steps spent queued, in queue order."""
    queue = [0] * rng.randint(0, 4)  # decode steps seen so far by each queued request
    running, steps, done = 0, [], []
    for _ in range(rng.randint(2, 40)):
        waiting = len(queue)
        prefill = bool(queue) and (not running or rng.random() < 0.3)
        if prefill:
            k = rng.randint(1, len(queue))
            done += queue[:k]
            queue, running = queue[k:], running + k
            steps.append({"kind": "prefill", "waiting": waiting, "admitted": k})
        elif running:
            queue = [w + 1 for w in queue]
            steps.append({"kind": "decode", "waiting": waiting, "admitted": 0})
            running -= rng.random() < 0.1 and running > 1
        else:
            steps.append({"kind": "idle", "waiting": waiting, "admitted": 0})
        queue += [0] * rng.choice([0, 0, 0, 0, 1, 1, 2, 3])
    return steps, done


@hidden("06.wait_measured")
def _(queue_waits, rng, scenario):
    bad, n = 0, 20
    for _ in range(n):
        steps, want = _queue_trace(rng)
        got = [int(w) for w in queue_waits([dict(s) for s in steps])]
        bad += got != want
    assert not bad, f"wrong on {bad} of {n} unseen step logs"


def _router_log(rng) -> tuple[list[dict], float]:
    """A router step log (prefills and decodes of varying length) and its time-weighted decode batch."""
    t, steps, batch = rng.uniform(0, 50), [], 0
    fixed, per = rng.uniform(0.01, 0.05), rng.uniform(0.001, 0.02)
    for _ in range(rng.randint(3, 60)):
        if batch == 0 or rng.random() < 0.15:
            k = rng.randint(1, 6)
            batch += k
            kind, dt, admitted = "prefill", fixed + per * 30 * k, k
        else:
            kind, dt, admitted = "decode", fixed + per * batch * rng.uniform(0.5, 1.5), 0
        end = t + dt
        steps.append(
            {
                "t": round(t, 6),
                "end": round(end, 6),
                "kind": kind,
                "batch_size": batch,
                "waiting": rng.randint(0, 5),
                "admitted": admitted,
            }
        )
        if kind == "decode" and rng.random() < 0.2:
            batch -= rng.randint(1, batch)
        t = end + rng.choice([0.0, 0.0, 0.001, rng.uniform(0, 0.5)])
    dec = [s for s in steps if s["kind"] == "decode"]
    if not dec:
        return _router_log(rng)
    weight = sum(s["end"] - s["t"] for s in dec)
    return steps, sum(s["batch_size"] * (s["end"] - s["t"]) for s in dec) / weight


@hidden("06.router_measured")
def _(mean_decode_batch, rng, scenario):
    bad, n = 0, 20
    for _ in range(n):
        steps, want = _router_log(rng)
        got = float(mean_decode_batch([dict(s) for s in steps]))
        bad += not (math.isfinite(got) and math.isclose(got, want, rel_tol=1e-6))
    assert not bad, f"wrong on {bad} of {n} unseen router logs"
