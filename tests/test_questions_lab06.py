"""Lab 06's graded questions, without running the notebook or a server.

Solution-like answers (written here, not imported from lab_utils) earn full marks under two seeds;
the known bypasses score zero: the prediction copied from the simulator (`late_arrival(...)`), the
library's own trace readers (`LateArrival.decodes_sat_out`, `RouterRun.decode_batch_sizes`),
a plain mean where the time-weighted one is asked, lookup tables of the public cases, and the
memorised submission.
"""

from __future__ import annotations

import math

import pytest

from grader.judge import score_graded
from grader.memorise import copied_prediction_answers, imported_answers, memorised_answers
from lab_utils.grading import get, questions_for, score

SEEDS = (3, 1234567)


def tgi_next_batch(waiting, min_size, max_size, prefill_budget, token_budget):
    if not waiting or prefill_budget <= 0 or token_budget <= 0:
        return 0
    if min_size is not None and len(waiting) < min_size:
        return 0
    if max_size is not None and max_size <= 0:
        return 0
    prefill = reserved = taken = 0
    for input_len, max_new in waiting:
        need = input_len + max_new - 1
        if prefill + input_len > prefill_budget or reserved + need > token_budget:
            break
        prefill, reserved, taken = prefill + input_len, reserved + need, taken + 1
        if max_size is not None and taken == max_size:
            break
    if min_size is not None and taken < min_size:
        return 0
    return taken


def tgi_admitted(batch, waiting, waiting_tokens, cfg):
    min_size = None
    if batch and waiting_tokens < cfg["max_waiting_tokens"]:
        min_size = math.floor(len(batch) * cfg["waiting_served_ratio"])
    max_size = None if cfg["max_batch_size"] is None else cfg["max_batch_size"] - len(batch)
    held = sum(p + m - 1 for p, m in batch)
    return tgi_next_batch(
        waiting, min_size, max_size, cfg["max_batch_prefill_tokens"], cfg["max_batch_total_tokens"] - held
    )


def first_token_steps(n, prompt_len, budget, ratio, max_wait):
    queue = [(prompt_len, 400)] * n
    first, running, step, waiting_tokens, decode_next = [], 0, 0, 0, False
    while len(first) < n:
        step += 1
        if running and decode_next:
            decode_next, waiting_tokens = False, waiting_tokens + 1
            continue
        cfg = {
            "waiting_served_ratio": ratio,
            "max_waiting_tokens": max_wait,
            "max_batch_size": None,
            "max_batch_prefill_tokens": budget,
            "max_batch_total_tokens": 10**12,
        }
        k = tgi_admitted(queue[:running], queue[len(first) :], waiting_tokens, cfg)
        if k:
            decode_next = running > 0
            first += [step] * k
            running += k
            waiting_tokens = 1
        else:
            waiting_tokens += 1
    return first


def tgi_to_vllm(launch):
    direct = {
        "--model-id": "--model",
        "--num-shard": "--tensor-parallel-size",
        "--max-total-tokens": "--max-model-len",
        "--max-batch-prefill-tokens": "--max-num-batched-tokens",
        "--max-batch-size": "--max-num-seqs",
    }
    quant = {"awq", "gptq", "fp8", "compressed-tensors"}
    out = {}
    for flag, value in launch.items():
        if flag in direct:
            out[flag] = [direct[flag], str(value)]
        elif flag == "--quantize" and value in quant:
            out[flag] = ["--quantization", value]
        else:
            out[flag] = None
    return out


def make_schema(fields):
    props = {}
    for name, spec in fields.items():
        if isinstance(spec, list):
            props[name] = {"enum": list(spec)}
        elif spec.endswith("?"):
            props[name] = {"anyOf": [{"type": spec[:-1]}, {"type": "null"}]}
        else:
            props[name] = {"type": spec}
    return {"type": "object", "properties": props, "required": list(fields), "additionalProperties": False}


def predicted_decodes_sat_out(scenario):
    floor = math.floor(scenario["running"] * scenario["waiting_served_ratio"])
    return 0 if floor <= 1 else scenario["max_waiting_tokens"] - 1


def queue_waits(steps):
    queue, done, prev = [], [], None
    for s in steps:
        arrived = s["waiting"] if prev is None else s["waiting"] - (prev["waiting"] - prev["admitted"])
        queue += [0] * arrived
        if s["kind"] == "decode":
            queue = [w + 1 for w in queue]
        done += queue[: s["admitted"]]
        queue = queue[s["admitted"] :]
        prev = s
    return done


def mean_decode_batch(steps):
    dec = [s for s in steps if s["kind"] == "decode"]
    busy = sum(s["end"] - s["t"] for s in dec)
    return sum(s["batch_size"] * (s["end"] - s["t"]) for s in dec) / busy


def answers() -> dict:
    return {
        "tgi_admitted": tgi_admitted,
        "tgi_next_batch": tgi_next_batch,
        "first_token_steps": first_token_steps,
        "tgi_to_vllm": tgi_to_vllm,
        "make_schema": make_schema,
        "predicted_decodes_sat_out": predicted_decodes_sat_out,
        "queue_waits": queue_waits,
        "mean_decode_batch": mean_decode_batch,
    }


@pytest.mark.parametrize("seed", SEEDS)
def test_right_answers_score_full_marks_under_any_seed(seed):
    a = answers()
    for q in questions_for("06"):
        r = score_graded(q, a, seed)
        assert r.earned == q.points, r


def test_the_solution_functions_agree_with_the_measurement():
    """The answers applied to the lab's own measurement give what the simulator counted."""
    from lab_utils.tgi.measure import late_arrival

    for running, ratio, wait in [(4, 1.0, 6), (3, 0.3, 8), (8, 0.5, 10), (2, 1.2, 4)]:
        late = late_arrival(running, ratio, wait)
        s = {"running": running, "waiting_served_ratio": ratio, "max_waiting_tokens": wait}
        assert queue_waits(late.steps)[-1] == late.decodes_sat_out == predicted_decodes_sat_out(s)


def test_a_prediction_copied_from_the_simulator_scores_zero():
    from lab_utils.tgi.measure import late_arrival

    a = answers()
    a["predicted_decodes_sat_out"] = lambda s: late_arrival(
        s["running"], s["waiting_served_ratio"], s["max_waiting_tokens"]
    ).decodes_sat_out
    assert score_graded(get("06.predicted_wait"), a, 3).earned == 0


def test_the_library_trace_readers_score_zero():
    from lab_utils.tgi.measure import LateArrival, RouterRun

    a = answers()
    # the old answers: the property of the simulator's object, the router run's own list
    a["queue_waits"] = lambda steps: [
        LateArrival(0, 0.0, 0, [s["kind"] for s in steps], [s["waiting"] for s in steps]).decodes_sat_out
    ]
    a["mean_decode_batch"] = lambda steps: (
        sum(RouterRun([], [], [], [], steps).decode_batch_sizes)
        / len(RouterRun([], [], [], [], steps).decode_batch_sizes)
    )
    for qid in ("06.wait_measured", "06.router_measured"):
        assert score_graded(get(qid), a, 3).earned == 0, qid


def test_plausible_wrong_answers_score_zero():
    a = answers()
    a["mean_decode_batch"] = lambda steps: (
        sum(s["batch_size"] for s in steps if s["kind"] == "decode")
        / sum(s["kind"] == "decode" for s in steps)
    )  # a plain mean: a long step of a big batch counts as much as a short one
    assert score_graded(get("06.router_measured"), a, 3).earned == 0
    a = answers()
    a["queue_waits"] = lambda steps: [sum(s["kind"] == "decode" and s["waiting"] > 0 for s in steps)]
    assert score_graded(get("06.wait_measured"), a, 3).earned == 0
    a = answers()
    a["predicted_decodes_sat_out"] = lambda s: s["max_waiting_tokens"] - 1  # ignores the ratio
    assert score_graded(get("06.predicted_wait"), a, 3).earned == 0
    a["predicted_decodes_sat_out"] = lambda s: 0  # ignores the rule
    assert score_graded(get("06.predicted_wait"), a, 3).earned == 0


def test_a_schema_of_plain_types_only_scores_zero():
    a = answers()
    a["make_schema"] = lambda fields: {
        "type": "object",
        "properties": {k: {"type": t} for k, t in fields.items()},
        "required": list(fields),
        "additionalProperties": False,
    }
    assert score_graded(get("06.make_schema"), a, 3).earned == 0
    a["make_schema"] = lambda fields: {  # nullable fields left optional: "required" must list them all
        **make_schema(fields),
        "required": [k for k, t in fields.items() if not (isinstance(t, str) and t.endswith("?"))],
    }
    assert score_graded(get("06.make_schema"), a, 3).earned == 0


def _points(fake, seed=99):
    return sum(score_graded(q, fake, seed).earned for q in questions_for("06"))


def test_bypass_submissions_score_at_most_a_tenth():
    total = sum(q.points for q in questions_for("06"))
    for build in (memorised_answers, imported_answers, copied_prediction_answers):
        assert _points(build("06", answers())) <= 0.1 * total, build.__name__


def test_stubs_fail_the_public_checks():
    def stub(*a, **k):
        raise NotImplementedError

    for q in questions_for("06"):
        assert score(q, {n: stub for n in q.answers}).earned == 0


def test_a_schema_written_by_pydantic_scores_zero():
    """pydantic writes exactly the schema asked for from Python types; the question forbids it."""

    def via_pydantic(fields):
        import typing

        import pydantic

        kinds = {"string": str, "integer": int, "number": float, "boolean": bool}
        ann = {}
        for name, kind in fields.items():
            if isinstance(kind, list):
                ann[name] = (typing.Literal[tuple(kind)], ...)
            elif kind.endswith("?"):
                ann[name] = (kinds[kind[:-1]] | None, ...)
            else:
                ann[name] = (kinds[kind], ...)
        model = pydantic.create_model("Record", __config__=pydantic.ConfigDict(extra="forbid"), **ann)
        return model.model_json_schema()

    from lab_utils.grading.questions.lab06 import _schema_ok

    fields = {"city": "string", "founded": "integer?", "continent": ["Asia", "Europe"]}
    assert _schema_ok(via_pydantic(fields), fields)  # outside the sandbox it is the whole answer
    a = answers()
    a["make_schema"] = via_pydantic
    assert score_graded(get("06.make_schema"), a, 3).earned == 0


def test_admission_mistakes_fail():
    """Forgetting the running batch's reservations or its size cap, or holding out one decode step
    too long, each fails the hidden router states."""

    def ignores_reservations(batch, waiting, waiting_tokens, cfg):
        held = sum(p + m - 1 for p, m in batch)
        return tgi_admitted(
            batch,
            waiting,
            waiting_tokens,
            {**cfg, "max_batch_total_tokens": cfg["max_batch_total_tokens"] + held},
        )

    def ignores_the_cap(batch, waiting, waiting_tokens, cfg):
        return tgi_admitted(batch, waiting, waiting_tokens, {**cfg, "max_batch_size": None})

    def waits_one_step_more(batch, waiting, waiting_tokens, cfg):
        return tgi_admitted(batch, waiting, waiting_tokens - 1, cfg)

    for wrong in (ignores_reservations, ignores_the_cap, waits_one_step_more):
        a = answers()
        a["tgi_admitted"] = wrong
        assert score_graded(get("06.admitted"), a, 3).earned == 0, wrong.__name__
