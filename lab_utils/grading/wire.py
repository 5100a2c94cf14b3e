"""The plain-data form in which the judge and a sandboxed runner exchange values (JSON lines).

The judge (the instructor's `grader` package, outside the sandbox) never unpickles or imports what
comes out of a sandbox: results travel as JSON built from numbers, strings, lists and dicts, plus a
few tagged forms that the receiver rebuilds from plain fields:

    {"$t": "tuple", "v": [...]}                 a tuple
    {"$t": "dict", "v": [[k, v], ...]}          a dict whose keys are not all strings
    {"$t": "float", "v": "nan" | "inf" | "-inf"} a non-finite float
    {"$t": "bytes", "v": "<base64>"}            bytes
    {"$t": "array", "v": [...], "dtype": "f8"}  a numpy array (or a torch tensor, sent as numpy)
    {"$t": "dc", "cls": "mod:Name", "v": {...}} a dataclass of the course library (lab_utils),
                                                 rebuilt field by field, never unpickled
    {"$t": "enum", "cls": "mod:Name", "v": "NAME"}  a course library enum member
    {"$t": "handle", "id": 7, "type": "MyCls"}  an object that stays where it lives (a learner's
                                                 function, class or instance); the other side holds
                                                 only its number and asks for attributes and calls

What the judge sends *into* a sandbox may also be `{"$t": "pickle", "v": ..., "mirror": n}`:
an object of its own (a course `Request` a check drives a learner's class with). Pickles only ever
travel into the sandbox, never out of it.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import importlib
import json
import math
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 40
MAX_LINE = 32 * 2**20  # bytes in one message; a longer one is malformed


class WireError(ValueError):
    """A message that is not well-formed plain data."""


def _qualname(obj_type: type) -> str:
    return f"{obj_type.__module__}:{obj_type.__qualname__}"


def course_type(spec: str) -> type | None:
    """The course-library class `spec` ("module:Name") names, or None when it is not one.

    Only classes defined in `lab_utils` are ever rebuilt from a message; anything else stays a handle.
    """
    module, _, name = spec.partition(":")
    if not module.startswith("lab_utils.") or "<" in name:
        return None
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except Exception:
        return None
    if not isinstance(obj, type) or getattr(obj, "__module__", "") != module:
        return None
    return obj


def encode(value: Any, to_handle: Callable[[Any], dict], depth: int = 0, plain_only: bool = False) -> Any:
    """`value` as plain JSON-able data; what cannot travel as data becomes `to_handle(value)`.

    With `plain_only`, everything but None, bools, ints, floats, strings, bytes, lists, tuples and
    dicts goes to `to_handle` (the judge sends its own objects into the sandbox that way)."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if value is None or isinstance(value, (bool, str)) or type(value) is int:
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"$t": "float", "v": repr(value)}
    if isinstance(value, enum.Enum) and course_type(_qualname(type(value))) is type(value):
        return {"$t": "enum", "cls": _qualname(type(value)), "v": value.name}
    if type(value) is list:
        return [encode(v, to_handle, depth + 1, plain_only) for v in value]
    if type(value) is tuple:
        return {"$t": "tuple", "v": [encode(v, to_handle, depth + 1, plain_only) for v in value]}
    if type(value) is dict:
        if all(type(k) is str and k != "$t" for k in value):
            return {k: encode(v, to_handle, depth + 1, plain_only) for k, v in value.items()}
        return {
            "$t": "dict",
            "v": [
                [encode(k, to_handle, depth + 1, plain_only), encode(v, to_handle, depth + 1, plain_only)]
                for k, v in value.items()
            ],
        }
    if type(value) in (bytes, bytearray):
        return {"$t": "bytes", "v": base64.b64encode(bytes(value)).decode()}
    if plain_only:
        return to_handle(value)
    cls = type(value)
    mod = getattr(cls, "__module__", "") or ""
    if mod == "numpy" or mod.startswith("numpy."):
        import numpy as np

        if isinstance(value, np.generic):
            return encode(value.item(), to_handle, depth + 1, plain_only)
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and value.size <= 10_000_000:
            return {
                "$t": "array",
                "v": encode(value.tolist(), to_handle, depth + 1, plain_only),
                "dtype": value.dtype.str,
            }
    if mod.startswith("torch"):
        try:
            import torch

            if isinstance(value, torch.Tensor):
                return encode(value.detach().cpu().numpy(), to_handle, depth + 1, plain_only)
        except Exception:  # a tensor numpy cannot hold (bf16): a handle, read by attribute
            pass
    if dataclasses.is_dataclass(value) and course_type(_qualname(cls)) is cls:
        fields = {
            f.name: encode(getattr(value, f.name), to_handle, depth + 1, plain_only)
            for f in dataclasses.fields(value)
        }
        return {"$t": "dc", "cls": _qualname(cls), "v": fields}
    return to_handle(value)


def decode(data: Any, from_tag: Callable[[dict], Any], depth: int = 0) -> Any:
    """The value `data` (from `encode`) stands for; tags other than the plain ones go to `from_tag`."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode(v, from_tag, depth + 1) for v in data]
    if not isinstance(data, dict):
        raise WireError(f"unexpected {type(data).__name__} in a message")
    tag = data.get("$t")
    if tag is None:
        return {k: decode(v, from_tag, depth + 1) for k, v in data.items()}
    if tag == "tuple":
        return tuple(decode(v, from_tag, depth + 1) for v in _list(data))
    if tag == "dict":
        out = {}
        for pair in _list(data):
            if not isinstance(pair, list) or len(pair) != 2:
                raise WireError("a dict entry must be a [key, value] pair")
            key = decode(pair[0], from_tag, depth + 1)
            try:
                out[key] = decode(pair[1], from_tag, depth + 1)
            except TypeError:
                raise WireError("a dict key that cannot be hashed") from None
        return out
    if tag == "float":
        if data.get("v") not in ("nan", "inf", "-inf"):
            raise WireError("a float tag holds nan, inf or -inf")
        return float(data["v"])
    if tag == "bytes":
        try:
            return base64.b64decode(str(data.get("v", "")), validate=True)
        except Exception:
            raise WireError("bytes that are not base64") from None
    if tag == "array":
        import numpy as np

        dtype = str(data.get("dtype", "f8"))
        if not (len(dtype) <= 4 and dtype.lstrip("<>|=")[:1] in ("b", "i", "u", "f")):
            raise WireError(f"array dtype {dtype!r} is not a number type")
        try:
            return np.asarray(decode(data.get("v"), from_tag, depth + 1), dtype=np.dtype(dtype))
        except (TypeError, ValueError):
            raise WireError("an array whose values do not fit its dtype") from None
    if tag == "enum":
        cls = course_type(str(data.get("cls", "")))
        if cls is None or not issubclass(cls, enum.Enum) or str(data.get("v")) not in cls.__members__:
            raise WireError(f"not a course enum member: {data.get('cls')!r}")
        return cls[str(data["v"])]
    if tag == "dc":
        cls = course_type(str(data.get("cls", "")))
        fields = data.get("v")
        if cls is None or not dataclasses.is_dataclass(cls) or not isinstance(fields, dict):
            raise WireError(f"not a course dataclass: {data.get('cls')!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        obj = object.__new__(cls)
        for k, v in fields.items():
            if k not in names:
                raise WireError(f"{cls.__name__} has no field {k!r}")
            object.__setattr__(obj, k, decode(v, from_tag, depth + 1))
        return obj
    return from_tag(data)


def _list(data: dict) -> list:
    v = data.get("v")
    if not isinstance(v, list):
        raise WireError(f"tag {data.get('$t')!r} needs a list")
    return v


def dumps(message: dict) -> bytes:
    """One message as a JSON line (non-finite floats were tagged by `encode`)."""
    return json.dumps(message, allow_nan=False, separators=(",", ":")).encode() + b"\n"


def loads(line: bytes) -> dict:
    """One message from a JSON line; WireError when it is not a well-formed message."""
    if len(line) > MAX_LINE:
        raise WireError(f"a message over {MAX_LINE // 2**20} MB")

    def no_constants(name: str):
        raise WireError(f"{name} is not plain JSON")

    try:
        message = json.loads(line, parse_constant=no_constants)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON: {str(exc)[:80]}") from None
    if not isinstance(message, dict):
        raise WireError("a message is a JSON object")
    return message
