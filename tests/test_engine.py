"""lab_utils.engine: exact scheduler plans on tiny configs (no model), and the real model checked
token for token against transformers `generate` in float32 (slow)."""

from __future__ import annotations

import json

import pytest

from lab_utils.engine import (
    EngineConfig,
    Request,
    RequestStatus,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    StepSnapshot,
    to_sim_result,
)
from lab_utils.engine.llama import LlamaConfig
from lab_utils.engine.sampler import apply_top_k_top_p
from lab_utils.kv import KVCacheManager


# --- configs -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_sampling_params_reject_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


def test_sampling_params_normalise():
    p = SamplingParams(top_k=-1, stop="###", stop_token_ids=[7])
    assert (p.top_k, p.stop_strings, p.stop_token_ids, p.greedy) == (0, ["###"], [7], False)
    assert SamplingParams(temperature=0).greedy


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"block_size": 0}, "block_size"),
        ({"num_kv_blocks": 0}, "num_kv_blocks"),
        ({"dtype": "int8"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"max_model_len": 1}, "max_model_len"),
        ({"kv_cache_gib": 0}, "kv_cache_gib"),
    ],
)
def test_engine_config_rejects_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(**kwargs)


def test_top_k_top_p_masks_exactly():
    import torch

    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    keep = lambda out: (out > float("-inf")).tolist()  # noqa: E731
    assert keep(apply_top_k_top_p(logits, 2, 1.0)) == [True, True, False, False]
    assert keep(apply_top_k_top_p(logits, 0, 0.5)) == [True, False, False, False]
    assert keep(apply_top_k_top_p(logits, 0, 0.8)) == [True, True, False, False]
    assert keep(apply_top_k_top_p(logits, 0, 0.81)) == [True, True, True, False]
    assert keep(apply_top_k_top_p(logits, 3, 1.0)) == [True, True, True, False]


# --- the scheduler, without a model ------------------------------------------------------------
def make_scheduler(num_blocks=16, block_size=4, **cfg) -> Scheduler:
    cfg.setdefault("max_model_len", 64)
    return Scheduler(KVCacheManager(num_blocks, block_size, enable_caching=False), SchedulerConfig(**cfg))


def req(rid: str, n: int, max_tokens: int = 8) -> Request:
    return Request(
        rid, list(range(100, 100 + n)), SamplingParams(temperature=0, max_tokens=max_tokens), eos_token_id=2
    )


def run_step(s: Scheduler, token: int = 5):
    out = s.schedule()
    sampled = {
        rid: token
        for rid, n in out.num_scheduled_tokens.items()
        if out.num_computed_tokens[rid] + n == s.requests[rid].num_tokens
    }
    return out, s.update_from_output(out, sampled)


def test_chunked_prefill_splits_the_budget_and_decodes_go_first():
    s = make_scheduler(max_num_batched_tokens=8)
    s.add_request(req("a", 6))
    s.add_request(req("b", 10))
    out, _ = run_step(s)
    assert out.num_scheduled_tokens == {"a": 6, "b": 2}  # b gets what is left: a chunk
    assert out.new_req_ids == ["a", "b"]
    assert out.block_tables == {"a": [0, 1], "b": [2]}
    out, _ = run_step(s)
    assert out.num_scheduled_tokens == {"a": 1, "b": 7}  # a decodes, b continues its prompt
    assert out.num_computed_tokens == {"a": 6, "b": 2}
    out, _ = run_step(s)
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}  # b's last prompt token, then it samples
    assert s.requests["b"].output_token_ids == [5]


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    s = make_scheduler(max_num_batched_tokens=8, enable_chunked_prefill=False)
    s.add_request(req("a", 6))
    s.add_request(req("b", 5))
    out, _ = run_step(s)
    assert out.num_scheduled_tokens == {"a": 6}


def test_max_num_seqs_caps_the_batch():
    s = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64)
    for r in "abc":
        s.add_request(req(r, 3))
    out, _ = run_step(s)
    assert list(out.num_scheduled_tokens) == ["a", "b"] and out.num_waiting == 1


def test_preemption_by_recompute_frees_the_newest_and_requeues_it_first():
    # 4 blocks of 4 tokens; two prompts of 7 tokens take 2 blocks each; the 9th token needs a 3rd.
    s = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=32, max_model_len=16)
    s.add_request(req("a", 7))
    s.add_request(req("b", 7))
    out, _ = run_step(s)
    assert out.block_tables == {"a": [0, 1], "b": [2, 3]}
    out, _ = run_step(s)  # both decode their 8th token: still 2 blocks each
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    out, _ = run_step(s)  # a needs block 3 for token 9: b (newest) is preempted
    assert out.preempted_req_ids == ["b"] and out.num_scheduled_tokens == {"a": 1}
    b = s.requests["b"]
    assert (b.status, b.num_computed_tokens, b.num_preemptions) == (RequestStatus.PREEMPTED, 0, 1)
    assert b.output_token_ids == [5, 5]  # generated tokens are kept and recomputed later
    assert list(s.waiting) == [b]
    assert s.kv_cache_manager.get_block_ids("a") == [0, 1, 3]  # the tail block freed last goes first


def test_a_finished_request_frees_every_block():
    s = make_scheduler(max_num_batched_tokens=32)
    s.add_request(req("a", 5, max_tokens=3))
    finished = []
    while s.has_unfinished_requests():
        finished += run_step(s)[1]
    assert [r.request_id for r in finished] == ["a"]
    assert finished[0].status is RequestStatus.FINISHED_LENGTH_CAPPED
    assert finished[0].output_token_ids == [5, 5, 5]
    assert s.kv_cache_manager.num_free_blocks == 16


def test_eos_and_stop_tokens_and_max_model_len_finish():
    s = make_scheduler(max_num_batched_tokens=32, max_model_len=7)
    s.add_request(req("eos", 3))
    s.add_request(Request("stop", [9, 9, 9], SamplingParams(temperature=0, stop_token_ids=[5])))
    s.add_request(req("len", 5, max_tokens=99))
    out = s.schedule()
    done = s.update_from_output(out, {"eos": 2, "stop": 5, "len": 6})
    assert {r.request_id: (r.status.value, r.stop_reason) for r in done} == {
        "eos": ("stop", None),
        "stop": ("stop", 5),
    }
    out = s.schedule()
    done = s.update_from_output(out, {"len": 6})
    assert [(r.request_id, r.status.value) for r in done] == [("len", "length")]  # 5 + 2 = 7 tokens


def test_a_lab03_schedule_function_drives_the_scheduler():
    from lab_utils.sim.scheduler import reference_schedule

    s = Scheduler(
        KVCacheManager(4, 4, enable_caching=False),
        SchedulerConfig(max_num_batched_tokens=32, max_model_len=16),
        schedule_fn=reference_schedule,
    )
    s.add_request(req("a", 7))
    s.add_request(req("b", 7))
    for _ in range(2):
        run_step(s)
    out, _ = run_step(s)
    assert out.preempted_req_ids == ["b"] and out.num_scheduled_tokens == {"a": 1}


def test_a_bad_plan_is_refused_with_a_reason():
    class Greedy:  # schedules a waiting request without admitting it
        num_scheduled_tokens = {"a": 3}
        preempted_req_ids: list = []

    s = make_scheduler()
    s.schedule_fn = lambda state: Greedy()
    s.add_request(req("a", 3))
    with pytest.raises(RuntimeError, match="not running"):
        s.schedule()


def test_snapshots_become_a_lab03_result():
    snaps = [
        StepSnapshot(1, 0.0, 0.0, 1.0, 0.0, {"a": 4}, [], {"a": 4}, {"a": [0]}, ["a"], [], [], 1, 0, 0.5, 1),
        StepSnapshot(2, 1.0, 0.0, 1.0, 0.0, {}, ["a"], {"a": 5}, {"a": [0, 1]}, [], [], ["a"], 0, 0, 0.0, 2),
    ]
    res = to_sim_result(snaps, prompt_lens={"a": 4}, output_lens={"a": 2}, num_slots=2)
    rec = res.request("a")
    assert (rec.scheduled_time, rec.first_token_time, rec.finish_time) == (0.0, 1.0, 2.0)
    assert [(r.slot, r.start, r.prefill_end, r.end) for r in rec.residencies] == [(0, 0.0, 1.0, 2.0)]
    assert [st.num_tokens for st in res.steps] == [4, 1]


def test_foreign_architecture_is_refused_before_loading(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        LlamaConfig.from_folder(tmp_path)
    from lab_utils.engine import LLMEngine

    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        LLMEngine(tmp_path)
    with pytest.raises(ValueError, match="config.json"):
        LLMEngine(tmp_path / "missing")


# --- the real model (slow) ---------------------------------------------------------------------
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "List three colors:",
    "1, 2, 3, 4,",
]
MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW)


@pytest.fixture(scope="module")
def reference(course_model):
    """transformers' greedy continuation of each prompt, float32, one prompt at a time."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(course_model)
    model = AutoModelForCausalLM.from_pretrained(course_model, dtype=torch.float32).eval()
    out = {}
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt")
        with torch.inference_mode():
            gen = model.generate(**ids, max_new_tokens=MAX_NEW, do_sample=False)
        out[p] = gen[0, ids["input_ids"].shape[1] :].tolist()
    return out


@pytest.fixture(scope="module")
def engine(course_model):
    from lab_utils.engine import LLMEngine

    return LLMEngine(
        course_model, max_num_seqs=8, block_size=4, num_kv_blocks=128, dtype="float32", device="cpu"
    )


def same(outputs, reference) -> list[bool]:
    return [o.outputs[0].token_ids == reference[p] for p, o in zip(PROMPTS, outputs)]


@pytest.mark.slow
def test_greedy_matches_transformers_one_at_a_time(engine, reference):
    outs = [engine.generate(p, GREEDY)[0] for p in PROMPTS]
    assert same(outs, reference) == [True] * len(PROMPTS)
    assert outs[0].outputs[0].text == engine.tokenizer.decode(reference[PROMPTS[0]], skip_special_tokens=True)


@pytest.mark.slow
def test_greedy_matches_transformers_batched_mixed_lengths(engine, reference):
    outs = engine.generate(PROMPTS, GREEDY)
    assert same(outs, reference) == [True] * len(PROMPTS)
    assert max(s.num_active for s in engine.snapshots) == len(PROMPTS)
    assert engine.kv_cache_manager.num_free_blocks == engine.num_blocks  # nothing leaked


@pytest.mark.slow
def test_token_ids_in_and_prefix_cache_hits_give_the_same_tokens(engine, reference):
    ids = engine.tokenizer.encode(PROMPTS[2])
    first = engine.generate([ids], GREEDY)[0]
    again = engine.generate([ids], GREEDY)[0]  # full blocks of the prompt now come from the cache
    assert again.metrics.num_cached_tokens > 0
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == reference[PROMPTS[2]]


@pytest.mark.slow
def test_greedy_matches_with_preemption_and_chunked_prefill(course_model, reference):
    from lab_utils.engine import LLMEngine

    # 14 blocks of 4 tokens cannot hold five requests of ~30 tokens; 16-token budget chunks prompts.
    eng = LLMEngine(
        course_model,
        max_num_seqs=8,
        block_size=4,
        num_kv_blocks=14,
        max_model_len=48,
        max_num_batched_tokens=16,
        enable_prefix_caching=False,
        dtype="float32",
        device="cpu",
    )
    outs = eng.generate(PROMPTS, GREEDY)
    assert eng.scheduler.num_preemptions > 0
    assert any(len(s.prefill) and s.num_prefill_tokens < 17 and s.decode for s in eng.snapshots)
    assert same(outs, reference) == [True] * len(PROMPTS)
    assert eng.kv_cache_manager.num_free_blocks == 14


@pytest.mark.slow
def test_seeded_sampling_is_reproducible_in_any_batch(engine):
    sp = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=1234, max_tokens=12)
    alone = engine.generate(PROMPTS[0], sp)[0].outputs[0].token_ids
    crowd = engine.generate(PROMPTS, [sp] + [SamplingParams(temperature=1.0, max_tokens=12)] * 4)
    assert crowd[0].outputs[0].token_ids == alone
    other = engine.generate(
        PROMPTS[0], SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=99, max_tokens=12)
    )[0]
    assert other.outputs[0].token_ids != alone


@pytest.mark.slow
def test_stop_strings_stop_tokens_and_streaming(engine, reference):
    ref = reference[PROMPTS[4]]  # " 5, 6, 7, ..."
    out = engine.generate(PROMPTS[4], SamplingParams(temperature=0, max_tokens=MAX_NEW, stop=" 7"))[0]
    assert out.outputs[0].text == " 5, 6," and out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason == " 7"
    k = next(i for i in range(2, len(ref)) if ref[i] not in ref[:i])  # first new token after two
    out = engine.generate(
        PROMPTS[4], SamplingParams(temperature=0, max_tokens=MAX_NEW, stop_token_ids=[ref[k]])
    )[0]
    assert out.outputs[0].token_ids == ref[: k + 1] and out.outputs[0].stop_reason == ref[k]
    seen = list(engine.stream(PROMPTS[4], SamplingParams(temperature=0, max_tokens=6)))
    assert [len(o.outputs[0].token_ids) for o in seen] == [1, 2, 3, 4, 5, 6]
    assert [o.finished for o in seen] == [False] * 5 + [True]
    assert seen[-1].outputs[0].token_ids == ref[:6]


@pytest.mark.slow
def test_bad_requests_raise_and_the_engine_keeps_serving(engine, reference):
    engine.add_request("keep", PROMPTS[0], GREEDY)
    engine.step()
    engine.step()
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("long", [300] * engine.max_model_len, GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("empty", "", GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.add_request("oov", [10**9], GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("keep", PROMPTS[1], GREEDY)
    with pytest.raises(ValueError, match="empty"):  # a bad prompt in a list queues none of them
        engine.generate([PROMPTS[1], ""], GREEDY)
    assert engine.get_num_unfinished_requests() == 1
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert done["keep"].outputs[0].token_ids == reference[PROMPTS[0]]
    assert engine.generate(PROMPTS[1], GREEDY)[0].outputs[0].token_ids == reference[PROMPTS[1]]
    assert engine.kv_cache_manager.num_free_blocks == engine.num_blocks


@pytest.mark.slow
def test_learner_parts_plug_in(course_model, reference):
    from lab_utils.engine import LLMEngine
    from lab_utils.sim.scheduler import reference_schedule

    kv = KVCacheManager(64, 8, enable_caching=False)  # an instance, as a learner would pass theirs
    eng = LLMEngine(
        course_model,
        kv_cache_manager=kv,
        schedule_fn=reference_schedule,
        max_num_seqs=4,
        dtype="float32",
        device="cpu",
        record_frames=True,
    )
    assert eng.block_size == 8 and eng.num_blocks == 64
    outs = eng.generate(PROMPTS, GREEDY)
    assert same(outs, reference) == [True] * len(PROMPTS)
    frames = [s.frame for s in eng.snapshots]
    assert max(len(f.block_tables) for f in frames) == 4 and frames[-1].block_tables == {}
    assert kv.num_free_blocks == 64
