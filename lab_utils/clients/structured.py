"""Structured-output requests sent the same way to every back-end (lab 05, section 6).

vLLM 0.32 picks the structured-output back-end per server (`backend_args`), not per request, so
comparing back-ends means one server each; the requests, their validators and the timing are
here so every server gets exactly the same ones.

`SUITE` holds a choice, a regex and a JSON-schema request; `timed_request` streams one and
returns its text, finish reason and time to first token (which includes compiling the grammar
the first time the server sees it); `run_suite` sends each request twice (a new grammar, then
the same one again, from vLLM's grammar cache). `TRAP_SCHEMA` is the truncation trap: an integer
with no bound, which the course model fills with digits until `max_tokens`; `FIXED_SCHEMAS` are
two fixes in the schema (an integer maximum, and a string with a digit pattern).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FIXED_SCHEMAS",
    "SUITE",
    "TRAP_PROMPT",
    "TRAP_SCHEMA",
    "StructuredRequest",
    "backend_args",
    "json_schema_body",
    "run_suite",
    "timed_request",
]


def backend_args(backend: str) -> list[str]:
    """vLLM server flags that pin the structured-output back-end (for VLLMServer(extra_args=...))."""
    return ["--structured-outputs-config", json.dumps({"backend": backend})]


def json_schema_body(name: str, schema: dict) -> dict:
    """The OpenAI `response_format` for a JSON schema."""
    return {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}}


@dataclass(frozen=True)
class StructuredRequest:
    kind: str  # "choice", "regex" or "json"
    prompt: str
    body: dict  # keyword arguments of chat.completions.create (extra_body or response_format)
    valid: Callable[[str], bool]  # does the text satisfy the constraint?


def _json_valid(text: str) -> bool:
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return (
        isinstance(obj, dict)
        and set(obj) == {"airport", "terminal"}
        and isinstance(obj["airport"], str)
        and len(obj["airport"]) <= 40
        and isinstance(obj["terminal"], int)
        and not isinstance(obj["terminal"], bool)
        and 1 <= obj["terminal"] <= 9
    )


_CHOICES = ["yes", "no", "maybe"]
_FLIGHT = r"[A-Z]{2}[0-9]{3,4}"
_AIRPORT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["airport", "terminal"],
    "properties": {
        "airport": {"type": "string", "maxLength": 40},
        "terminal": {"type": "integer", "minimum": 1, "maximum": 9},
    },
}

SUITE: list[StructuredRequest] = [
    StructuredRequest(
        "choice",
        "Will it rain in London tomorrow? Answer yes, no or maybe.",
        {"extra_body": {"structured_outputs": {"choice": _CHOICES}}},
        lambda t: t in _CHOICES,
    ),
    StructuredRequest(
        "regex",
        "Invent a flight number.",
        {"extra_body": {"structured_outputs": {"regex": _FLIGHT}}},
        lambda t: re.fullmatch(_FLIGHT, t) is not None,
    ),
    StructuredRequest(
        "json",
        "Name the main airport of Paris and one of its terminals, in JSON.",
        json_schema_body("airport", _AIRPORT),
        _json_valid,
    ),
]

TRAP_PROMPT = "What is the population of China? Answer in JSON."
TRAP_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["population"],
    "properties": {"population": {"type": "integer"}},
}
FIXED_SCHEMAS = {
    "integer with a maximum": {
        **TRAP_SCHEMA,
        "properties": {"population": {"type": "integer", "minimum": 0, "maximum": 10**12}},
    },
    "string of at most 12 digits": {
        **TRAP_SCHEMA,
        "properties": {"population": {"type": "string", "pattern": "^[0-9]{1,12}$"}},
    },
}


def timed_request(client, model: str, prompt: str, body: dict, max_tokens: int = 24) -> dict[str, Any]:
    """Stream one greedy chat request: text, finish reason, time to first token and total (s)."""
    t0 = time.perf_counter()
    first, parts, finish = None, [], None
    stream = client.chat.completions.create(
        model=model,
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        messages=[{"role": "user", "content": prompt}],
        **body,
    )
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.delta.content:
            if first is None:
                first = time.perf_counter() - t0
            parts.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
    return {"text": "".join(parts), "finish": finish, "ttft_s": first, "total_s": time.perf_counter() - t0}


def run_suite(
    client, model: str, backend: str, max_tokens: int = 24, what: str | None = None
) -> list[dict[str, Any]]:
    """Each request of SUITE twice (first: the grammar is new to the server; then: cached).

    `what`: print done/total and the time left under that label as the requests finish
    (lab_utils.notebook.progress); None: silent.
    """
    from lab_utils.notebook import progress

    pairs = [(req, attempt) for req in SUITE for attempt in ("first", "repeat")]
    records = []
    for req, attempt in progress(pairs, what):
        rec = timed_request(client, model, req.prompt, req.body, max_tokens)
        rec.update(backend=backend, kind=req.kind, attempt=attempt, valid=req.valid(rec["text"]))
        records.append(rec)
    return records
