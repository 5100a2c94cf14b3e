"""Lab 06 — Hugging Face TGI: graded questions.

Admission-rule functions are checked on two fixed cases in public and on random cases from the
grading seed in the hidden checks, against `lab_utils.tgi.admission` (which the answers may not
be or call). The schema question forbids the libraries that write a JSON schema from types. The migration function is checked on random TGI launches. The prediction is a function
of the scenario graded on unseen scenarios against the simulator; the two measurement questions are
analysis functions graded on step logs the hidden checks make up. Hints say where to look, never
the answer.
"""

from __future__ import annotations

import math

from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import question, scenario

# a record's fields: a JSON type, that type or null ("integer?"), or a list of the allowed strings
_FIELD_TYPES = {
    "city": "string",
    "population": "integer",
    "area_km2": "number",
    "capital": "boolean",
    "country": "string",
    "founded": "integer?",
    "mayor": "string?",
    "coastal": "boolean",
    "elevation_m": "number?",
    "continent": ["Africa", "Americas", "Asia", "Europe", "Oceania"],
    "climate": ["arid", "temperate", "tropical", "polar"],
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


# --- 06.admitted -------------------------------------------------------------------------------


def _admission_cfg(**over) -> dict:
    cfg = {
        "waiting_served_ratio": 0.5,
        "max_waiting_tokens": 20,
        "max_batch_size": None,
        "max_batch_prefill_tokens": 1000,
        "max_batch_total_tokens": 10_000,
    }
    return {**cfg, **over}


@question("06.admitted", points=2, answers=["tgi_admitted"], forbid=refs("tgi_admission"))
def _(tgi_admitted):
    """tgi_admitted(batch, waiting, waiting_tokens, cfg): how many queued requests TGI 2.x's router
    prefills before its next decode, given the running batch and the queue ((input_len,
    max_new_tokens) each), the decode steps since the last admission, and the launch limits."""
    queue = [(100, 20), (300, 20), (50, 20)]
    got = int(tgi_admitted([], list(queue), 0, _admission_cfg()))
    assert got == 3, "an idle router with room for every queued request takes them all"
    batch = [(100, 20)] * 4
    now = int(tgi_admitted(list(batch), [(50, 20)], 1, _admission_cfg()))
    later = int(tgi_admitted(list(batch), [(50, 20)], 20, _admission_cfg()))
    assert 0 <= now <= later == 1, (
        "the longer the queue has waited, the less the router holds out: once max_waiting_tokens "
        "decode steps have gone by, a request that fits joins"
    )


# --- 06.next_batch ----------------------------------------------------------------------------


@question("06.next_batch", points=3, answers=["tgi_next_batch"], forbid=refs("tgi_admission"))
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
    forbid=refs("tgi_simulators"),
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

_SAMPLES = {"string": ("Lyon", 3), "integer": (42, 2.5), "number": (2.5, "x"), "boolean": (True, "yes")}


def _values(spec) -> tuple[list, list]:
    """Values a field of this spec must accept, and values it must refuse."""
    if isinstance(spec, (list, tuple)):
        return list(spec), ["not " + str(spec[0]), 3, None]
    good, bad = _SAMPLES[str(spec).rstrip("?")]
    return ([good, None], [bad]) if str(spec).endswith("?") else ([good], [bad, None])


def _schema_ok(schema, fields: dict) -> bool:
    import jsonschema

    def accepts(record) -> bool:
        try:
            jsonschema.validate(record, schema)
        except (jsonschema.ValidationError, jsonschema.SchemaError):
            return False
        return True

    values = {k: _values(spec) for k, spec in fields.items()}
    good = {k: oks[0] for k, (oks, _) in values.items()}
    if not accepts(good) or accepts({**good, "unexpected_field": 1}):
        return False
    for k, (oks, bads) in values.items():
        if accepts({kk: v for kk, v in good.items() if kk != k}):
            return False  # every field is required, a nullable one too
        if not all(accepts({**good, k: v}) for v in oks) or any(accepts({**good, k: v}) for v in bads):
            return False
    return "properties" in schema  # TGI refuses a json grammar without "properties"


@question("06.make_schema", points=2, answers=["make_schema"], forbid=refs("json_schema_writers"))
def _(make_schema):
    """A JSON schema that accepts exactly a record with the given fields (all required, no others)."""
    schema = make_schema({"city": "string", "population": "integer"})
    assert isinstance(schema, dict) and "properties" in schema, (
        "return a JSON schema object; TGI's json grammar needs a 'properties' field"
    )
    assert _schema_ok(dict(schema), {"city": "string", "population": "integer"}), (
        "check every field is required, typed, and that no other field is allowed"
    )
    fields = {"continent": ["Asia", "Europe"], "mayor": "string?"}
    assert _schema_ok(dict(make_schema(dict(fields))), fields), (
        "a list names the only strings allowed; a type ending in ? also allows null (the field stays required)"
    )


# --- 06.predicted_wait / 06.wait_measured -----------------------------------------------------


@question(
    "06.predicted_wait",
    points=2,
    answers=["predicted_decodes_sat_out"],
    predict=True,
    forbid=refs("tgi_wait_models"),
)
def _(predicted_decodes_sat_out):
    """predicted_decodes_sat_out(scenario): decode steps a late request sits out before TGI admits it."""
    case = {"running": 4, "waiting_served_ratio": 2.0, "max_waiting_tokens": 8, "burst": 4}
    value = int(predicted_decodes_sat_out(dict(case)))
    assert 0 <= value <= 8, "a count of decode steps, and max_waiting_tokens bounds how long TGI holds out"
    free = int(predicted_decodes_sat_out({**case, "waiting_served_ratio": 0.0}))
    assert free == 0, "with waiting_served_ratio 0, is any new batch too small?"


@question(
    "06.wait_measured",
    points=2,
    answers=["queue_waits"],
    forbid=refs("late_arrival"),
)
def _(queue_waits):
    """queue_waits(steps): per queued request (queue order), the decode steps planned while it waited."""
    steps = [
        {"kind": "prefill", "waiting": 2, "admitted": 2},
        {"kind": "decode", "waiting": 0, "admitted": 0},
    ]
    got = [int(w) for w in queue_waits([dict(s) for s in steps])]
    assert got == [0, 0], "two requests admitted by the first step waited through no decode"
    steps = [
        {"kind": "prefill", "waiting": 1, "admitted": 1},
        {"kind": "decode", "waiting": 1, "admitted": 0},
        {"kind": "prefill", "waiting": 1, "admitted": 1},
    ]
    got = [int(w) for w in queue_waits([dict(s) for s in steps])]
    assert len(got) == 2 and got[0] == 0, "one entry per request admitted, in the order they queued"


# --- 06.router_measured -----------------------------------------------------------------------


@question(
    "06.router_measured",
    points=2,
    answers=["mean_decode_batch"],
    forbid=refs("router_run"),
)
def _(mean_decode_batch):
    """mean_decode_batch(steps): requests in the batch at an average instant of decode time."""
    steps = [
        {"t": 0.0, "end": 0.2, "kind": "prefill", "batch_size": 2, "waiting": 0, "admitted": 2},
        {"t": 0.2, "end": 0.3, "kind": "decode", "batch_size": 2, "waiting": 0, "admitted": 0},
        {"t": 0.3, "end": 0.4, "kind": "decode", "batch_size": 2, "waiting": 0, "admitted": 0},
    ]
    value = float(mean_decode_batch([dict(s) for s in steps]))
    assert math.isfinite(value) and abs(value - 2.0) < 1e-9, "every decode step ran the same two requests"
    steps.append({"t": 0.4, "end": 0.5, "kind": "decode", "batch_size": 1, "waiting": 0, "admitted": 0})
    value = float(mean_decode_batch([dict(s) for s in steps]))
    assert 1.0 < value < 2.0, "a batch that shrinks lowers the mean"
