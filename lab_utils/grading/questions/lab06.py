"""Lab 06 — Hugging Face TGI: graded questions.

Admission-rule functions are checked on two fixed cases in public and on random cases from the
grading seed in the hidden checks, against `lab_utils.tgi.admission` (which the answers may not
be or call). The migration function is checked on random TGI launches. Measured answers are the
stamped objects of this run, re-derived here. Hints say where to look, never the answer.
"""

from __future__ import annotations

import math

from lab_utils.grading.provenance import verify
from lab_utils.grading.registry import question, scenario

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


# --- 06.first_token_steps ---------------------------------------------------------------------


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


# --- 06.tgi_to_vllm ---------------------------------------------------------------------------

# vLLM 0.32's quantization methods (vllm.model_executor.layers.quantization.QUANTIZATION_METHODS)
# include awq, gptq, fp8 and compressed-tensors; not bitsandbytes, eetq or exl2.


def _norm(mapping) -> dict:
    out = {}
    for flag, args in dict(mapping).items():
        out[str(flag)] = None if args is None else [str(a) for a in args]
    return out


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


# --- 06.predicted_wait / 06.wait_measured -----------------------------------------------------


@question("06.predicted_wait", points=2, answers=["predicted_decodes_sat_out"], predict=True)
def _(predicted_decodes_sat_out):
    """Before measuring: decode steps SCENARIO's late request sits out before TGI admits it."""
    value = int(predicted_decodes_sat_out)
    assert value >= 0, "a count of decode steps"
    assert value < 100, "think in steps of the admission loop, not in seconds or tokens of output"


@question("06.wait_measured", points=2, answers=["LATE", "measured_decodes_sat_out"])
def _(LATE, measured_decodes_sat_out):
    """The simulator run of SCENARIO's late arrival, and the decode steps read from it."""
    assert verify(LATE), "LATE must be the object late_arrival(...) returned in this run"
    assert int(measured_decodes_sat_out) >= 0, "a count of decode steps"


# --- 06.router_measured -----------------------------------------------------------------------


@question("06.router_measured", points=2, answers=["ROUTER_RUN", "mean_decode_batch"])
def _(ROUTER_RUN, mean_decode_batch):
    """The burst measured on the stand-in router, and the mean batch size of its decode steps."""
    assert verify(ROUTER_RUN), "ROUTER_RUN must be the object run_burst(...) returned in this run"
    value = float(mean_decode_batch)
    assert math.isfinite(value) and value >= 1, "a decode step runs at least one request"
