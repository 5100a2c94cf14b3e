"""The fast path (engine/fast.py) against the readable model (engine/llama.py).

A tiny random Llama checkpoint runs both in seconds: the same logits within float32 rounding at
every step (prompts, chunks after cached tokens, decodes) and the same greedy tokens through the
engine, with vLLM's paged kernel (block size 16) and with the fallback (block size 4). The course
model's comparison, against transformers too, is marked slow.
"""

from __future__ import annotations

import json

import pytest

from lab_utils.engine import LLMEngine, SamplingParams
from lab_utils.engine.fast import FastLlamaModel, fast_enabled
from lab_utils.engine.llama import LlamaModel
from lab_utils.engine.model_runner import ModelRunner
from lab_utils.engine.request import Request
from lab_utils.engine.scheduler import SchedulerOutput

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls: one thread is faster, and a busy second core cannot stall every op."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 2-layer Llama with random weights: head_dim 32, 4 query heads sharing 2 KV heads."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tiny_llama")
    hidden, heads, kv_heads, dim, inter, vocab, layers = 128, 4, 2, 32, 256, 512, 2
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": dim,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "eos_token_id": 0,
    }
    (folder / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=0.08):
        return torch.randn(*shape, generator=gen) * scale

    weights = {
        "model.embed_tokens.weight": rand(vocab, hidden, scale=1.0),
        "model.norm.weight": 1 + rand(hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": 1 + rand(hidden),
            p + "post_attention_layernorm.weight": 1 + rand(hidden),
            p + "self_attn.q_proj.weight": rand(heads * dim, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * dim, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * dim),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
        }
    save_file(weights, str(folder / "model.safetensors"))
    return folder


class Ids:
    """A tokenizer stand-in: the prompts are token ids already."""

    def encode(self, text):
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def test_the_switch_reads_the_environment(monkeypatch):
    monkeypatch.delenv("LAB_ENGINE_FAST", raising=False)
    assert fast_enabled() is True
    monkeypatch.setenv("LAB_ENGINE_FAST", "0")
    assert fast_enabled() is False and fast_enabled(True) is True
    monkeypatch.setenv("LAB_ENGINE_FAST", "1")
    assert fast_enabled() is True and fast_enabled(False) is False


def _runner(folder, fast: bool, block_size: int, num_blocks: int = 64) -> ModelRunner:
    runner = ModelRunner(folder, device="cpu", dtype=torch.float32, fast=fast)
    runner.initialize_kv_cache(num_blocks, block_size)
    return runner


@pytest.mark.parametrize("block_size", [16, 4])
def test_fast_logits_equal_readable_logits_step_by_step(tiny_model, block_size):
    """Three steps: two prompts; a decode, a prompt chunk and a new prompt; decodes and the rest."""
    readable, fast = (_runner(tiny_model, f, block_size) for f in (False, True))
    assert isinstance(readable.model, LlamaModel) and not isinstance(readable.model, FastLlamaModel)
    assert isinstance(fast.model, FastLlamaModel)
    if block_size == 16:
        assert fast.model.paged_kernel == fast.model.use_kernels  # the kernel runs where it is installed
    else:
        assert not fast.model.paged_kernel  # 4 is not a multiple of 16: grouped decode attention
    gen = torch.Generator().manual_seed(1)
    prompts = {"a": 37, "b": 5, "c": 50, "d": 9}
    reqs = {
        r: Request(r, torch.randint(1, 512, (n,), generator=gen).tolist(), SamplingParams(temperature=0))
        for r, n in prompts.items()
    }
    blocks, next_block = {}, 1

    def step(plan: dict[str, int]):
        nonlocal next_block
        for rid, n in plan.items():  # hand out blocks in order, enough for the context after the step
            have = blocks.setdefault(rid, [])
            while len(have) * block_size < reqs[rid].num_computed_tokens + n:
                have.append(next_block)
                next_block += 1
        so = SchedulerOutput(
            num_scheduled_tokens=dict(plan),
            req_ids=list(plan),
            num_computed_tokens={r: reqs[r].num_computed_tokens for r in plan},
            block_tables={r: list(blocks[r]) for r in plan},
        )
        logits = []
        for runner in (readable, fast):
            inputs = runner.prepare_inputs(so, reqs)
            with torch.inference_mode():
                logits.append(runner.model.forward(*inputs[:4]))
        torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)
        tokens = logits[0].argmax(-1).tolist()
        assert logits[1].argmax(-1).tolist() == tokens
        for rid, n in plan.items():
            reqs[rid].num_computed_tokens += n
        for rid, tok in zip(inputs[4], tokens):  # requests whose chunk reached their end
            reqs[rid].append_output_token(tok)
        return sorted(inputs[4])

    assert step({"a": 37, "b": 5, "c": 20}) == ["a", "b"]  # c: a first chunk, samples nothing
    assert step({"a": 1, "b": 1, "c": 30, "d": 9}) == ["a", "b", "c", "d"]
    assert step({"a": 1, "b": 1, "c": 1, "d": 1}) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("block_size", [16, 4])
def test_fast_engine_gives_the_readable_engines_greedy_tokens(tiny_model, block_size):
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (3, 40, 17, 70, 8)]
    prompts.append(prompts[3][:60] + [7, 8])  # a shared prefix: cached blocks when caching is on
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = {}
    for fast in (False, True):
        eng = LLMEngine(
            tiny_model,
            tokenizer=Ids(),
            fast=fast,
            block_size=block_size,
            num_kv_blocks=256 // block_size * 4,
            max_num_seqs=4,
            max_num_batched_tokens=32,  # chunks the longer prompts
            dtype="float32",
            device="cpu",
        )
        outs[fast] = [o.outputs[0].token_ids for o in eng.generate(prompts, params)]
    assert outs[True] == outs[False]


# --- the course model (slow) -------------------------------------------------------------------
@pytest.mark.slow
def test_course_model_readable_and_fast_paths_agree_with_transformers(course_model):
    """Both paths give transformers' greedy tokens; their logits on a mixed batch agree."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = ["The capital of France is", "def fibonacci(n):", "List three colors:"]
    tok = AutoTokenizer.from_pretrained(course_model)
    ref = AutoModelForCausalLM.from_pretrained(course_model, dtype=torch.float32).eval()
    expected = []
    for p in prompts:
        ids = tok(p, return_tensors="pt")
        with torch.inference_mode():
            gen = ref.generate(**ids, max_new_tokens=16, do_sample=False)
        expected.append(gen[0, ids["input_ids"].shape[1] :].tolist())
    params = SamplingParams(temperature=0, max_tokens=16)
    for fast in (False, True):
        eng = LLMEngine(
            course_model, fast=fast, max_num_seqs=4, num_kv_blocks=64, dtype="float32", device="cpu"
        )
        assert [o.outputs[0].token_ids for o in eng.generate(prompts, params)] == expected, f"fast={fast}"


def test_a_draft_model_proposer_feeds_the_same_verification(tiny_model):
    """The target drafting for itself: every greedy draft is kept, the tokens are those of one-token
    steps, in fewer steps; sampled requests run through the same rejection sampler."""
    from lab_utils.engine.spec_decode import DraftModelProposer

    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (3, 21, 9)]
    greedy = SamplingParams(temperature=0, max_tokens=13, ignore_eos=True)

    def engine():
        return LLMEngine(tiny_model, tokenizer=Ids(), fast=False, block_size=16, num_kv_blocks=64,
                         max_num_seqs=4, dtype="float32", device="cpu")  # fmt: skip

    plain = engine()
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, greedy)]
    spec = engine()
    spec.proposer = DraftModelProposer(tiny_model, num_speculative_tokens=3, max_model_len=512)
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, greedy)]
    assert got == want
    drafted = sum(s.num_spec_tokens for s in spec.snapshots)
    assert drafted > 0 and sum(s.num_accepted_tokens for s in spec.snapshots) == drafted
    assert len(spec.snapshots) < len(plain.snapshots)
    free = spec.kv_cache_manager.num_free_blocks
    sampled = SamplingParams(temperature=0.8, max_tokens=10, ignore_eos=True, seed=3)
    outs = spec.generate(prompts, sampled)
    assert [len(o.outputs[0].token_ids) for o in outs] == [10, 10, 10]
    assert spec.kv_cache_manager.num_free_blocks == free  # rejected drafts' slots were given back
