"""Lab 06 — Hugging Face TGI: graded questions.

Admission-rule functions are checked on two fixed cases in public and on random cases from the
grading seed in the hidden checks, against `lab_utils.tgi.admission` (which the answers may not
be or call). The migration function is checked on random TGI launches. Measured answers are the
stamped objects of this run, re-derived here. Hints say where to look, never the answer.
"""

from __future__ import annotations

import math

from lab_utils.grading.provenance import verify
from lab_utils.grading.registry import hidden, question, scenario

_FIELD_TYPES = {
    "city": "string",
    "population": "integer",
    "area_km2": "number",
    "capital": "boolean",
    "country": "string",
    "founded": "integer",
    "mayor": "string",
    "coastal": "boolean",
    "elevation_m": "number",
}


@scenario("06")
def _(rng):
    """The admission settings you reason about and measure, and the record your grammar describes."""
    names = rng.sample(sorted(_FIELD_TYPES), rng.randint(2, 4))
    return {
        "running": rng.choice([2, 3, 4, 5, 6, 8]),
        "waiting_served_ratio": rng.choice([0.3, 0.5, 0.8, 1.0, 1.2]),
        "max_waiting_tokens": rng.choice([4, 6, 8, 10, 12]),
        "burst": rng.choice([4, 5, 6]),
        "record_fields": {n: _FIELD_TYPES[n] for n in names},
    }


# --- 06.min_batch_size ------------------------------------------------------------------------


@question(
    "06.min_batch_size",
    points=2,
    answers=["tgi_min_batch_size"],
    forbid=["lab_utils.tgi.admission:min_batch_size", "lab_utils.tgi:min_batch_size"],
)
def _(tgi_min_batch_size):
    """The smallest new batch TGI accepts while `running` requests decode (None: any size)."""
    assert tgi_min_batch_size(10, 25, 0.3, 20) is None, (
        "what happens once the batch has gone max_waiting_tokens steps without admitting anyone?"
    )
    got = tgi_min_batch_size(10, 2, 0.5, 20)
    assert got is not None and int(got) >= 1, "before that limit, the ratio sets a floor on the new batch"


@hidden("06.min_batch_size")
def _(tgi_min_batch_size, rng, scenario):
    from lab_utils.tgi.admission import min_batch_size

    bad = 0
    for _ in range(30):
        args = (
            rng.randint(0, 64),
            rng.randint(1, 40),
            rng.choice([0.0, 0.3, 0.5, 0.75, 1.0, 1.2, 2.0]),
            rng.randint(1, 30),
        )
        want, got = min_batch_size(*args), tgi_min_batch_size(*args)
        if (want is None) != (got is None) or (want is not None and int(got) != want):
            bad += 1
    assert not bad, f"wrong on {bad} of 30 unseen cases"


# --- 06.next_batch ----------------------------------------------------------------------------


@question(
    "06.next_batch",
    points=3,
    answers=["tgi_next_batch"],
    forbid=["lab_utils.tgi.admission:next_batch", "lab_utils.tgi:next_batch"],
)
def _(tgi_next_batch):
    """How many queued requests (input_len, max_new_tokens) form TGI's next batch under its budgets."""
    q = [(100, 20), (300, 20), (50, 20)]
    n = int(tgi_next_batch(q, None, None, 1000, 10_000))
    assert n == 3, "everything fits: nothing should stop the batch"
    n = int(tgi_next_batch(q, 2, None, 350, 10_000))
    assert 0 <= n <= 3, "return how many requests, from the front of the queue"


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


# --- 06.first_token_steps ---------------------------------------------------------------------


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


@question(
    "06.first_token_steps",
    points=3,
    answers=["first_token_steps"],
    forbid=[
        "lab_utils.tgi.measure:tgi_sim",
        "lab_utils.tgi.admission:TGIAdmission",
        "lab_utils.tgi:TGIAdmission",
        "lab_utils.sim.simulator:simulate",
        "lab_utils.sim:simulate",
    ],
)
def _(first_token_steps):
    """For n equal prompts arriving at once: the forward pass (1, 2, ...) that gives each its first token."""
    got = [int(s) for s in first_token_steps(4, 100, 1000, 0.3, 20)]
    assert got == [1, 1, 1, 1], "four prompts of 100 tokens fit in one prefill of 1000"
    got = [int(s) for s in first_token_steps(4, 100, 200, 0.3, 20)]
    assert len(got) == 4 and got == sorted(got) and got[0] == 1, (
        "one value per request, in arrival order; the first prefill is forward pass 1"
    )
    assert got[-1] >= 2, "with room for two prompts per prefill, they cannot all start in forward pass 1"


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


# --- 06.tgi_to_vllm ---------------------------------------------------------------------------

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
# vLLM 0.32's quantization methods (vllm.model_executor.layers.quantization.QUANTIZATION_METHODS)
# include awq, gptq, fp8 and compressed-tensors; not bitsandbytes, eetq or exl2.
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


def _norm(mapping) -> dict:
    out = {}
    for flag, args in dict(mapping).items():
        out[str(flag)] = None if args is None else [str(a) for a in args]
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


@question("06.tgi_to_vllm", points=3, answers=["tgi_to_vllm"])
def _(tgi_to_vllm):
    """Map a TGI launch ({flag: value}) to vLLM arguments per flag, or None where vLLM has no equivalent."""
    got = _norm(tgi_to_vllm({"--model-id": "m", "--num-shard": 2}))
    assert set(got) == {"--model-id", "--num-shard"}, "one entry per TGI flag you were given"
    assert got["--num-shard"] is not None and "2" in got["--num-shard"], "sharding has a vLLM counterpart"
    got = _norm(tgi_to_vllm({"--model-id": "m", "--waiting-served-ratio": 1.2}))
    assert got["--waiting-served-ratio"] is None, (
        "does vLLM's scheduler have anything like waiting_served_ratio? Say so with None"
    )


@hidden("06.tgi_to_vllm")
def _(tgi_to_vllm, rng, scenario):
    bad = 0
    for _ in range(20):
        launch = _random_launch(rng)
        if _norm(tgi_to_vllm(dict(launch))) != _migrate(launch):
            bad += 1
    assert not bad, f"wrong on {bad} of 20 unseen launches"


# --- 06.make_schema ---------------------------------------------------------------------------

_SAMPLES = {"string": ("Lyon", 3), "integer": (42, "x"), "number": (2.5, "x"), "boolean": (True, "yes")}


def _schema_ok(schema, fields: dict) -> bool:
    import jsonschema

    good = {k: _SAMPLES[t][0] for k, t in fields.items()}
    try:
        jsonschema.validate(good, schema)
    except jsonschema.ValidationError:
        return False
    bads = [{**good, "unexpected_field": 1}]
    for k, t in fields.items():
        bads.append({kk: v for kk, v in good.items() if kk != k})
        bads.append({**good, k: _SAMPLES[t][1]})
    for bad in bads:
        try:
            jsonschema.validate(bad, schema)
            return False
        except jsonschema.ValidationError:
            pass
    return "properties" in schema  # TGI refuses a json grammar without "properties"


@question("06.make_schema", points=2, answers=["make_schema"])
def _(make_schema):
    """A JSON schema that accepts exactly a record with the given {field: type} (all required, no others)."""
    schema = make_schema({"city": "string", "population": "integer"})
    assert isinstance(schema, dict) and "properties" in schema, (
        "return a JSON schema object; TGI's json grammar needs a 'properties' field"
    )
    assert _schema_ok(dict(schema), {"city": "string", "population": "integer"}), (
        "check every field is required, typed, and that no other field is allowed"
    )


@hidden("06.make_schema")
def _(make_schema, rng, scenario):
    cases = [dict(scenario["record_fields"])]
    for _ in range(6):
        names = rng.sample(sorted(_FIELD_TYPES), rng.randint(1, 5))
        cases.append({n: _FIELD_TYPES[n] for n in names})
    bad = sum(not _schema_ok(dict(make_schema(dict(c))), c) for c in cases)
    assert not bad, f"wrong on {bad} of {len(cases)} unseen records"


# --- 06.predicted_wait / 06.wait_measured -----------------------------------------------------


def _predicted_wait(s: dict) -> int:
    min_size = math.floor(s["running"] * s["waiting_served_ratio"])
    return 0 if min_size <= 1 else s["max_waiting_tokens"] - 1


@question("06.predicted_wait", points=2, answers=["predicted_decodes_sat_out"], predict=True)
def _(predicted_decodes_sat_out):
    """Before measuring: decode steps SCENARIO's late request sits out before TGI admits it."""
    value = int(predicted_decodes_sat_out)
    assert value >= 0, "a count of decode steps"
    assert value < 100, "think in steps of the admission loop, not in seconds or tokens of output"


@hidden("06.predicted_wait")
def _(predicted_decodes_sat_out, rng, scenario):
    assert abs(int(predicted_decodes_sat_out) - _predicted_wait(scenario)) <= 1, (
        "compare the new batch's size with floor(running x ratio), and see when that floor stops applying"
    )


@question("06.wait_measured", points=2, answers=["LATE", "measured_decodes_sat_out"])
def _(LATE, measured_decodes_sat_out):
    """The simulator run of SCENARIO's late arrival, and the decode steps read from it."""
    assert verify(LATE), "LATE must be the object late_arrival(...) returned in this run"
    assert int(measured_decodes_sat_out) >= 0, "a count of decode steps"


@hidden("06.wait_measured")
def _(LATE, measured_decodes_sat_out, rng, scenario):
    assert verify(LATE), "not the object measured in this run"
    assert (int(LATE.running), float(LATE.waiting_served_ratio), int(LATE.max_waiting_tokens)) == (
        scenario["running"],
        scenario["waiting_served_ratio"],
        scenario["max_waiting_tokens"],
    ), "measure SCENARIO's settings"
    derived = sum(1 for k, w in zip(LATE.kinds, LATE.waiting) if k == "decode" and int(w) > 0)
    assert int(measured_decodes_sat_out) == derived, "read the count from the measured steps"


# --- 06.router_measured -----------------------------------------------------------------------


@question("06.router_measured", points=2, answers=["ROUTER_RUN", "mean_decode_batch"])
def _(ROUTER_RUN, mean_decode_batch):
    """The burst measured on the stand-in router, and the mean batch size of its decode steps."""
    assert verify(ROUTER_RUN), "ROUTER_RUN must be the object run_burst(...) returned in this run"
    value = float(mean_decode_batch)
    assert math.isfinite(value) and value >= 1, "a decode step runs at least one request"


@hidden("06.router_measured")
def _(ROUTER_RUN, mean_decode_batch, rng, scenario):
    assert verify(ROUTER_RUN), "not the object measured in this run"
    sizes = [int(s["batch_size"]) for s in ROUTER_RUN.steps if s["kind"] == "decode"]
    assert sizes and len(ROUTER_RUN.ttft_s) == scenario["burst"], "measure a burst of SCENARIO's size"
    assert math.isclose(float(mean_decode_batch), sum(sizes) / len(sizes), rel_tol=1e-6), (
        "average the batch size over the decode steps of the measured log"
    )
