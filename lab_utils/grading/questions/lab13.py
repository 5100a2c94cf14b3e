"""Lab 13 (mixture-of-experts serving): parameters and KV of today's MoE configs, a prediction of
MoE against dense decode speed, expert loads from raw router logits, expert placement with
replication, expert-parallel all-to-all bytes and capacity-factor drops.

Public checks run at most two fixed cases and a few properties; hidden checks (grader/hidden/lab13.py)
call the same functions on cases drawn from the judge's key.
"""

from __future__ import annotations

from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import limits, question, scenario

# graded as submitted (LIGHT = False): the kernel holds two vLLM engines, one after the other
limits("13", memory_mb=8192, timeout=1800)


@scenario("13")
def _(rng):
    """A context length, a CPU-like machine, the batches to compare and an EP layout (section 1 shows
    every published config, so the scenario picks none)."""
    return {
        "context_len": rng.choice([1024, 4096, 32768]),
        "bytes_per_s": rng.choice([8e9, 12e9, 20e9]),
        "flops_per_s": rng.choice([1e11, 2e11, 4e11]),
        "batches": [1, rng.choice([16, 32])],
        "ep_size": rng.choice([4, 8, 16]),
        "capacity_factor": rng.choice([1.0, 1.25, 1.5]),
        "num_gpus": rng.choice([2, 4]),
    }


# a tiny config in Mixtral's format: 2 layers, 4 experts, top-2
_TINY = {
    "model_type": "mixtral",
    "num_hidden_layers": 2,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "intermediate_size": 16,
    "vocab_size": 32,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "tie_word_embeddings": False,
}


@question("13.param_counts", points=2, answers=["param_counts"], forbid=refs("model_spec"))
def _(param_counts):
    """param_counts(config) -> (total, active): parameters stored, and those one token goes through."""
    total, active = (float(x) for x in param_counts(dict(_TINY)))
    assert 0 < active < total, "a token goes through 2 of 4 experts: fewer than all parameters"
    t1, a1 = (float(x) for x in param_counts({**_TINY, "num_experts_per_tok": 4}))
    assert t1 == total and a1 == total, "with every expert chosen, a token uses every parameter"


@question(
    "13.kv_per_token",
    points=2,
    answers=["kv_bytes_per_token"],
    forbid=refs("model_spec", "kv_per_token"),
)
def _(kv_bytes_per_token):
    """kv_bytes_per_token(config, dtype_bytes, context_len): KV bytes per token, averaged over a
    sequence of context_len tokens, for ordinary, latent (MLA) and sliding-window attention."""
    dense = float(kv_bytes_per_token(dict(_TINY), 2, 100))
    assert dense > 0 and float(kv_bytes_per_token(dict(_TINY), 2, 10_000)) == dense, (
        "without a window every token stores the same bytes, however long the sequence"
    )
    mla = {**_TINY, "kv_lora_rank": 4, "qk_rope_head_dim": 2, "qk_nope_head_dim": 4, "v_head_dim": 4}
    assert float(kv_bytes_per_token(mla, 2, 100)) != dense, "latent attention caches something else"


@question("13.predict_speed", points=3, answers=["predict_speed_ratio"], predict=True)
def _(predict_speed_ratio):
    """predict_speed_ratio(model, batch): MoE decode tok/s divided by dense decode tok/s."""
    m = {
        "shared_bytes": 1e8,
        "expert_bytes": 1e8,
        "num_experts": 4,
        "top_k": 2,
        "bytes_per_param": 2,
        "bytes_per_s": 1e10,
        "flops_per_s": 1e11,
    }
    one = float(predict_speed_ratio(dict(m), 1))
    assert 0 < one < 1, "at batch 1 the MoE reads two experts' weights where the dense model reads one MLP"
    assert float(predict_speed_ratio({**m, "num_experts": 1, "top_k": 1}, 8)) == 1.0, (
        "one expert is the dense model"
    )


@question("13.expert_load", points=3, answers=["expert_load"])
def _(expert_load):
    """expert_load(logits, top_k) -> {"counts": tokens routed to each expert, "imbalance": max/mean}."""
    got = expert_load([[0.1, 0.9, 0.3], [0.8, 0.2, 0.5]], 1)
    assert [int(c) for c in got["counts"]] == [1, 1, 0], "each token goes to its highest-scoring expert"
    two = expert_load([[0.1, 0.9, 0.3], [0.8, 0.2, 0.5]], 2)
    assert sum(int(c) for c in two["counts"]) == 4 and float(two["imbalance"]) >= 1.0, (
        "top-2 routes every token twice; the busiest expert is at least the mean"
    )


# vLLM's own expert load balancer (EPLB) places and replicates experts: the question asks for it
@question("13.placement", points=3, answers=["place_experts"], forbid=refs("expert_placement"))
def _(place_experts):
    """place_experts(loads, num_gpus, slots_per_gpu) -> expert ids on each GPU (replicas allowed)."""
    gpus = [[int(e) for e in g] for g in place_experts([10.0, 1.0, 1.0, 1.0], 2, 2)]
    assert len(gpus) == 2 and all(len(g) == 2 for g in gpus), "num_gpus lists of slots_per_gpu experts"
    assert {e for g in gpus for e in g} == {0, 1, 2, 3}, "every expert needs a home"
    gpus = [[int(e) for e in g] for g in place_experts([10.0, 1.0, 1.0], 2, 2)]
    assert sum(g.count(0) for g in gpus) == 2, "a free slot is best spent on a copy of the busiest expert"


@question("13.a2a_bytes", points=2, answers=["a2a_bytes"])
def _(a2a_bytes):
    """a2a_bytes(config, ep_size, dispatch_bytes, combine_bytes) -> (dispatch, combine) bytes per MoE
    layer for one token, in expectation: dispatch sent by the token's rank to its experts' other
    ranks, combine sent back by those ranks; routing uniform, no deduplication."""
    d1, c1 = (float(x) for x in a2a_bytes(dict(_TINY), 1, 1, 2))
    assert d1 == 0 and c1 == 0, "with one rank every expert is local"
    d, c = (float(x) for x in a2a_bytes(dict(_TINY), 4, 1, 2))
    assert 0 < d < c, "the dispatch here goes out in 1-byte values, the combine in 2-byte ones"


@question("13.capacity", points=2, answers=["capacity_drops"])
def _(capacity_drops):
    """capacity_drops(counts, top_k, capacity_factor) -> (dropped, padded) token slots."""
    dropped, padded = (int(x) for x in capacity_drops([2, 2, 2, 2], 2, 1.0))
    assert dropped == 0 and padded == 0, "a perfectly even load fits capacity 1.0 exactly"
    dropped, padded = (int(x) for x in capacity_drops([8, 0, 0, 0], 1, 1.0))
    assert dropped > 0 and padded > 0, "one busy expert overflows while the idle ones hold empty slots"
