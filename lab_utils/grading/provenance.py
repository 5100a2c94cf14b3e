"""Proof that a measured answer came out of the lab's own measuring code in this run.

Measuring code (a load test, a trace recorder, a metrics scrape) calls `stamp(obj)` on the object
it returns. The stamp is an HMAC of the object's raw samples under a key the grader sets for each
run (`LAB_PROVENANCE_KEY`; outside the grader a key kept in the course cache). A hidden check calls
`verify(obj)` and then re-derives the figure it grades from the raw samples, so neither a
hand-written dict nor an edited sample list passes.

An object is stampable when it has a `raw_samples()` method returning JSON-able data, or is a
dict/dataclass; the stamp is kept in its `provenance` attribute (or `"provenance"` key).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import threading

ENV = "LAB_PROVENANCE_KEY"
_LOCAL = threading.local()  # the instructor's judge verifies each run with that run's key


@contextlib.contextmanager
def using_key(key: str):
    """Verify (and stamp) with `key` in this thread for the duration (the judge, per notebook)."""
    old = getattr(_LOCAL, "key", None)
    _LOCAL.key = key
    try:
        yield
    finally:
        _LOCAL.key = old


def _key() -> bytes:
    key = getattr(_LOCAL, "key", None) or os.environ.get(ENV)
    if key:
        return key.encode()
    try:
        from ..models import cache_dir

        path = cache_dir() / "provenance.key"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_hex(16))
        return path.read_text().strip().encode()
    except OSError:
        return b"llm-serving-lab-local"


def _raw(obj):
    if hasattr(obj, "raw_samples"):
        return obj.raw_samples()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        d = dataclasses.asdict(obj)
    elif isinstance(obj, dict):
        d = dict(obj)
    else:
        raise TypeError(f"cannot stamp a {type(obj).__name__}: give it a raw_samples() method")
    d.pop("provenance", None)
    return d


def digest(obj) -> str:
    """The HMAC of `obj`'s raw samples under this run's key."""
    payload = json.dumps(_raw(obj), sort_keys=True, default=repr).encode()
    return hmac.new(_key(), payload, hashlib.sha256).hexdigest()


def stamp(obj):
    """Mark `obj` as produced by the lab's measuring code in this run; returns `obj`."""
    value = digest(obj)
    if isinstance(obj, dict):
        obj["provenance"] = value
    else:
        object.__setattr__(obj, "provenance", value)  # frozen dataclasses too
    return obj


def verify(obj) -> bool:
    """True when `obj` carries a valid stamp for its current raw samples."""
    try:
        claimed = obj.get("provenance") if isinstance(obj, dict) else getattr(obj, "provenance", None)
        return isinstance(claimed, str) and hmac.compare_digest(claimed, digest(obj))
    except Exception:
        return False
