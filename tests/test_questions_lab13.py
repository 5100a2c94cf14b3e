"""Lab 13's hidden checks in process: the published solution passes each, a typical mistake fails."""

from __future__ import annotations

import math
import random
from pathlib import Path

import nbformat
import pytest

import grader.hidden.lab13  # noqa: F401  (registers the hidden checks)
from grader.registry import hidden_check
from lab_utils.grading import questions_for

REPO = Path(__file__).resolve().parent.parent


def _solution() -> dict:
    nb = nbformat.read(str(REPO / "solutions" / "13_mixture_of_experts.ipynb"), as_version=4)
    ns: dict = {"math": math}
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith("def "):
            exec(cell.source, ns)
    return ns


SOLUTION = _solution()
QUESTIONS = {q.id: q for q in questions_for("13")}


def _passes(qid: str, answers: dict) -> bool:
    try:
        hidden_check(qid)(*[answers[a] for a in QUESTIONS[qid].answers], rng=random.Random(7), scenario={})
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("qid", sorted(QUESTIONS))
def test_solution_passes_hidden(qid):
    assert _passes(qid, SOLUTION)


def _all_experts_active(config):
    total, _ = SOLUTION["param_counts"](config)
    return total, total


def _heads_for_mla(config, dtype_bytes, context_len):
    c = {k: v for k, v in config.items() if k != "kv_lora_rank"}
    return SOLUTION["kv_bytes_per_token"](c, dtype_bytes, context_len)


def _top_k_experts_read(model, batch):  # forgets that a batch touches more experts than one token
    m = model
    dense = (m["shared_bytes"] + m["expert_bytes"]) / m["bytes_per_s"]
    return dense / ((m["shared_bytes"] + m["top_k"] * m["expert_bytes"]) / m["bytes_per_s"])


def _argmax_only(logits, top_k):
    return SOLUTION["expert_load"](logits, 1)


def _no_replicas(loads, num_gpus, slots_per_gpu):
    order = sorted(range(len(loads)), key=lambda e: -loads[e])
    gpus = [[] for _ in range(num_gpus)]
    for i in range(num_gpus * slots_per_gpu):
        gpus[i % num_gpus].append(order[i % len(order)])
    return gpus


def _local_counted(config, ep_size, d, c):
    top = config.get("num_experts_per_tok") or config.get("experts_per_token")
    return top * config["hidden_size"] * d, top * config["hidden_size"] * c


def _capacity_per_token(counts, top_k, factor):  # capacity from tokens, forgetting top_k copies
    cap = math.ceil(factor * (sum(counts) / top_k) / len(counts))
    return sum(max(0, x - cap) for x in counts), sum(max(0, cap - x) for x in counts)


MISTAKES = {
    "13.param_counts": {"param_counts": _all_experts_active},
    "13.kv_per_token": {"kv_bytes_per_token": _heads_for_mla},
    "13.predict_speed": {"predict_speed_ratio": _top_k_experts_read},
    "13.expert_load": {"expert_load": _argmax_only},
    "13.placement": {"place_experts": _no_replicas},
    "13.a2a_bytes": {"a2a_bytes": _local_counted},
    "13.capacity": {"capacity_drops": _capacity_per_token},
}


@pytest.mark.parametrize("qid", sorted(MISTAKES))
def test_typical_mistake_fails_hidden(qid):
    assert not _passes(qid, MISTAKES[qid])


def _capacity_exact(counts, top_k, factor):  # the text's rule in exact arithmetic, not floats
    from fractions import Fraction

    cap = math.ceil(Fraction(str(factor)) * sum(counts) / len(counts))
    return sum(max(0, x - cap) for x in counts), sum(max(0, cap - x) for x in counts)


def test_capacity_written_in_exact_arithmetic_passes_under_many_keys():
    """At factor 1.1 a whole capacity (1.1 x 200 / 4 = 55) comes out 56 in floats: the hidden
    cases leave such histograms out, so a correct answer in any arithmetic passes (21 of 300 keys
    failed it before)."""
    for seed in range(60):
        hidden_check("13.capacity")(_capacity_exact, rng=random.Random(seed), scenario={})
