"""lab_utils.clients.structured: the requests every back-end gets (no server needed)."""

import json

from lab_utils.clients.structured import FIXED_SCHEMAS, SUITE, TRAP_SCHEMA, backend_args, json_schema_body


def test_backend_args_pin_the_backend():
    flag, value = backend_args("outlines")
    assert flag == "--structured-outputs-config" and json.loads(value) == {"backend": "outlines"}


def test_suite_validators_accept_and_refuse():
    by_kind = {r.kind: r for r in SUITE}
    assert set(by_kind) == {"choice", "regex", "json"}
    assert by_kind["choice"].valid("maybe") and not by_kind["choice"].valid("Maybe.")
    assert by_kind["regex"].valid("AF1234") and not by_kind["regex"].valid("af12")
    good = json.dumps({"airport": "Charles de Gaulle", "terminal": 2})
    assert by_kind["json"].valid(good)
    assert not by_kind["json"].valid(good[:-1])  # cut short: not JSON
    assert not by_kind["json"].valid(json.dumps({"airport": "CDG", "terminal": 12}))
    assert not by_kind["json"].valid(json.dumps({"airport": "CDG", "terminal": True}))


def test_fixed_schemas_bound_the_value_and_keep_the_shape():
    jsonschema = __import__("pytest").importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(TRAP_SCHEMA)
    endless = {"population": int("1" * 40)}
    assert jsonschema.Draft202012Validator(TRAP_SCHEMA).is_valid(endless)
    for name, schema in FIXED_SCHEMAS.items():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["required"] == TRAP_SCHEMA["required"], name
        v = jsonschema.Draft202012Validator(schema)
        assert not v.is_valid(endless) and not v.is_valid({"population": "1" * 40}), name
    body = json_schema_body("p", TRAP_SCHEMA)["response_format"]
    assert body["type"] == "json_schema" and body["json_schema"]["schema"] is TRAP_SCHEMA
