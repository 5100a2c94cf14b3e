""" "With your numbers": lab 11's questions filled in with the figures labs 00-10 recorded.

Each lab's closing table records its figures in the course results file (`lab_utils.results`).
`your_numbers()` finds the figures lab 11 asks about (by lab and by words in the quantity's name)
and writes each question with the learner's own values. A figure that was never recorded is
reported as missing, with the lab that measures it; nothing is invented.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ask:
    """One question that needs a measured figure."""

    key: str
    labs: tuple[str, ...]  # labs that measure it, most likely first
    words: tuple[str, ...]  # each must appear in the quantity's name (lower case); "a|b" accepts either
    template: str  # {value}, {unit}, {predicted}, {lab} are filled in
    missing: str


ASKS = [
    Ask(
        "continuous_gain",
        ("03", "04", "05"),
        ("continuous",),
        "In lab {lab} you measured continuous batching at {value} {unit} over static (you predicted "
        "{predicted}). The seed says '~10x' for 7 requests of 50 tokens and one of 500; the max/mean model "
        "says 4.7x for that mix in steady state with a backlog. Explain your figure: the spread of your output lengths, the part of a step "
        "that grows with the batch (on this CPU a decode step is not free per row), prefill, and the drain "
        "at the end when only the long requests are left.",
        "No continuous-batching gain recorded yet: lab 03 measures static against continuous batching.",
    ),
    Ask(
        "decode_tokens_per_s",
        ("04", "05", "00"),
        ("decode|tokens/s",),
        "In lab {lab} you measured {value} {unit}. This CPU reads memory at about 30 GB/s and the course "
        "model's float32 weights are 538 MB: what is the batch-1 bound, and which batch makes it compute-bound "
        "at about 170 GFLOP/s? Place your figure between the two and say what limits it.",
        "No decode throughput recorded yet: labs 00 (batch 1), 04 (course engine) and 05 (vLLM) measure it.",
    ),
    Ask(
        "ttft",
        ("05", "09", "03"),
        ("ttft",),
        "In lab {lab} your TTFT was {value} {unit}. How much of it is prefill (2 FLOPs per parameter per prompt "
        "token at this CPU's rate) and how much is queueing? Use Little's law on the load you ran.",
        "No TTFT recorded yet: labs 05 and 09 measure it under load.",
    ),
    Ask(
        "kv_capacity",
        ("01", "02", "05"),
        ("kv",),
        "In lab {lab} you recorded {value} {unit} for the KV cache (you predicted {predicted}). Where do the "
        "two differ, and what does block rounding and the null block change?",
        "No KV-cache figure recorded yet: lab 01 checks the calculator against vLLM's own capacity line.",
    ),
    Ask(
        "prefix_hits",
        ("02", "05"),
        ("prefix",),
        "In lab {lab} prefix caching gave {value} {unit}. With the CPU block of 128 tokens, what shared-prefix "
        "length would have doubled it?",
        "No prefix-cache figure recorded yet: lab 02 measures vLLM's prefix-cache hits.",
    ),
    Ask(
        "dynamic_batch",
        ("07",),
        ("average batch",),
        "In lab {lab} Triton's dynamic batcher formed batches of {value} {unit} on average (you predicted "
        "{predicted}). With Little's law, how many requests were waiting when each batch formed, and what "
        "would a longer max_queue_delay_microseconds buy and cost?",
        "No dynamic-batching figure recorded yet: lab 07 measures Triton's average batch.",
    ),
]


def _fmt(value) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def find(results: dict, ask: Ask) -> tuple[str, dict] | None:
    """The first recorded entry matching `ask`: (lab, entry), or None."""
    labs = list(ask.labs) + sorted(lab for lab in results if lab not in ask.labs and lab != "11")
    for lab in labs:
        for entry in (results.get(lab) or {}).values():
            name = str(entry.get("quantity", "")).lower() if isinstance(entry, dict) else ""
            matches = all(any(alt in name for alt in w.split("|")) for w in ask.words)
            if name and matches and entry.get("value") is not None:
                return lab, entry
    return None


def your_numbers(results: dict | None = None) -> list[dict]:
    """For each question: its key, whether a figure was found, and the question or the missing note."""
    if results is None:
        from lab_utils.results import load_results

        results = load_results()
    out = []
    for ask in ASKS:
        hit = find(results, ask)
        if hit is None:
            out.append({"key": ask.key, "found": False, "lab": None, "text": ask.missing})
            continue
        lab, e = hit
        text = ask.template.format(
            lab=lab, value=_fmt(e.get("value")), unit=e.get("unit") or "", predicted=_fmt(e.get("predicted"))
        )
        out.append({"key": ask.key, "found": True, "lab": lab, "text": text, "entry": e})
    return out
