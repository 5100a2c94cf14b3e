"""Lab 14's hidden checks, in process (fast): the published solution's answers pass every one, and
a typical mistake in each fails its check (the grade tells the mistake from the answer)."""

from __future__ import annotations

import random
from pathlib import Path

import nbformat
import pytest

from grader.registry import hidden_check
from lab_utils.grading import lab_scenario

SOLUTION = Path(__file__).resolve().parents[1] / "solutions" / "14_kv_beyond_one_engine.ipynb"
ANSWERS = [
    "kv_bytes_stored",
    "predict_ttft",
    "crossover_len",
    "cache_sources",
    "ttft_tpot",
    "pick_replica",
    "best_layout",
]


@pytest.fixture(scope="module")
def solution() -> dict:
    """The solution's answer functions (the cells that define them, run alone)."""
    ns: dict = {"__name__": "__main__"}
    for cell in nbformat.read(str(SOLUTION), as_version=4).cells:
        if cell.cell_type == "code" and any(cell.source.startswith(f"def {name}(") for name in ANSWERS):
            exec(compile(cell.source, "<solution>", "exec"), ns)
    assert set(ANSWERS) <= set(ns)
    return ns


def _run(qid: str, *answers, seed: int = 3) -> bool:
    check = hidden_check(qid)
    try:
        check(*answers, rng=random.Random(seed), scenario=lab_scenario("14", 0))
    except AssertionError:
        return False
    return True


QUESTIONS = {
    "14.kv_bytes_stored": ["kv_bytes_stored"],
    "14.predict_ttft": ["predict_ttft"],
    "14.crossover": ["crossover_len"],
    "14.cache_sources": ["cache_sources"],
    "14.ttft_tpot": ["ttft_tpot"],
    "14.pick_replica": ["pick_replica"],
    "14.disagg_layout": ["best_layout"],
}


@pytest.mark.parametrize("qid", sorted(QUESTIONS))
def test_the_solution_passes_every_hidden_check(qid, solution):
    assert _run(qid, *(solution[n] for n in QUESTIONS[qid]))


def test_whole_prompt_blocks_without_the_last_token_rule_fail():
    def stored(spec, n, bs, db):  # forgets that the last token is always computed
        return n // bs * bs * 2 * spec["num_layers"] * spec["num_kv_heads"] * spec["head_dim"] * db

    assert not _run("14.kv_bytes_stored", stored)


def test_charging_the_load_overhead_when_nothing_is_stored_fails(solution):
    def ttft(n, tier, path):
        if path == "recompute":
            return solution["predict_ttft"](n, tier, path)
        stored = (n - 1) // tier["block_size"] * tier["block_size"]
        read = stored * tier["kv_bytes_per_token"] / (tier["tier_gb_s"] * 1e9)
        return tier["fixed_s"] + tier["load_overhead_s"] + read + (n - stored) / tier["prefill_tok_s"]

    assert not _run("14.predict_ttft", ttft)


def test_summing_series_before_the_difference_misses_a_restart():
    def sources(before, after):
        def total(text, name):
            return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.split("{")[0] == name)

        d = {k: total(after, k) - total(before, k) for k in (
            "vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total",
            "vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total")}  # fmt: skip
        p = d["vllm:prompt_tokens_total"]
        if not p:  # nothing scheduled: handled as the text says, so only the restart can fail it
            return dict.fromkeys(("device", "external", "computed", "connector_hit_rate"), float("nan"))
        dev, ext, q = (
            d["vllm:prefix_cache_hits_total"] / p,
            d["vllm:external_prefix_cache_hits_total"] / p,
            d["vllm:external_prefix_cache_queries_total"],
        )
        rate = d["vllm:external_prefix_cache_hits_total"] / q if q else float("nan")
        return {"device": dev, "external": ext, "computed": 1 - dev - ext, "connector_hit_rate": rate}

    assert not _run("14.cache_sources", sources)


def test_counting_failed_requests_fails(solution):
    def ttft_tpot(records):
        return solution["ttft_tpot"]([dict(r, ok=True) for r in records])

    assert not _run("14.ttft_tpot", ttft_tpot)


def test_ignoring_load_among_equals_fails(solution):
    def pick(prompt, replicas, bs):
        return solution["pick_replica"](prompt, [dict(r, load=0) for r in replicas], bs)

    assert not _run("14.pick_replica", pick)


def test_preferring_colocated_whenever_it_meets_the_slo_fails(solution):
    def best(workload, num_gpus, cost, link, slo):
        from lab_utils.deploy.disagg import colocated
        from lab_utils.sim import StepCostModel, WorkloadRequest

        work = [
            WorkloadRequest(w["request_id"], w["arrival_time"], w["prompt_len"], w["output_len"])
            for w in workload
        ]
        r = colocated(work, num_gpus, StepCostModel(**cost))
        if r["ttft_p95"] <= slo["ttft_s"] and r["tpot_p95"] <= slo["tpot_s"]:
            return "colocated"
        return solution["best_layout"](workload, num_gpus, cost, link, slo)

    assert not _run("14.disagg_layout", best)


def test_cache_sources_without_nan_when_nothing_was_scheduled_fails(solution):
    """The text: when no prompt tokens were scheduled between the scrapes, all four are nan."""

    def sources(before, after):
        got = solution["cache_sources"](before, after)
        nothing = got["device"] != got["device"]  # nan: no prompt tokens between the scrapes
        return dict.fromkeys(got, 0.0) if nothing else got  # zeros there instead of nan

    assert not _run("14.cache_sources", sources)
