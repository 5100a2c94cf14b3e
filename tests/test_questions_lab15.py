"""Lab 15's hidden checks, in process (fast): the published solution's answers pass every one under
two seeds, and a typical mistake in each fails its check (the grade tells the mistake from the answer)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import nbformat
import pytest

from grader.registry import hidden_check
from lab_utils.grading import get, lab_scenario

SOLUTION = Path(__file__).resolve().parents[1] / "solutions" / "15_reasoning_agents.ipynb"
QUESTIONS = {
    "15.split_output": "split_output",
    "15.session_hits": "session_hits",
    "15.session_cost": "session_cost",
    "15.budget_cut": "budget_cut",
}


@pytest.fixture(scope="module")
def solution() -> dict:
    """The solution's answer functions (the cells that define them, run alone)."""
    ns: dict = {"__name__": "__main__"}
    for cell in nbformat.read(str(SOLUTION), as_version=4).cells:
        if cell.cell_type == "code" and any(cell.source.startswith(f"def {n}(") for n in QUESTIONS.values()):
            exec(compile(cell.source, "<solution>", "exec"), ns)
    assert set(QUESTIONS.values()) <= set(ns)
    return ns


def _run(qid: str, answer, seed: int = 3) -> bool:
    try:
        hidden_check(qid)(answer, rng=random.Random(seed), scenario=lab_scenario("15", 0))
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("seed", [3, 20261201])
@pytest.mark.parametrize("qid", sorted(QUESTIONS))
def test_the_solution_passes_the_public_and_hidden_checks(qid, seed, solution):
    answer = solution[QUESTIONS[qid]]
    get(qid).fn(answer)
    assert _run(qid, answer, seed)


def test_keeping_the_good_calls_when_one_is_malformed_fails(solution):
    def split(text):  # hermes gives up on every call when one does not parse; this keeps the rest
        got = solution["split_output"](text)
        if got["tool_calls"] or not got["content"] or "<tool_call>" not in got["content"]:
            return got
        calls = []
        for part in got["content"].split("<tool_call>")[1:]:
            try:
                obj = json.loads(part.split("</tool_call>")[0])
                calls.append({"name": obj["name"], "arguments": obj["arguments"]})
            except (ValueError, KeyError, TypeError):
                continue
        if calls:
            got = dict(got, tool_calls=calls, content=got["content"].split("<tool_call>")[0] or None)
        return got

    assert not _run("15.split_output", split)


def test_an_unclosed_think_read_as_the_answer_fails(solution):
    def split(text):
        if "</think>" not in text:
            return {"reasoning": None, "content": text.replace("<think>", "", 1), "tool_calls": []}
        return solution["split_output"](text)

    assert not _run("15.split_output", split)


def test_hitting_the_whole_prompt_fails():
    def hits(trace, n, policy, bs):  # forgets that the last prompt token is always computed
        held, home, out = [set() for _ in range(n)], {}, []
        for i, r in enumerate(trace):
            rep = home.setdefault(r["session"], len(home) % n) if policy == "session" else i % n
            chains = [tuple(r["tokens"][: (k + 1) * bs]) for k in range(len(r["tokens"]) // bs)]
            k = 0
            while k < len(chains) and chains[k] in held[rep]:
                k += 1
            out.append(k * bs)
            held[rep].update(chains)
        return out

    assert not _run("15.session_hits", hits)


def test_ignoring_the_routing_policy_fails(solution):
    def hits(trace, n, policy, bs):
        return solution["session_hits"](trace, n, "round_robin", bs)

    assert not _run("15.session_hits", hits)


def test_writing_the_whole_prompt_every_turn_fails(solution):
    def cost(turns, prices, cached):
        if not cached:
            return solution["session_cost"](turns, prices, cached)
        return (
            sum(
                t["prompt_tokens"] * prices["cache_write"] + t["output_tokens"] * prices["output"]
                for t in turns
            )
            / 1e6
        )

    assert not _run("15.session_cost", cost)


def test_ignoring_the_minimum_cacheable_prompt_fails(solution):
    def cost(turns, prices, cached):
        return solution["session_cost"](turns, dict(prices, min_cache_tokens=0), cached)

    assert not _run("15.session_cost", cost)


def test_a_budget_model_that_replaces_the_models_token_fails(solution):
    """The server inserts the forced end: the model's own token comes after it, not instead of it."""

    def replaced(prompt, wanted, budget, start, end):
        got = solution["budget_cut"](prompt, wanted, budget, start, end)
        out = list(got["output"])
        for i in range(len(out) - 1, 0, -1):
            if out[i - 1] == end and out[i] != end and got["forced"]:
                del out[i]
                break
        return {**got, "output": out}

    assert not _run("15.budget_cut", replaced)


def test_a_budget_that_ignores_the_prompts_open_thought_fails(solution):
    def fresh(prompt, wanted, budget, start, end):
        return solution["budget_cut"]([], wanted, budget, start, end)

    assert not _run("15.budget_cut", fresh)


def test_one_budget_for_all_thoughts_fails(solution):
    def shared(prompt, wanted, budget, start, end):
        if budget is None:
            return solution["budget_cut"](prompt, wanted, budget, start, end)
        out, held, inside, thinking, forced, i = [], 0, False, 0, 0, 0
        while i < len(wanted):
            if inside and held >= budget and wanted[i] != end:
                tok, forced = end, forced + 1
            else:
                tok, i = wanted[i], i + 1
            out.append(tok)
            if inside and tok == end:
                inside = False  # the count is not reset
            elif inside:
                held, thinking = held + 1, thinking + 1
            elif tok == start:
                inside = True
        return {"output": out, "thinking": thinking, "forced": forced}

    assert not _run("15.budget_cut", shared)
