"""The small training sets the course makes for its LoRA adapters: no download, same every time.

Every example is a plain completion prompt and its target, in one fixed format the adapters are
trained on and served with (vLLM's `/v1/completions`, no chat template: shorter sequences train
faster on a CPU):

    Question: What is the capital of France?
    Answer: {"country": "France", "capital": "Paris"}          <- the "json" adapter
    Answer: THE CAPITAL OF FRANCE IS PARIS.                    <- the "upper" adapter

Each task is easy to check by eye and by code: the JSON adapter's answers parse with json.loads;
the upper-case adapter's answers have no lower-case letter.
"""

from __future__ import annotations

import json

# (country, capital): the facts the model already knows; the adapters change only the form.
CAPITALS: list[tuple[str, str]] = [
    ("France", "Paris"),
    ("Germany", "Berlin"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Japan", "Tokyo"),
    ("Egypt", "Cairo"),
    ("Canada", "Ottawa"),
    ("Russia", "Moscow"),
    ("China", "Beijing"),
    ("Greece", "Athens"),
    ("Portugal", "Lisbon"),
    ("Austria", "Vienna"),
    ("Norway", "Oslo"),
    ("Sweden", "Stockholm"),
    ("Poland", "Warsaw"),
    ("Ireland", "Dublin"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Cuba", "Havana"),
    ("Chile", "Santiago"),
]

# The countries held out of training: a test asks about these, so an adapter must generalise the form.
HELD_OUT = ("Turkey", "Ankara"), ("Finland", "Helsinki"), ("Hungary", "Budapest")

TASKS = ("json", "upper")


def prompt(country: str) -> str:
    """The completion prompt both adapters are trained on and served with."""
    return f"Question: What is the capital of {country}?\nAnswer:"


def target(task: str, country: str, capital: str) -> str:
    """What the adapter for `task` should write after the prompt (with a leading space and a newline)."""
    if task == "json":
        return " " + json.dumps({"country": country, "capital": capital}) + "\n"
    if task == "upper":
        return f" THE CAPITAL OF {country.upper()} IS {capital.upper()}.\n"
    raise ValueError(f"unknown task {task!r}; the course trains {list(TASKS)}")


def examples(task: str) -> list[tuple[str, str]]:
    """(prompt, target) pairs for `task`, one per country in CAPITALS."""
    return [(prompt(c), target(task, c, cap)) for c, cap in CAPITALS]


def follows(task: str, text: str) -> bool:
    """True when a generated answer has the form `task` asks for (its first line is checked)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if task == "json":
        try:
            value = json.loads(line)
        except ValueError:
            return False
        return isinstance(value, dict) and "capital" in value
    if task == "upper":
        return any(ch.isalpha() for ch in line) and not any(ch.islower() for ch in line)
    raise ValueError(f"unknown task {task!r}; the course trains {list(TASKS)}")
