"""Labs 04 and 05 graded questions: the solution passes under two seeds, plausible mistakes and
transcriptions do not, and the known bypasses score zero.

The answers are taken from the solution notebooks themselves (the cells with a SOLUTION block that
need neither the model nor a server), so these tests follow the notebook as it changes. Fast tests
are unmarked; the ones that run the course model are `slow` and small.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pytest

from grader.judge import score_graded
from grader.memorise import memorised_answers
from grader.registry import hidden_check
from lab_utils.grading import get, lab_scenario, questions_for, score

REPO = Path(__file__).resolve().parent.parent
SEEDS = (11, 2026)
NEEDS_RUN = ("RUN_REAL", "RUN_VLLM", "LLMEngine", "run_load", "srv")


def solution_namespace(lab: str, seed: int) -> dict:
    """Globals after running the solution cells that define answers without the model or a server."""
    path = next((REPO / "solutions").glob(f"{lab}_*.ipynb"))
    nb = nbformat.read(str(path), as_version=4)
    ns: dict = {"SCENARIO": lab_scenario(lab, seed), "math": math, "__name__": f"lab{lab}_solution"}
    for cell in nb.cells:
        src = cell.source
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in src and not any(w in src for w in NEEDS_RUN):
            exec(compile(src, f"<{path.name}>", "exec"), ns)
    return ns


def earned(qid: str, answers: dict, seed: int) -> float:
    return score_graded(get(qid), answers, seed).earned


FUNCTION_QUESTIONS = {
    "04.slot_for": "slot_for",
    "04.kv_capacity_tokens": "kv_capacity_tokens",
    "04.my_schedule": "my_schedule",
    "05.texts_of": "texts_of",
    "05.client_kwargs": "client_kwargs",
    "05.kv_cache_tokens": "kv_cache_tokens",
    "05.max_model_len_limit": "max_model_len_limit",
    "05.gauge_value": "gauge_value",
    "05.p50_p95": "p50_p95",
}
VALUE_QUESTIONS = ["04.blocks_needed", "05.flags_for_goal"]


# --- the reference answers pass, under two seeds ---------------------------------------------------


@pytest.mark.parametrize("qid", sorted(FUNCTION_QUESTIONS) + VALUE_QUESTIONS)
@pytest.mark.parametrize("seed", SEEDS)
def test_solution_scores_full_marks(qid, seed):
    ns = solution_namespace(qid[:2], seed)
    r = score_graded(get(qid), ns, seed)
    assert r.earned == r.points, r


def test_every_question_has_a_hidden_check_and_each_lab_a_prediction():
    for lab in ("04", "05"):
        qs = questions_for(lab)
        assert all(hidden_check(q.id) is not None for q in qs)
        assert any(q.predict for q in qs)


def test_scenarios_differ_between_seeds():
    for lab in ("04", "05"):
        draws = {json.dumps(lab_scenario(lab, s), sort_keys=True) for s in range(8)}
        assert len(draws) > 3


# --- wrong but plausible answers fail ---------------------------------------------------------------


def _wrong_answers() -> dict[str, dict]:
    ns5 = solution_namespace("05", SEEDS[0])
    sc4 = lab_scenario("04", SEEDS[0])
    from lab_utils.sim.scheduler import SchedulerOutput as Plan

    def decodes_last(state):  # lab 03's old v0 rule: admit first, then the running ones
        plan = Plan()
        budget = state.config.max_num_batched_tokens
        while state.waiting and len(state.running) < state.config.max_num_seqs and budget > 0:
            req = state.waiting[0]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if state.kv.allocate_slots(req, n) is None:
                break
            state.admit(req)
            plan.num_scheduled_tokens[req.request_id] = n
            budget -= n
        for req in list(state.running):
            if req.request_id in plan.num_scheduled_tokens or budget <= 0:
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while state.kv.allocate_slots(req, n) is None:
                victim = state.preempt_last()
                plan.preempted_req_ids.append(victim.request_id)
                if victim is req:
                    break
            else:
                plan.num_scheduled_tokens[req.request_id] = n
                budget -= n
        return plan

    flags = dict(ns5["chosen_flags"])
    return {
        "04.slot_for": {"slot_for": lambda table, pos, bs: table[pos // bs] + pos % bs},  # forgot * bs
        "04.kv_capacity_tokens": {
            "kv_capacity_tokens":  # K only, no rounding to blocks
            lambda g, bs, d, l, h, hd: int(g * 2**30 // (l * h * hd * d))
        },
        "04.blocks_needed": {
            "predicted_blocks":  # counts the last sampled token too
            [-(-(p + sc4["max_tokens"]) // sc4["block_size"]) + 1 for p in sc4["prompt_lens"]]
        },
        "04.my_schedule": {"my_schedule": decodes_last},
        "05.texts_of": {"texts_of": lambda outs: [o.outputs[-1].text for o in outs]},
        "05.client_kwargs": {
            "client_kwargs": lambda url, api_key=None: {"base_url": url + "/v1", "api_key": api_key or "x"}
        },
        "05.kv_cache_tokens": {
            "kv_cache_tokens":  # no whole blocks
            lambda g, l, h, hd, d, bs: int(g * 2**30) // (2 * l * h * hd * d)
        },
        "05.max_model_len_limit": {
            "max_model_len_limit":  # forgets the null block
            lambda kv, per, bs: kv // (per * bs) * bs
        },
        "05.gauge_value": {
            "gauge_value": lambda text, name: next(
                (float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)), math.nan
            )
        },
        "05.p50_p95": {
            "p50_p95": lambda xs: (sorted(xs)[len(xs) // 2], sorted(xs)[int(0.95 * (len(xs) - 1))])
        },
        "05.flags_for_goal": {
            "chosen_flags": {**flags, "kv_cache_gib": 1.0},  # far more KV than the goal needs
            "predicted_concurrency": ns5["predicted_concurrency"],
        },
    }


@pytest.mark.parametrize("qid", sorted(FUNCTION_QUESTIONS) + VALUE_QUESTIONS)
def test_wrong_but_plausible_answers_fail(qid):
    answers = _wrong_answers()[qid]
    assert earned(qid, answers, SEEDS[0]) == 0, qid


def test_flags_prediction_must_follow_from_the_flags():
    ns = solution_namespace("05", SEEDS[0])
    ok = {"chosen_flags": ns["chosen_flags"], "predicted_concurrency": ns["predicted_concurrency"]}
    assert earned("05.flags_for_goal", ok, SEEDS[0]) == 3
    assert (
        earned(
            "05.flags_for_goal", {**ok, "predicted_concurrency": ok["predicted_concurrency"] * 1.2}, SEEDS[0]
        )
        == 0
    )


# --- transcription: lookup tables of the public cases, values typed in from another seed ---------------


@pytest.mark.parametrize("qid", sorted(FUNCTION_QUESTIONS))
def test_a_lookup_table_of_the_public_cases_fails_the_hidden_check(qid):
    lab, name = qid[:2], FUNCTION_QUESTIONS[qid]
    ns = solution_namespace(lab, SEEDS[0])
    fake = memorised_answers(lab, {name: ns[name]})
    assert (
        score(get(qid), fake).earned == get(qid).points or name == "my_schedule"
    )  # the table passes in public
    assert earned(qid, fake, SEEDS[1]) == 0


@pytest.mark.parametrize("lab", ["04", "05"])
def test_memorised_submission_scores_at_most_a_quarter_under_another_seed(lab):
    ns = solution_namespace(lab, SEEDS[0])
    names = {n for q in questions_for(lab) for n in q.answers}
    answers = {n: ns[n] for n in names if n in ns}
    answers.update(_fake_measurements(lab))  # the solution run's measured figures, typed in
    fake = memorised_answers(lab, answers)
    results = [score_graded(q, fake, SEEDS[1]) for q in questions_for(lab)]
    got, possible = sum(r.earned for r in results), sum(r.points for r in results)
    assert got <= 0.25 * possible, [(r.id, r.earned) for r in results]


def _fake_measurements(lab: str) -> dict:
    if lab == "04":
        return {
            "tight_run": {"num_preemptions": 3, "free_blocks_after": 9, "num_blocks": 9},
            "sweep_runs": {1: {"tokens": 32}, 2: {"tokens": 32}, 4: {"tokens": 32}},
            "throughput": {1: 10.0, 2: 18.0, 4: 30.0},
        }
    return {
        "sweep_results": {1: {"output_tokens_per_s": 20.0}, 4: {"output_tokens_per_s": 50.0}},
        "sweep_tok_s": {1: 20.0, 4: 50.0},
    }


# --- the known bypasses score zero ------------------------------------------------------------------


def test_my_schedule_none_scores_zero():
    assert earned("04.my_schedule", {"my_schedule": None}, SEEDS[0]) == 0


def test_my_schedule_calling_or_being_the_reference_scores_zero():
    from lab_utils.engine.scheduler import Scheduler, reference_schedule

    def wraps_reference(state):
        return state.reference_schedule()

    def calls_the_policy(state):
        return reference_schedule(state)

    assert earned("04.my_schedule", {"my_schedule": wraps_reference}, SEEDS[0]) == 0
    assert earned("04.my_schedule", {"my_schedule": calls_the_policy}, SEEDS[0]) == 0
    assert earned("04.my_schedule", {"my_schedule": Scheduler.reference_schedule}, SEEDS[0]) == 0
    assert earned("04.my_schedule", {"my_schedule": reference_schedule}, SEEDS[0]) == 0


def test_the_lab_never_falls_back_to_another_policy_under_the_answers_name():
    nb = nbformat.read(str(REPO / "labs" / "04_course_engine.ipynb"), as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "reference_schedule" not in code
    assert "schedule_fn=my_schedule" in code and "schedule_fn=None" not in code
    assert "my_schedule = " not in code.replace("def my_schedule", "")


@pytest.mark.parametrize(
    "qid,answers",
    [
        (
            "04.preemption",
            {
                "tight_run": {
                    "num_preemptions": 2,
                    "outputs_identical": True,
                    "free_blocks_after": 14,
                    "num_blocks": 14,
                }
            },
        ),
        (
            "04.throughput_vs_batch",
            {
                "sweep_runs": {
                    1: {"tokens_per_s": 9.0},
                    4: {"tokens_per_s": 25.0},
                    12: {"tokens_per_s": 40.0},
                },
                "throughput": {1: 9.0, 4: 25.0, 12: 40.0},
            },
        ),
        (
            "05.sweep",
            {
                "sweep_results": {1: {"output_tokens_per_s": 20.0}, 4: {"output_tokens_per_s": 50.0}},
                "sweep_tok_s": {1: 20.0, 4: 50.0},
            },
        ),
    ],
)
def test_hand_written_measurements_score_zero(qid, answers):
    assert score(get(qid), answers).earned == 0
    assert earned(qid, answers, SEEDS[0]) == 0


def _fake_engine_run(seed: int, preempt: bool = True, label: str = "tight"):
    """An EngineRun as `measure` would stamp it, built from the scheduler on fake tokens (no model)."""
    from lab_utils.engine.measure import EngineRun
    from lab_utils.grading.provenance import stamp

    sc = lab_scenario("04", seed)
    m, bs = sc["max_tokens"], sc["block_size"]
    steps = [
        {
            "step": 1,
            "schedule_s": 1e-4,
            "execute_s": 0.01,
            "update_s": 1e-4,
            "scheduled": {"0": 5},
            "blocks": {"0": 2},
            "preempted": ["2"] if preempt else [],
            "num_free_blocks": 0,
        }
    ]
    return stamp(
        EngineRun(
            label=label,
            settings={
                "num_blocks": 9,
                "block_size": bs,
                "max_num_seqs": 4,
                "max_num_batched_tokens": 128,
                "max_model_len": 64,
            },
            request_ids=["0", "1", "2"],
            prompt_lens=list(sc["prompt_lens"]),
            output_token_ids=[[7] * m] * 3,
            wall_s=1.0,
            steps=steps,
            free_blocks_after=9,
        )
    )


def test_an_edited_or_foreign_stamped_run_scores_zero():
    run = _fake_engine_run(SEEDS[0])
    assert earned("04.preemption", {"tight_run": run}, SEEDS[0]) == 2
    assert earned("04.preemption", {"tight_run": run}, SEEDS[1]) == 0  # another seed's requests
    run.steps[0]["preempted"] = ["2", "1"]  # edited after the stamp
    assert earned("04.preemption", {"tight_run": run}, SEEDS[0]) == 0
    assert earned("04.preemption", {"tight_run": _fake_engine_run(SEEDS[0], preempt=False)}, SEEDS[0]) == 0


# --- 05.sweep against a small fake OpenAI server (real run_load, real stamps) ------------------------


class _Streamer(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        n = int(body["max_tokens"])
        for i in range(n):
            time.sleep(0.002)
            self.wfile.write(b"data: " + json.dumps({"choices": [{"text": f"t{i}"}]}).encode() + b"\n\n")
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        self.wfile.flush()


@pytest.fixture()
def fake_url():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Streamer)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_sweep_of_stamped_load_results_scores_full_and_edits_score_zero(fake_url):
    from lab_utils.clients import run_load

    results = {c: run_load(fake_url, "m", ["p"], num_requests=4, concurrency=c, max_tokens=5) for c in (1, 4)}
    tok_s = {
        c: sum(r.output_tokens for r in res.records if r.ok) / res.settings["duration_s"]
        for c, res in results.items()
    }
    for seed in SEEDS:
        assert earned("05.sweep", {"sweep_results": results, "sweep_tok_s": tok_s}, seed) == 2
    assert earned("05.sweep", {"sweep_results": results, "sweep_tok_s": {1: 1e6, 4: 1e6}}, SEEDS[0]) == 0
    results[4].records[0].output_tokens = 500  # edited after the stamp
    assert earned("05.sweep", {"sweep_results": results, "sweep_tok_s": tok_s}, SEEDS[0]) == 0


# --- the model (slow, small) ------------------------------------------------------------------------


@pytest.mark.slow
def test_measured_engine_answers_score_full_under_two_seeds(course_model):
    import random

    from lab_utils.engine import LLMEngine, SamplingParams

    for seed in SEEDS:
        sc = lab_scenario("04", seed)
        tok = random.Random(sc["token_seed"])
        prompts = [[tok.randint(300, 49000) for _ in range(n)] for n in sc["prompt_lens"]]
        params = SamplingParams(temperature=0, max_tokens=sc["max_tokens"], ignore_eos=True)
        bs = sc["block_size"]
        longest = max(sc["prompt_lens"]) + sc["max_tokens"]
        blocks = max(sum(-(-p // bs) for p in sc["prompt_lens"]), -(-longest // bs))
        eng = LLMEngine(
            course_model,
            device="cpu",
            dtype="float32",
            block_size=bs,
            num_kv_blocks=blocks,
            max_model_len=longest,
            max_num_seqs=4,
            max_num_batched_tokens=128,
            enable_prefix_caching=False,
        )
        run = eng.measure(prompts, params, label="tight")
        assert run.num_preemptions > 0
        assert earned("04.preemption", {"tight_run": run}, seed) == 2
        # a roomy cache holds each request's predicted peak of blocks
        roomy = LLMEngine(
            course_model,
            device="cpu",
            dtype="float32",
            block_size=bs,
            num_kv_blocks=64,
            max_num_seqs=4,
            enable_prefix_caching=False,
        )
        ns = solution_namespace("04", seed)
        assert roomy.measure(prompts, params).peak_blocks() == list(ns["predicted_blocks"])
    sweep = LLMEngine(
        course_model, device="cpu", dtype="float32", kv_cache_gib=0.05, enable_prefix_caching=False
    )
    work = [[random.Random(i).randint(300, 49000) for _ in range(16)] for i in range(4)]
    runs = {}
    for b in (1, 2, 4):
        sweep.scheduler.config.max_num_seqs = b
        runs[b] = sweep.measure(work, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    thr = {b: r.output_tokens / r.wall_s for b, r in runs.items()}
    assert earned("04.throughput_vs_batch", {"sweep_runs": runs, "throughput": thr}, SEEDS[0]) == 2
    assert (
        earned("04.throughput_vs_batch", {"sweep_runs": runs, "throughput": {1: 1, 2: 2, 4: 3}}, SEEDS[0])
        == 0
    )


def test_flags_must_leave_room_for_the_null_block():
    """A cache of exactly the blocks the goal needs is one short: vLLM keeps block 0 aside."""
    import math

    from lab_utils.grading import lab_scenario

    scen = lab_scenario("05", SEEDS[0])
    per_token = 2 * 30 * 3 * 64 * 4
    need = scen["goal_concurrency"] * math.ceil(scen["goal_context"] / 128)

    def answer(blocks: float) -> dict:
        gib = blocks * 128 * per_token / 2**30
        flags = {
            "kv_cache_gib": gib,
            "max_model_len": scen["goal_context"],
            "max_num_seqs": scen["goal_concurrency"],
        }
        whole = int(gib * 2**30) // (128 * per_token)
        return {"chosen_flags": flags, "predicted_concurrency": whole / math.ceil(scen["goal_context"] / 128)}

    assert earned("05.flags_for_goal", answer(need + 0.5), SEEDS[0]) == 0  # the old check's answer
    assert earned("05.flags_for_goal", answer(need + 1.5), SEEDS[0]) == 3
