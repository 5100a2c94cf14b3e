"""The instructor's private folder: the seed, the signing key and the grading key, and the seeds each
notebook and its hidden cases get from them."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from .gradebook import (
    atomic_write,
)


def instructor_dir() -> Path:
    """The instructor's private folder (`LAB_INSTRUCTOR_DIR`, default ~/.config/llm-serving-lab/instructor)."""
    override = os.environ.get("LAB_INSTRUCTOR_DIR")
    return Path(override) if override else Path.home() / ".config" / "llm-serving-lab" / "instructor"


def _private_file(name: str, make, progress=print) -> str:
    path = instructor_dir() / name
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        value = make()
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        atomic_write(path, f"{value}\n")
        os.chmod(path, 0o600)
        progress(f"created {path}; keep that file private and keep it for regrades")
        return str(value)


def instructor_seed(progress=print) -> int:
    """The class's grading seed, kept in the instructor's folder and never in a learner's copy.

    Created at random on first use. Keep it: regrading with the same seed gives the same grades.
    """
    import secrets

    text = _private_file("seed", lambda: secrets.randbelow(2**31 - 1) + 1, progress)
    try:
        return int(text)
    except ValueError:
        path = instructor_dir() / "seed"
        raise ValueError(f"{path} should hold one integer (the grading seed); fix or delete it") from None


def signing_key(progress=print) -> bytes:
    """The key saved grades are signed with (instructor folder, created on first use)."""
    import secrets

    return _private_file("signing.key", lambda: secrets.token_hex(32), progress).encode()


def grading_key(progress=print) -> bytes:
    """The full-strength secret (32 random bytes, instructor folder, created on first use) that
    every notebook's SEED and every hidden case derive from; the grading seed only picks a variant,
    so a notebook that sees its SEED learns nothing it can search the seed space with."""
    import secrets

    text = _private_file("grading.key", lambda: secrets.token_hex(32), progress)
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        path = instructor_dir() / "grading.key"
        raise ValueError(f"{path} should hold 32 random bytes in hex (the grading key); fix or delete it")
    return key


SHORT_SEED_BITS = 64


def seed_warning(seed: int) -> str:
    """A note for an explicit --seed that an exhaustive search could cover (shorter than 64 bits)."""
    if abs(int(seed)).bit_length() >= SHORT_SEED_BITS:
        return ""
    return (
        f"warning: --seed {seed} is short ({abs(int(seed)).bit_length()} bits); it only selects a variant. "
        f"Scenarios and hidden cases are keyed by {instructor_dir() / 'grading.key'}: keep that file private "
        "and keep it for regrades"
    )


def job_seed(seed: int, student: str, lab: str, key: bytes | None = None) -> int:
    """The scenario seed one student's notebook of one lab runs with (never 0, the public seed):
    an HMAC of the grading key (`grading_key()` when not given) with the seed, student and lab."""
    key = grading_key() if key is None else key
    mac = hmac.new(key, f"scenario/{int(seed)}/{student}/{lab}".encode(), hashlib.sha256).digest()
    return int.from_bytes(mac[:4], "big") % (2**31 - 1) + 1


def hidden_key(seed: int, key: bytes) -> str:
    """The key the hidden checks draw their cases from: the grading key mixed with the seed."""
    return hmac.new(key, f"hidden/{int(seed)}".encode(), hashlib.sha256).hexdigest()
