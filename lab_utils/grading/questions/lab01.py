"""Lab 01 — GPU memory math and provisioning: graded questions.

Every check runs the learner's function on small, fixed cases and compares with numbers computed
here from first principles (never with the learner's own objects). Hints say what to count,
never the number.
"""

from __future__ import annotations

import math

from lab_utils.grading.registry import question

GiB = 1 << 30

# (layers, kv_heads, head_dim) of the three shapes the lab uses
SHAPES = {"SmolLM2-135M": (30, 3, 64), "Llama-3-8B": (32, 8, 128), "Llama-3-70B": (80, 8, 128)}


def _kv(layers: int, kv_heads: int, head_dim: int, nbytes: int) -> int:
    return 2 * layers * kv_heads * head_dim * nbytes


@question("01.kv_bytes_per_token", points=2, answers=["kv_bytes_per_token"])
def _(kv_bytes_per_token):
    """KV-cache bytes one token occupies, from layers, KV heads, head_dim and bytes per element."""
    got = int(kv_bytes_per_token(1, 1, 1, 1))
    assert got != 1, "a token stores two vectors per layer and KV head: a key AND a value"
    assert got == 2, "for one layer, one KV head of size 1 at 1 byte, a token needs exactly 2 bytes"
    assert int(kv_bytes_per_token(32, 8, 128, 2)) != 2 * 32 * 32 * 128 * 2, \
        "count KV heads (num_key_value_heads), not query heads: that is what grouped-query attention saves"
    for layers, heads, dim in SHAPES.values():
        for nbytes in (1, 2, 4):
            assert int(kv_bytes_per_token(layers, heads, dim, nbytes)) == _kv(layers, heads, dim, nbytes), \
                "multiply layers, KV heads, head_dim, bytes per element, and K plus V"


@question("01.kv_per_token_models", points=1, answers=["kv_per_token"])
def _(kv_per_token):
    """bfloat16 KV bytes per token for the SmolLM2, Llama-3-8B-shaped and Llama-3-70B-shaped configs."""
    table = {str(k): int(v) for k, v in dict(kv_per_token).items()}
    missing = [name for name in SHAPES if name not in table]
    assert not missing, f"kv_per_token needs the keys {list(SHAPES)}; missing {missing}"
    for name, (layers, heads, dim) in SHAPES.items():
        want = _kv(layers, heads, dim, 2)
        assert table[name] != want * 2, f"{name}: bfloat16 is 2 bytes per element, not 4"
        assert table[name] == want, f"{name}: read num_hidden_layers, num_key_value_heads and head_dim " \
                                    "(hidden_size // num_attention_heads) from its config"


@question("01.kv_cache_left", points=1, answers=["kv_cache_left_gib"])
def _(kv_cache_left_gib):
    """GiB per GPU left for KV cache after weights (split by TP), activations and overhead."""
    cases = [((80, 0.9, 16, 1, 1.5, 1), 72 - 16 - 2.5), ((80, 0.9, 140, 1, 1.5, 2), 72 - 70 - 2.5),
             ((24, 0.5, 2, 0.5, 0.5, 1), 12 - 3), ((80, 1.0, 140, 1, 1.5, 4), 80 - 35 - 2.5)]
    for args, want in cases:
        got = float(kv_cache_left_gib(*args))
        if args[-1] > 1 and math.isclose(got, args[0] * args[1] - args[2] - args[3] - args[4], abs_tol=1e-6):
            raise AssertionError("with tensor parallelism each GPU holds only its share of the weights")
        if math.isclose(got, args[0] - args[2] / args[-1] - args[3] - args[4], abs_tol=1e-6) and args[1] != 1:
            raise AssertionError("vLLM's budget is gpu_memory_utilization x total, not the whole GPU")
        assert math.isclose(got, want, abs_tol=1e-6), \
            "budget = utilization x total; subtract this GPU's weights, activations and overhead"


@question("01.vllm_capacity", points=2, answers=["vllm_capacity"])
def _(vllm_capacity):
    """vLLM's logged KV cache size (tokens) and maximum concurrency for a KV cache of a given size."""
    block = 128 * 46_080
    cases = [(GiB, 46_080, 128, 8192), (GiB, 46_080, 128, 2000), (GiB, 23_040, 128, 8192),
             (10 * block + block // 2, 46_080, 128, 1000), (7_000_000, 100, 16, 40)]
    for kv, per_token, bs, max_len in cases:
        blocks = kv // (bs * per_token)
        conc = blocks / -(-max_len // bs)
        tokens, concurrency = vllm_capacity(kv, per_token, bs, max_len)
        if int(tokens) == kv // per_token and int(tokens) != int(conc * max_len):
            raise AssertionError("vLLM hands out whole blocks of block_size tokens; a partial block is never used")
        if math.isclose(float(concurrency), blocks * bs / max_len, rel_tol=1e-9) and max_len % bs:
            raise AssertionError("each request occupies whole blocks: ceil(max_model_len / block_size) of them")
        assert math.isclose(float(concurrency), conc, rel_tol=1e-9), \
            "concurrency = whole blocks / blocks one request of max_model_len needs"
        assert int(tokens) == int(conc * max_len), \
            "vLLM logs int(max_concurrency x max_model_len) as its KV cache size in tokens"


@question("01.vllm_refuses", points=1, answers=["vllm_refuses"])
def _(vllm_refuses):
    """Whether vLLM refuses to start because one request of max_model_len does not fit."""
    block = 128 * 46_080
    cases = [(65 * block, 64), (65 * block - 1, 64), (64 * block, 64), (GiB, 64), (128 << 20, 64),
             (3 * block, 1), (2 * block, 2)]
    for kv, blocks_needed in cases:
        refuse = kv // block - 1 < blocks_needed
        got = bool(vllm_refuses(kv, 46_080, 128, blocks_needed * 128))
        if got != refuse and kv // block == blocks_needed:
            raise AssertionError("the block pool keeps one 'null' block back that no request can use")
        assert got == refuse, "refuse when the usable whole blocks cannot hold one request of max_model_len"


@question("01.seed_kv_fix", points=2, answers=["fixed_kv_cache_gib", "seed_kv_error_factor"])
def _(fixed_kv_cache_gib, seed_kv_error_factor):
    """A corrected KV estimate (GiB) for the helper found online, and how far off the original was."""
    for layers, heads, dim in SHAPES.values():
        for batch, seq, nbytes in ((32, 4096, 2), (1, 8192, 2), (4, 1000, 1)):
            want = _kv(layers, heads, dim, nbytes) * batch * seq / GiB
            got = float(fixed_kv_cache_gib(layers, heads, dim, nbytes, batch, seq))
            assert not math.isclose(got, want * 1.073741824, rel_tol=1e-3), "return GiB (2**30 bytes), not GB"
            assert math.isclose(got, want, rel_tol=1e-6), \
                "KV bytes per token x batch x sequence length, converted to GiB"
    factor = float(seed_kv_error_factor)
    assert factor > 1, "divide the seed's estimate by the correct one (it overestimates)"
    assert 10_000 <= factor <= 12_000, ("compare the seed's kv_cache_gb with the correct value for the "
                                        "same 70B model, batch 32 and 4096 tokens")


@question("01.gpus_needed", points=2, answers=["gpus_needed"])
def _(gpus_needed):
    """GPU count: round up, then up again to a tensor-parallel degree that divides the heads."""
    cases = [((100, 80, 0.9, 64), 2), ((144, 80, 0.9, 64), 2), ((60, 80, 0.9, 64), 1),
             ((150, 80, 0.9, 64), 4), ((50, 24, 0.9, 9), 3), ((80, 24, 0.9, 9), 9), ((300, 80, 0.9, 40), 5)]
    for args, want in cases:
        got = int(gpus_needed(*args))
        raw = args[0] / (args[1] * args[2])
        if got == max(1, int(raw)) and got != want:
            raise AssertionError("int() rounds DOWN: 1.4 GPUs' worth of memory needs 2 GPUs")
        if got == math.ceil(raw) and got != want:
            raise AssertionError("vLLM needs tensor_parallel_size to divide the number of attention heads")
        assert got == want, "smallest count that holds the memory AND divides the attention heads"


@question("01.decode_roofline", points=2, answers=["decode_tokens_per_s"])
def _(decode_tokens_per_s):
    """Memory-bound decode throughput: batch / (bytes read per step / bandwidth)."""
    cases = [(1, 16e9, 0, 3.35e12), (64, 16e9, 0.5e9, 3.35e12), (8, 140e9, 2e9, 2e12), (256, 1e9, 1e6, 1e12)]
    for batch, weights, kv_seq, bw in cases:
        want = batch * bw / (weights + batch * kv_seq)
        got = float(decode_tokens_per_s(batch, weights, kv_seq, bw))
        if math.isclose(got, bw / (weights + batch * kv_seq), rel_tol=1e-6) and batch > 1:
            raise AssertionError("one step produces one token for EVERY sequence in the batch")
        if math.isclose(got, batch * bw / (batch * (weights + kv_seq)), rel_tol=1e-6) and batch > 1:
            raise AssertionError("the weights are read once per step and shared by the whole batch")
        assert math.isclose(got, want, rel_tol=1e-6), \
            "a step reads all weights once plus every sequence's KV cache; tokens/s = batch / step time"
