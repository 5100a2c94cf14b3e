"""Library shortcuts to labs 04, 13 and 14's answers score zero (issue 38 items 2 and 9).

Each shortcut is one call of a function the learner's environment holds, wrapped in the answer's
signature: the drills' calculators (lab_utils.drills.calc) for 13.a2a_bytes, 13.kv_per_token,
14.kv_bytes_stored and 14.crossover; vLLM's expert load balancer for 13.placement and its disk
connector's block rounding for 14.kv_bytes_stored; transformers' rejection sampler for
04.verify_sampled. The test shows the shortcut passes the question's hidden
check (it would have scored before the question forbade it), then that the judge scores it 0 with
the catalogue's refusal. The vLLM and transformers ones import those packages (10-20 s each) and
are marked slow; so are the two that run a sandboxed runner.
"""

from __future__ import annotations

import importlib
import math
import random
import sys
import types

import pytest

import grader.hidden.lab04  # noqa: F401  (registers the hidden checks)
import grader.hidden.lab13  # noqa: F401
import grader.hidden.lab14  # noqa: F401
from grader import drill_calc as calc
from grader.judge import score_graded
from grader.registry import hidden_check
from lab_utils.grading import get, lab_scenario

SEED = 11


def _passes_hidden(qid: str, *answers) -> bool:
    try:
        hidden_check(qid)(*answers, rng=random.Random(SEED), scenario=lab_scenario(qid[:2], 0))
    except AssertionError:
        return False
    return True


def _judged(qid: str, fn):
    return score_graded(get(qid), {get(qid).answers[0]: fn}, SEED)


# --- the drills' calculators -----------------------------------------------------------------------


def a2a_via_calc(config, ep_size, dispatch_bytes, combine_bytes):
    top = config.get("num_experts_per_tok") or config.get("experts_per_token")
    h = config["hidden_size"]
    return (
        calc.ep_alltoall_bytes_per_token(h, top, dispatch_bytes, 0, ep_size),
        calc.ep_alltoall_bytes_per_token(h, top, 0, combine_bytes, ep_size),
    )


def stored_via_calc(spec, prompt_len, block_size, dtype_bytes):
    whole = (prompt_len - 1) // block_size * block_size
    layers, heads, dim = spec["num_layers"], spec["num_kv_heads"], spec["head_dim"]
    return int(calc.kv_transfer_bytes(whole, block_size, layers, heads, dim, dtype_bytes))


def crossover_via_calc(tier, max_len):
    x = calc.load_recompute_crossover_tokens(
        tier["prefill_tok_s"], tier["kv_bytes_per_token"], tier["tier_gb_s"], tier["load_overhead_s"]
    )
    if x is None:
        return None
    length = (math.floor(x / tier["block_size"]) + 1) * tier["block_size"] + 1  # first whole block past x
    return length if length <= max_len else None


def kv_via_calc(config, dtype_bytes, context_len):
    c, layers = config, config["num_hidden_layers"]
    if c.get("kv_lora_rank"):
        return calc.mla_kv_bytes_per_token(layers, c["kv_lora_rank"], c["qk_rope_head_dim"], dtype_bytes)
    kinds = c.get("layer_types") or []
    window = c.get("sliding_window") if kinds else None
    sliding = sum(k == "sliding_attention" for k in kinds[:layers]) if window else 0
    heads = c.get("num_key_value_heads") or c["num_attention_heads"]
    one = calc.gqa_kv_bytes_per_token(1, heads, c.get("head_dim"), dtype_bytes)
    return ((layers - sliding) * context_len + sliding * min(context_len, window or 0)) * one / context_len


@pytest.mark.parametrize(
    "qid, shortcut",
    [
        ("13.a2a_bytes", a2a_via_calc),
        ("13.kv_per_token", kv_via_calc),
        ("14.kv_bytes_stored", stored_via_calc),
        ("14.crossover", crossover_via_calc),
    ],
)
def test_the_drill_calculators_that_answered_these_are_not_in_the_learners_copy(qid, shortcut):
    """Composed, the drills' calculators answer these questions (issue 47): since a pasted copy beats
    a refusal, they moved to grader/drill_calc.py and the learner's copy has no such module."""
    assert _passes_hidden(qid, shortcut), "the shortcut no longer answers the question: drop this case"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lab_utils.drills.calc")


# --- vLLM's expert load balancer, transformers' rejection sampler ------------------------------------


def place_via_eplb(loads, num_gpus, slots_per_gpu):
    import torch
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

    phy = DefaultEplbPolicy.rebalance_experts(torch.tensor([loads]), num_gpus * slots_per_gpu, 1, 1, num_gpus)
    flat = [int(e) for e in (phy[0] if isinstance(phy, tuple) else phy)[0]]
    return [flat[g * slots_per_gpu : (g + 1) * slots_per_gpu] for g in range(num_gpus)]


def place_via_eplb_unhooked(loads, num_gpus, slots_per_gpu):
    """The same call after removing the runner's import hook, which would have stubbed it."""
    import sys

    sys.meta_path[:] = [f for f in sys.meta_path if "Forbid" not in type(f).__name__]
    import torch
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

    phy = DefaultEplbPolicy.rebalance_experts(torch.tensor([loads]), num_gpus * slots_per_gpu, 1, 1, num_gpus)
    return [[int(e) for e in (phy[0] if isinstance(phy, tuple) else phy)[0]]]


def verify_via_transformers(target_probs, draft_probs, draft_tokens, seed):
    import torch
    from transformers.generation.utils import _speculative_sampling

    torch.manual_seed(seed)
    k = len(draft_tokens)
    p = torch.tensor([target_probs], dtype=torch.float64).log()
    q = torch.tensor([list(draft_probs)[:k]], dtype=torch.float64).log()
    tokens, _ = _speculative_sampling(torch.tensor([list(draft_tokens)]), q, k, p)
    return [int(t) for t in tokens[0]]


@pytest.mark.slow  # imports vLLM (about 15 s)
def test_vllms_expert_load_balancer_scores_zero_for_placement():
    assert _passes_hidden("13.placement", place_via_eplb)
    result = _judged("13.placement", place_via_eplb)
    assert result.earned == 0 and "rebalance_experts" in result.message, result.message


def stored_via_connector(spec, prompt_len, block_size, dtype_bytes):
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import align_to_block_size

    per_token = 2 * spec["num_layers"] * spec["num_kv_heads"] * spec["head_dim"] * dtype_bytes
    return align_to_block_size(prompt_len, block_size) * per_token


@pytest.mark.slow  # imports vLLM (about 15 s)
def test_the_disk_connectors_rounding_scores_zero_for_stored_bytes():
    """The lab sends the learner to read align_to_block_size; calling it is the stored-token rule."""
    assert _passes_hidden("14.kv_bytes_stored", stored_via_connector)
    result = _judged("14.kv_bytes_stored", stored_via_connector)
    assert result.earned == 0 and "align_to_block_size" in result.message, result.message


@pytest.mark.slow  # imports transformers' generation code (about 10 s)
def test_transformers_speculative_sampling_scores_zero_for_verify_sampled():
    from grader.hidden.lab04 import judge_sampled_verifier

    failed, tests = judge_sampled_verifier(verify_via_transformers, random.Random(SEED), draws=600, cases=1)
    assert tests and not failed, "transformers' verifier follows the target's law: it would have scored"
    result = _judged("04.verify_sampled", verify_via_transformers)
    assert result.earned == 0 and "_speculative_sampling" in result.message, result.message


@pytest.mark.slow  # three sandboxed runners, importing vLLM and transformers (about 30 s)
def test_the_sandboxed_runner_refuses_both(tmp_path):
    import cloudpickle

    from grader.remote import Runner, UsesReference
    from grader.sandbox import Sandbox, sandbox_problem

    if sandbox_problem():
        pytest.skip(sandbox_problem())
    folder = tmp_path / "answers"
    folder.mkdir()
    for name, fn in (
        ("place", place_via_eplb),
        ("unhooked", place_via_eplb_unhooked),
        ("verify", verify_via_transformers),
    ):
        answer = types.FunctionType(fn.__code__, {"__builtins__": __builtins__, "__name__": "__main__"}, name)
        answer.__module__ = "__main__"  # saved by value, as a notebook's function is
        (folder / f"{name}.pkl").write_bytes(cloudpickle.dumps(answer))
    from grader.library import fingerprints

    forbid = list(get("13.placement").forbid) + list(get("04.verify_sampled").forbid)
    prints = {**fingerprints(get("13.placement")), **fingerprints(get("04.verify_sampled"))}
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    p = [[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.1, 0.8, 0.1]]
    loads = ([3.0, 1.0, 1.0, 1.0], 2, 3)
    for name, args in (("place", loads), ("unhooked", loads), ("verify", (p, p[:2], [0, 2], 7))):
        r = Runner(
            folder,
            forbid,
            Sandbox(hide=[]),
            sys.executable,
            env,
            tmp_path / "runner.log",
            timeout=120.0,
            prints=prints,
        )
        try:
            with pytest.raises(UsesReference, match="rebalance|_speculative"):
                r.answer(name)(*args)
        finally:
            r.close()
