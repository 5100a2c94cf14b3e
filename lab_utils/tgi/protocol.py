"""TGI's request validation and response shapes: what `/generate` accepts and what it answers.

Messages follow TGI's router (router/src/validation.rs, v3.3.7) so a learner sees the errors the
real server gives. Where the stand-in differs it says so in the message: it rejects unknown
parameters (real TGI ignores them) and the sampling options it does not implement.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .admission import TGIConfig

STAND_IN = "llm-serving-lab TGI-protocol stand-in"

# Every field of TGI's GenerateParameters; the `text-generation` client sends all of them, with nulls.
KNOWN_PARAMETERS = {
    "do_sample",
    "max_new_tokens",
    "repetition_penalty",
    "frequency_penalty",
    "return_full_text",
    "stop",
    "seed",
    "temperature",
    "top_k",
    "top_p",
    "truncate",
    "typical_p",
    "best_of",
    "watermark",
    "details",
    "decoder_input_details",
    "top_n_tokens",
    "grammar",
    "adapter_id",
}
# Accepted only at their neutral value: the course engine has no such sampling stage.
_UNSUPPORTED = {
    "repetition_penalty": None,
    "frequency_penalty": None,
    "typical_p": None,
    "watermark": False,
    "adapter_id": None,
}


class TGIError(Exception):
    """An error answered as TGI does: HTTP status and body {"error", "error_type"}."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message

    def body(self) -> dict:
        """The JSON body TGI sends."""
        return {"error": self.message, "error_type": self.error_type}


def validation(message: str) -> TGIError:
    """A 422 validation error."""
    return TGIError(422, "validation", message)


OVERLOADED = ("Model is overloaded", 429, "overloaded")

# TGI's `--payload-limit` default (bytes): a larger body is answered 413 before it is parsed.
PAYLOAD_LIMIT = 2_000_000
# serde_json's recursion limit, which TGI's router parses with: deeper JSON is a 422.
MAX_JSON_DEPTH = 128
# The smallest temperature the stand-in samples with: logits / 1e-300 overflow float32 to inf and
# softmax turns them into NaN (real TGI accepts any positive value and divides in float32 too).
MIN_TEMPERATURE = 1e-4
# A TGI seed is a u64.
MAX_SEED = 2**64 - 1
# Characters per token no tokenizer beats on text: a longer `inputs` cannot fit max_input_tokens,
# so it is refused before it is tokenized (the stand-in's guard on tokenizing work).
MAX_CHARS_PER_TOKEN = 64


def payload_too_large(limit: int) -> TGIError:
    """The 413 for a body over the payload limit."""
    return TGIError(
        413, "payload_limit", f"Payload too large: the body must be at most {limit} bytes (--payload-limit)"
    )


def _no_constant(name: str):
    raise ValueError(f"`{name}` is not valid JSON (non-finite numbers are rejected)")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"the number {text[:40]} overflows a 64-bit float")
    return v


def _depth(obj: Any) -> int:
    """How deeply lists and objects nest in `obj`, without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, d)
        if d > MAX_JSON_DEPTH:
            return d
        stack.extend((child, d + 1) for child in node if isinstance(child, (dict, list)))
    return deepest


def parse_body(raw: bytes) -> Any:
    """Parse a request body as TGI's router does; raises TGIError(422) for anything it refuses.

    NaN, Infinity and numbers that overflow a float are not JSON (serde_json refuses them), and
    nesting deeper than serde_json's limit is refused too.
    """
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise validation(
            f"Failed to deserialize the JSON body: recursion limit exceeded (nesting deeper than "
            f"{MAX_JSON_DEPTH})"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise validation(f"Failed to deserialize the JSON body: {e}") from None
    if _depth(body) > MAX_JSON_DEPTH:
        raise validation(
            f"Failed to deserialize the JSON body: recursion limit exceeded (nesting deeper than "
            f"{MAX_JSON_DEPTH})"
        )
    return body


@dataclass
class GenerateParams:
    """A validated request, ready for the engine."""

    input_ids: list[int]
    max_new_tokens: int
    temperature: float  # 0 = greedy
    top_k: int
    top_p: float
    seed: int | None
    stop: list[str]
    details: bool
    decoder_input_details: bool
    top_n_tokens: int
    best_of: int
    return_full_text: bool
    grammar: dict | None
    extra: dict = field(default_factory=dict)


def _int(params: dict, name: str) -> int | None:
    v = params.get(name)
    if v is None:
        return None
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (isinstance(v, float) and not math.isfinite(v))
        or int(v) != v
    ):
        raise validation(f"`{name}` must be an integer, got {_short(v)}")
    return int(v)


def _float(params: dict, name: str) -> float | None:
    v = params.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise validation(f"`{name}` must be a number, got {_short(v)}")
    try:
        f = float(v)
    except OverflowError:  # an integer too large for a float
        f = math.inf
    if not math.isfinite(f):
        raise validation(f"`{name}` must be a finite number, got {_short(v)}")
    return f


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def validate(body: Any, cfg: TGIConfig, tokenize, *, stream: bool) -> GenerateParams:
    """Check a `{"inputs", "parameters"}` body as TGI's router does; raises TGIError(422)."""
    if not isinstance(body, dict):
        raise validation('the body must be a JSON object {"inputs": ..., "parameters": {...}}')
    unknown = set(body) - {"inputs", "parameters", "stream"}
    if unknown:
        raise validation(
            f"unknown field(s) {sorted(unknown)} (the course stand-in rejects them; real TGI ignores them)"
        )
    inputs = body.get("inputs")
    if not isinstance(inputs, str):
        raise validation("`inputs` must be a string")
    if not inputs:
        raise validation("`inputs` cannot be empty")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise validation("`parameters` must be an object")
    unknown = set(params) - KNOWN_PARAMETERS
    if unknown:
        raise validation(
            f"unknown parameter(s) {sorted(unknown)} (the course stand-in rejects them; "
            "real TGI ignores them)"
        )
    for name, neutral in _UNSUPPORTED.items():
        if params.get(name, neutral) != neutral:
            raise validation(f"`{name}` is not implemented by the {STAND_IN} (real TGI supports it)")

    temperature = _float(params, "temperature")
    if temperature is not None and temperature <= 0:
        raise validation("`temperature` must be strictly positive")
    if temperature is not None and temperature < MIN_TEMPERATURE:
        raise validation(
            f"`temperature` must be >= {MIN_TEMPERATURE} in the {STAND_IN}: smaller values overflow "
            f"float32 logits (set do_sample=false for greedy). Given: {temperature!r}"
        )
    top_p = _float(params, "top_p")
    if top_p is not None and not 0 < top_p < 1:
        raise validation("`top_p` must be > 0.0 and < 1.0")
    top_k = _int(params, "top_k")
    if top_k is not None and top_k <= 0:
        raise validation("`top_k` must be strictly positive")
    seed = _int(params, "seed")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise validation(f"`seed` must be between 0 and 2**64-1 (a u64). Given: {_short(seed)}")
    do_sample = bool(params.get("do_sample") or False)
    # TGI samples when do_sample is set or any warper is given (server/.../utils/tokens.py).
    sampling = do_sample or temperature is not None or top_p is not None or top_k is not None

    best_of = _int(params, "best_of") or 1
    if not 0 < best_of <= cfg.max_best_of:
        raise validation(f"`best_of` must be > 0 and <= {cfg.max_best_of}. Given: {best_of}")
    if best_of > 1:
        if stream:
            raise validation("`best_of` != 1 is not supported when streaming tokens")
        if seed is not None:
            raise validation("`seed` must not be set when `best_of` > 1")
        if not sampling:
            raise validation("you must use sampling when `best_of` is > 1")

    top_n = _int(params, "top_n_tokens") or 0
    if not 0 <= top_n <= cfg.max_top_n_tokens:
        raise validation(f"`top_n_tokens` must be >= 0 and <= {cfg.max_top_n_tokens}. Given: {top_n}")
    decoder_input_details = bool(params.get("decoder_input_details") or False)
    if decoder_input_details and stream:
        raise validation("`decoder_input_details` == true is not supported when streaming tokens")

    stop = params.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise validation("`stop` must be a list of non-empty strings")
    if len(stop) > cfg.max_stop_sequences:
        raise validation(f"`stop` supports up to {cfg.max_stop_sequences} stop sequences. Given: {len(stop)}")

    truncate = _int(params, "truncate")
    if truncate is not None and not 0 < truncate <= cfg.max_input_tokens:
        raise validation(
            f"`truncate` must be strictly positive and less than {cfg.max_input_tokens}. Given: {truncate}"
        )
    max_new = _int(params, "max_new_tokens")
    if max_new is not None and max_new <= 0:
        raise validation("`max_new_tokens` must be strictly positive")
    if max_new is not None and max_new >= cfg.max_total_tokens:  # no prompt leaves room for it
        raise validation(
            f"`inputs` tokens + `max_new_tokens` must be <= {cfg.max_total_tokens}. "
            f"Given: {_short(max_new)} `max_new_tokens`"
        )
    max_chars = cfg.max_input_tokens * MAX_CHARS_PER_TOKEN
    if truncate is None and len(inputs) > max_chars:
        raise validation(
            f"`inputs` must have less than {cfg.max_input_tokens} tokens. Given: {len(inputs)} characters, "
            f"more than {MAX_CHARS_PER_TOKEN} per allowed token (refused before tokenizing)"
        )
    if truncate is not None and len(inputs) > truncate * MAX_CHARS_PER_TOKEN:
        # only the end is kept: the last characters tokenize to the same last tokens
        inputs = inputs[-truncate * MAX_CHARS_PER_TOKEN :]
    ids = list(tokenize(inputs))
    if truncate is not None:
        ids = ids[-truncate:]
    if max_new is None:
        max_new = cfg.max_total_tokens - len(ids)  # TGI's default: whatever room is left
    if max_new <= 0:
        raise validation("`max_new_tokens` must be strictly positive")
    if len(ids) > cfg.max_input_tokens:
        raise validation(f"`inputs` must have less than {cfg.max_input_tokens} tokens. Given: {len(ids)}")
    if len(ids) + max_new > cfg.max_total_tokens:
        raise validation(
            f"`inputs` tokens + `max_new_tokens` must be <= {cfg.max_total_tokens}. "
            f"Given: {len(ids)} `inputs` tokens and {max_new} `max_new_tokens`"
        )
    grammar = params.get("grammar")
    if grammar is not None and not isinstance(grammar, dict):
        raise validation('grammar is not valid: expected {"type", "value"}')
    return GenerateParams(
        input_ids=ids,
        max_new_tokens=max_new,
        temperature=(temperature or 1.0) if sampling else 0.0,
        top_k=top_k or 0,
        top_p=top_p or 1.0,
        seed=seed,
        stop=stop,
        details=bool(params.get("details") or False),
        decoder_input_details=decoder_input_details,
        top_n_tokens=top_n,
        best_of=best_of,
        return_full_text=bool(params.get("return_full_text") or False),
        grammar=grammar,
    )
