"""Lab 13: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab13`. Parameter and KV counts are graded against the course's
calculator (`lab_utils.memory`, which the questions forbid); every other reference is here.
"""

from __future__ import annotations

import math

from grader.registry import hidden
from lab_utils.grading.checks import close
from lab_utils.memory import ModelSpec, kv_cache_bytes_per_token

_DTYPES = {1: "fp8", 2: "bfloat16", 4: "float32"}


def _config(rng, kind=None):
    """A made-up config in one of the published MoE formats."""
    kind = kind or rng.choice(["mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "llama"])
    kv = rng.choice([1, 2, 4, 8])
    heads = kv * rng.choice([1, 2, 4, 8])
    hd = rng.choice([32, 64, 128])
    layers = rng.randint(2, 64)
    cfg = {
        "model_type": kind,
        "num_hidden_layers": layers,
        "hidden_size": rng.choice([512, 1024, 2048, 4096]),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "intermediate_size": rng.choice([1024, 2816, 6144]),
        "vocab_size": rng.choice([32000, 151936]),
        "tie_word_embeddings": rng.random() < 0.3,
    }
    if kind == "llama":
        return cfg
    experts = rng.choice([4, 8, 16, 64, 128])
    top = rng.choice([k for k in (1, 2, 4, 8) if k <= experts])
    if kind == "mixtral":
        cfg.update(num_local_experts=experts, num_experts_per_tok=top)
    elif kind == "qwen3_moe":
        cfg.update(num_experts=experts, num_experts_per_tok=top, moe_intermediate_size=rng.choice([256, 768]))
    elif kind == "gpt_oss":
        pattern = ["sliding_attention", "full_attention"]
        cfg.update(
            num_local_experts=experts,
            num_experts_per_tok=top,
            sliding_window=rng.choice([128, 512, 4096]),
            layer_types=[pattern[i % 2] for i in range(layers)],
        )
    else:
        cfg.update(
            n_routed_experts=experts,
            n_shared_experts=rng.choice([0, 1, 2]),
            num_experts_per_tok=top,
            moe_intermediate_size=rng.choice([256, 2048]),
            first_k_dense_replace=rng.randint(0, min(3, layers - 1)),
            kv_lora_rank=rng.choice([256, 512]),
            q_lora_rank=rng.choice([0, 768, 1536]),
            qk_nope_head_dim=rng.choice([64, 128]),
            qk_rope_head_dim=rng.choice([32, 64]),
            v_head_dim=rng.choice([64, 128]),
        )
    return cfg


@hidden("13.param_counts")
def _(param_counts, rng, scenario):
    wrong = 0
    for _ in range(20):
        cfg = _config(rng)
        spec = ModelSpec.from_hf_config(cfg)
        total, active = (float(x) for x in param_counts(dict(cfg)))
        wrong += not (close(total, spec.total_params, 0.01) and close(active, spec.active_params, 0.01))
    assert not wrong, f"total or active wrong (beyond 1%) on {wrong} of 20 unseen configs"


@hidden("13.kv_per_token")
def _(kv_bytes_per_token, rng, scenario):
    wrong = 0
    for _ in range(20):
        cfg, nbytes, ctx = _config(rng), rng.choice([1, 2, 4]), rng.choice([64, 500, 4096, 131072])
        ref = kv_cache_bytes_per_token(ModelSpec.from_hf_config(cfg), _DTYPES[nbytes], context_len=ctx)
        wrong += abs(float(kv_bytes_per_token(dict(cfg), nbytes, ctx)) - ref) > max(1.0, 1e-3 * ref)
    assert not wrong, f"wrong on {wrong} of 20 unseen configs"


def _step_s(m, batch, experts, top):
    """One decode step: the longer of reading the weights it touches and computing the batch."""
    touched = experts * (1 - (1 - top / experts) ** batch)  # expected distinct experts, uniform routing
    read = m["shared_bytes"] + touched * m["expert_bytes"]
    flops = 2 * batch * (m["shared_bytes"] + top * m["expert_bytes"]) / m["bytes_per_param"]
    return max(read / m["bytes_per_s"], flops / m["flops_per_s"])


def _ref_ratio(m, batch):
    return _step_s(m, batch, 1, 1) / _step_s(m, batch, m["num_experts"], m["top_k"])


@hidden("13.predict_speed")
def _(predict_speed_ratio, rng, scenario):
    wrong = 0
    for _ in range(24):
        e = rng.choice([4, 8, 16, 64, 128])
        m = {
            "shared_bytes": rng.uniform(1e8, 5e9),
            "expert_bytes": rng.uniform(1e7, 2e9),
            "num_experts": e,
            "top_k": rng.choice([k for k in (1, 2, 4, 8) if k <= e]),
            "bytes_per_param": rng.choice([1, 2]),
            "bytes_per_s": rng.choice([1e10, 5e10, 3e12]),
            "flops_per_s": rng.choice([1e11, 1e12, 9e14]),
        }
        batch = rng.choice([1, 2, 8, 32, 256])
        wrong += not close(float(predict_speed_ratio(dict(m), batch)), _ref_ratio(m, batch), 0.02)
    assert not wrong, f"off by more than 2% on {wrong} of 24 unseen models and batches"


def _ref_load(logits, k):
    counts = [0] * len(logits[0])
    for row in logits:
        for e in sorted(range(len(row)), key=lambda i: -row[i])[:k]:
            counts[e] += 1
    mean = sum(counts) / len(counts)
    return counts, (max(counts) / mean if mean else 0.0)


@hidden("13.expert_load")
def _(expert_load, rng, scenario):
    wrong = 0
    for _ in range(20):
        e, k, n = rng.choice([4, 8, 16]), rng.choice([1, 2, 4]), rng.randint(5, 300)
        skew = [rng.gauss(0, 1) for _ in range(e)]
        logits = [[skew[j] + rng.gauss(0, 1) for j in range(e)] for _ in range(n)]
        counts, imbalance = _ref_load(logits, k)
        got = expert_load([list(r) for r in logits], k)
        wrong += [int(c) for c in got["counts"]] != counts or not close(
            float(got["imbalance"]), imbalance, 1e-6
        )
    assert not wrong, f"wrong on {wrong} of 20 unseen router outputs"


def _gpu_loads(loads, gpus):
    copies = [0] * len(loads)
    for g in gpus:
        for e in g:
            copies[e] += 1
    if min(copies) == 0:
        return None
    return [sum(loads[e] / copies[e] for e in g) for g in gpus]


def _ref_place(loads, num_gpus, slots):
    copies = [1] * len(loads)
    for _ in range(num_gpus * slots - len(loads)):
        busiest = max(range(len(loads)), key=lambda e: loads[e] / copies[e])
        copies[busiest] += 1
    replicas = sorted(
        ((loads[e] / copies[e], e) for e in range(len(loads)) for _ in range(copies[e])), reverse=True
    )
    gpus, load = [[] for _ in range(num_gpus)], [0.0] * num_gpus
    for share, e in replicas:
        g = min((i for i in range(num_gpus) if len(gpus[i]) < slots), key=lambda i: load[i])
        gpus[g].append(e)
        load[g] += share
    return gpus


def _imbalance(per_gpu):
    return max(per_gpu) / (sum(per_gpu) / len(per_gpu))


@hidden("13.placement")
def _(place_experts, rng, scenario):
    worse = 0
    for _ in range(20):
        e, g = rng.choice([8, 16, 32, 64]), rng.choice([2, 4, 8])
        slots = math.ceil(e / g) + rng.choice([0, 1, 2])
        loads = [rng.paretovariate(1.5) for _ in range(e)]
        got = [[int(x) for x in gpu] for gpu in place_experts(list(loads), g, slots)]
        valid = len(got) == g and all(len(x) == slots and all(0 <= i < e for i in x) for x in got)
        per_gpu = _gpu_loads(loads, got) if valid else None
        ref = _imbalance(_gpu_loads(loads, _ref_place(loads, g, slots)))
        worse += per_gpu is None or _imbalance(per_gpu) > ref * 1.02
    assert not worse, f"invalid, or more than 2% less balanced than greedy replication, on {worse} of 20"


def _ref_a2a(cfg, ep, dispatch, combine):
    top = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token")
    remote = top * (ep - 1) / ep
    return remote * cfg["hidden_size"] * dispatch, remote * cfg["hidden_size"] * combine


@hidden("13.a2a_bytes")
def _(a2a_bytes, rng, scenario):
    wrong = 0
    for _ in range(20):
        cfg = _config(rng, rng.choice(["mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss"]))
        ep, d, c = rng.choice([1, 2, 8, 16, 64]), rng.choice([1, 2]), rng.choice([2, 4])
        ref = _ref_a2a(cfg, ep, d, c)
        got = [float(x) for x in a2a_bytes(dict(cfg), ep, d, c)]
        wrong += not all(abs(a - b) <= 1e-6 * max(1.0, b) for a, b in zip(got, ref))
    assert not wrong, f"wrong on {wrong} of 20 unseen layouts"


def _ref_capacity(counts, k, factor):
    cap = math.ceil(factor * (sum(counts) / k) * k / len(counts))
    return sum(max(0, c - cap) for c in counts), sum(max(0, cap - c) for c in counts)


@hidden("13.capacity")
def _(capacity_drops, rng, scenario):
    wrong = 0
    for _ in range(20):
        e, k, factor = rng.choice([4, 8, 64]), rng.choice([1, 2, 8]), rng.choice([1.0, 1.1, 1.25, 2.0])
        k = min(k, e)
        tokens = rng.randint(1, 400)
        while factor == 1.1 and tokens * k * 11 % (10 * e) == 0:
            tokens = rng.randint(1, 400)  # a whole capacity at 1.1: float and exact arithmetic round apart
        counts = [0] * e
        weights = [rng.paretovariate(1.2) for _ in range(e)]
        for _ in range(tokens * k):
            counts[rng.choices(range(e), weights)[0]] += 1
        got = tuple(int(x) for x in capacity_drops(list(counts), k, factor))
        wrong += got != _ref_capacity(counts, k, factor)
    assert not wrong, f"wrong on {wrong} of 20 unseen routing histograms"
