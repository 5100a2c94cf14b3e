"""Lab 11 — interview drills: graded questions.

Every answer is a function. The calculators are graded on unseen random instances against
`grader.drill_calc` (the grader's references); `answer_drill` on the scenario's drill set and on
fresh drills of every topic; the batching prediction on unseen workloads against the step model the
lab states (grader/hidden/lab11.py); the measurement's analysis on made-up finish times; the chat
sizing on unseen chat prompts. Public checks use at most two fixed cases and never show an
expected value or a formula.
"""

from __future__ import annotations

import math
import random

from lab_utils.drills import make_drills
from lab_utils.grading.checks import close
from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import question, scenario

# Every helper within reach of a notebook that returns a median or a percentile in one call: the
# course's own (and the wrappers that call them), the standard library's, numpy's and torch's.
MEDIANS = refs("percentiles", "percentile_summaries")


@scenario("11")
def _(rng: random.Random) -> dict:
    """The drill set's seed, a batching workload to predict and measure, a chat design prompt."""
    batch = rng.choice([4, 8, 16])
    n_short = rng.randint(batch // 2, batch - 1)
    short, long = rng.choice([20, 50, 100]), rng.choice([300, 500, 1000])
    lens: list[int] = []
    for _ in range(8):  # eight batches, each with the same mix in a shuffled order
        one = [short] * n_short + [long] * (batch - n_short)
        rng.shuffle(one)
        lens += one
    return {
        "drill_seed": rng.randrange(1, 1_000_000),
        "n_drills": 12,
        "batching": {"batch_size": batch, "output_lens": lens, "prompt_len": 32},
        "chat": {
            "rate": rng.choice([500, 1000, 2000, 3000]),
            "output_tokens": rng.choice([150, 250, 400]),
            "prompt_tokens": rng.choice([500, 1000, 2000]),
            "decode_tokens_per_s": rng.choice([2500, 4000, 6000, 9000]),
            "prefill_tokens_per_s": rng.choice([10_000, 20_000, 40_000]),
            "headroom": 0.7,
        },
    }


# --- 1. GPUs needed under the tensor-parallel constraints ---------------------------------------


@question(
    "11.gpus_needed",
    points=3,
    answers=["gpus_needed"],
    forbid=refs("tensor_parallel"),
)
def _(gpus_needed):
    """Smallest TP degree that fits weights and KV per GPU and that vLLM accepts, within the node."""
    got = gpus_needed(140.0, 20.0, 80.0, 0.9, 3.0, 64, 8)
    assert got is not None, "140 GB of weights plus 20 GB of KV do fit on some count of 80 GB GPUs"
    assert int(got) != 2, "round the memory ratio UP: 2 GPUs leave less usable memory than the model needs"
    assert int(got) != 3, "3 does not split 64 attention heads; take the next degree that does"
    assert gpus_needed(1400.0, 20.0, 80.0, 0.9, 3.0, 64, 8) is None, (
        "when not even the largest degree in the node holds it, return None"
    )
    one_kv = gpus_needed(60.0, 10.0, 24.0, 0.9, 1.0, 32, 1)
    assert one_kv is not None and int(one_kv) > 1, (
        "one KV head is no reason to stay on one GPU: vLLM replicates KV heads when TP exceeds them; "
        "how much KV does each GPU then hold?"
    )


# --- 2. Where decode turns compute-bound ----------------------------------------------------------


@question(
    "11.critical_batch",
    points=2,
    answers=["critical_batch"],
    forbid=refs("roofline"),
)
def _(critical_batch):
    """Decode batch at which a step's FLOPs per byte read (weights and every sequence's KV cache)
    reach the GPU's ridge point; None when no batch gets there."""
    a = float(critical_batch(989, 3350, 2))
    b = float(critical_batch(989, 3350, 1))
    assert a > 0 and b > 0, "a batch size is positive"
    assert math.isclose(a, 2 * b, rel_tol=1e-6), "halving the bytes per weight should halve this batch: why?"
    short = critical_batch(989, 3350, 2, 70e9, 320 * 1024, 256)
    assert short is not None and float(short) > a, (
        "each sequence's KV cache is read every step too: more bytes per step, for no more weight FLOPs"
    )
    assert critical_batch(989, 3350, 2, 8e9, 128 * 1024, 32_768) is None, (
        "when one more sequence brings more bytes than its FLOPs can cover, no batch is compute-bound"
    )


# --- 3. Continuous vs static batching --------------------------------------------------------------


@question("11.batching_gain", points=2, answers=["batching_gain"], forbid=refs("batching_models"))
def _(batching_gain):
    """Steady-state throughput of continuous over static batching for output lengths taken in order."""
    assert close(batching_gain([100] * 8, 8), 1.0), (
        "when every request has the same length there is nothing to gain"
    )
    got = float(batching_gain([50] * 7 + [500], 8))
    assert got > 1 and not close(got, 10.0, 0.05), (
        "the seed's ~10x is long/short; with requests always waiting, what does a slot do once its "
        "short request ends?"
    )


# --- 4. Speculative decoding -----------------------------------------------------------------------


@question(
    "11.speculative",
    points=2,
    answers=["spec_expected_tokens", "spec_speedup"],
)
def _(spec_expected_tokens, spec_speedup):
    """Expected tokens per target pass for per-position acceptance rates, and the speed-up once the
    draft's cost is paid."""
    assert close(spec_expected_tokens([0.0] * 4), 1.0), (
        "with nothing accepted, the target still adds one token"
    )
    e = float(spec_expected_tokens([0.9, 0.8, 0.7, 0.6]))
    assert 1 < e < 5, "between one token and k + 1 tokens per pass"
    assert float(spec_expected_tokens([0.9, 0.8, 0.7, 0.6, 0.5])) > e, "one more draft can only add tokens"
    assert close(spec_expected_tokens([0.0, 0.9, 0.9]), 1.0), (
        "once a draft is rejected, the drafts after it are thrown away, however likely they were"
    )
    assert float(spec_speedup([0.9, 0.8, 0.7, 0.6], 0.1)) < e, "the draft's k steps cost time too"
    assert close(spec_speedup([0.9, 0.8, 0.7, 0.6], 0.0), e), "a free draft leaves only the tokens per pass"


# --- 5. Cost per million tokens --------------------------------------------------------------------


@question(
    "11.cost_per_million",
    points=1,
    answers=["cost_per_million_tokens"],
    forbid=refs("cost_per_token"),
)
def _(cost_per_million_tokens):
    """Dollars per million output tokens from an hourly GPU price and a sustained throughput."""
    a = float(cost_per_million_tokens(2.5, 1, 1000))
    assert a > 0 and close(cost_per_million_tokens(2.5, 2, 1000), 2 * a), (
        "twice the GPUs at the same throughput cost twice as much"
    )
    assert close(cost_per_million_tokens(2.5, 1, 2000), a / 2), "twice the throughput, half the cost"


# --- 6. Any drill, answered by code ----------------------------------------------------------------


@question(
    "11.drill_answers", points=4, answers=["answer_drill"], forbid=refs("drill_calculators", "drill_library")
)
def _(answer_drill):
    """answer_drill(kind, inputs) answers any drill of any seed (the scenario's set and unseen ones)."""
    d = make_drills(0, topics=["cost"], n=1)[0]
    got = answer_drill(d.kind, dict(d.inputs))
    assert got is not None and math.isfinite(float(got)), "one finite number per drill"
    assert d.is_correct(got), f"answer_drill is wrong on a {d.kind!r} drill: read its worked explanation"


# --- 7. Predict, then measure ----------------------------------------------------------------------


@question(
    "11.predict_batching",
    points=2,
    answers=["predicted_gain"],
    predict=True,
    forbid=refs("batching_models"),
)
def _(predicted_gain):
    """predicted_gain(batching): continuous over static for a workload that all arrives at once,
    in decode steps, counting the drain (the lab's step model), before the simulator runs it."""
    alone = float(predicted_gain({"batch_size": 8, "output_lens": [50] * 7 + [500], "prompt_len": 32}))
    assert math.isfinite(alone) and alone >= 1 - 1e-9, "continuous batching never does worse in this model"
    assert close(alone, 1.0, 0.01), "eight requests and eight slots: who would take a slot that frees early?"
    many = float(predicted_gain({"batch_size": 8, "output_lens": ([50] * 7 + [500]) * 8, "prompt_len": 32}))
    assert many > 1.5, "with a backlog, a slot that frees early takes the next request"


@question(
    "11.measured_batching",
    points=2,
    answers=["batching_summary"],
    forbid=refs("batching_measurement", "percentiles"),
)
def _(batching_summary):
    """batching_summary(output_lens, static_finish_s, continuous_finish_s) -> {"gain", "p50_ratio"};
    the median is yours to write (the text says so: no statistics.median, numpy or torch median)."""
    got = batching_summary([10, 10], [1.0, 2.0], [1.0, 2.0])
    got = {str(k): float(v) for k, v in dict(got).items()}
    assert set(got) == {"gain", "p50_ratio"}, "return {'gain': ..., 'p50_ratio': ...}"
    assert close(got["gain"], 1.0) and close(got["p50_ratio"], 1.0), "the same finish times: no difference"
    two = {str(k): float(v) for k, v in dict(batching_summary([10, 30], [4.0, 4.0], [1.0, 3.0])).items()}
    assert two["gain"] > 1 and two["p50_ratio"] > two["gain"], (
        "the same tokens sooner is more throughput; a median request finishes far sooner still"
    )


# --- 8. A design number from the scenario ----------------------------------------------------------


@question("11.chat_replicas", points=1, answers=["chat_replicas"])
def _(chat_replicas):
    """chat_replicas(chat): replicas for a chat load, prefill included, at the stated headroom."""
    base = {
        "rate": 100,
        "output_tokens": 200,
        "prompt_tokens": 1000,
        "decode_tokens_per_s": 4000,
        "prefill_tokens_per_s": 20000,
        "headroom": 0.7,
    }
    n = float(chat_replicas(dict(base)))
    assert n >= 1 and n == int(n), "a whole number of replicas, at least one"
    longer = float(chat_replicas(dict(base, prompt_tokens=8000)))
    assert longer > n, "longer prompts take replica time too: prefill is work"
