"""Lab 06's measuring code: TGI's admission on the simulator and on the stand-in router.

Each function returns its raw samples (per-step logs, per-request timings); the lab's graded
analysis functions read them, and the grader tests those functions on samples of its own.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

from .admission import TGIAdmission, TGIConfig


def tgi_sim(workload, config: TGIConfig, cost=None, max_new_tokens=None):
    """Run a workload through TGI's admission loop on lab 03's simulator: (SimResult, policy)."""
    from lab_utils.sim import ContinuousBatching, simulate

    policy = TGIAdmission(config, max_new_tokens=max_new_tokens)
    longest = max((w.prompt_len + w.output_len for w in workload), default=1)
    seqs = max(config.max_concurrent_requests, len(workload))
    sim_cfg = ContinuousBatching(
        max_num_seqs=seqs,
        max_num_batched_tokens=max(config.max_batch_prefill_tokens, seqs, longest),
        enable_chunked_prefill=False,
    )
    return simulate(workload, sim_cfg, cost, schedule_fn=policy), policy


def vllm_sim(workload, max_num_batched_tokens: int, max_num_seqs: int, cost=None):
    """The same workload under vLLM's token-budget scheduler (chunked prefill, decodes first)."""
    from lab_utils.sim import ContinuousBatching, simulate

    return simulate(
        workload,
        ContinuousBatching(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens),
        cost,
    )


def batch_sizes(result) -> list[int]:
    """Requests doing work in each step of a simulated run."""
    return [s.num_active for s in result.steps]


@dataclass
class LateArrival:
    """A lone request arriving just after a running batch was prefilled, on the simulator."""

    running: int
    waiting_served_ratio: float
    max_waiting_tokens: int
    kinds: list[str]  # per step: "prefill" or "decode"
    waiting: list[int]  # per step: queue length when the step was planned
    admitted: list[int] = field(default_factory=list)  # per step: requests it took from the queue

    @property
    def steps(self) -> list[dict]:
        """The trace as step records: kind, queue length when planned, requests admitted."""
        admitted = self.admitted or [0] * len(self.kinds)
        return [
            {"kind": k, "waiting": w, "admitted": a} for k, w, a in zip(self.kinds, self.waiting, admitted)
        ]

    def raw_samples(self) -> dict:
        return {
            "running": self.running,
            "ratio": self.waiting_served_ratio,
            "W": self.max_waiting_tokens,
            "kinds": self.kinds,
            "waiting": self.waiting,
        }

    @property
    def decodes_sat_out(self) -> int:
        """Decode steps planned while the late request waited in the queue."""
        return sum(1 for k, w in zip(self.kinds, self.waiting) if k == "decode" and w > 0)


def late_arrival(
    running: int,
    waiting_served_ratio: float,
    max_waiting_tokens: int,
    prompt_len: int = 32,
    output_len: int = 64,
) -> LateArrival:
    """Measure on the simulator how many decode steps a late request sits out under TGI's rules."""
    from lab_utils.sim import StepCostModel
    from lab_utils.sim.workload import WorkloadRequest

    cfg = TGIConfig(
        max_input_tokens=prompt_len * 2,
        max_total_tokens=prompt_len * 2 + output_len,
        max_batch_prefill_tokens=prompt_len * (running + 1),
        max_batch_total_tokens=(running + 1) * (prompt_len + output_len) * 2,
        waiting_served_ratio=waiting_served_ratio,
        max_waiting_tokens=max_waiting_tokens,
    )
    work = [WorkloadRequest(i, 0.0, prompt_len, output_len + max_waiting_tokens) for i in range(running)]
    work.append(WorkloadRequest(running, 1e-6, prompt_len, 8))  # arrives during the first prefill
    _, policy = tgi_sim(work, cfg, StepCostModel())
    recs = policy.records
    # keep the steps until the late request is admitted
    end = next((i for i, r in enumerate(recs) if i > 0 and r.kind == "prefill"), len(recs) - 1)
    obj = LateArrival(
        running,
        waiting_served_ratio,
        max_waiting_tokens,
        [r.kind for r in recs[: end + 1]],
        [r.waiting for r in recs[: end + 1]],
        admitted=[r.admitted for r in recs[: end + 1]],
    )
    return obj


@dataclass
class RouterRun:
    """A burst of streaming requests against the stand-in: per-request timings and the batch log."""

    ttft_s: list[float]
    tpot_s: list[float]
    e2e_s: list[float]
    tokens: list[int]
    steps: list[dict] = field(default_factory=list)  # the router's per-step log during the run

    def raw_samples(self) -> dict:
        return {
            "ttft": self.ttft_s,
            "tpot": self.tpot_s,
            "e2e": self.e2e_s,
            "tokens": self.tokens,
            "steps": self.steps,
        }

    @property
    def decode_batch_sizes(self) -> list[int]:
        """The batch size of every decode step."""
        return [s["batch_size"] for s in self.steps if s["kind"] == "decode"]


def run_burst(
    url: str, prompts: list[str], max_new_tokens: int, stagger_s: float = 0.0, timeout: float = 300.0
) -> RouterRun:
    """Stream `prompts` concurrently to `url`/generate_stream; TTFT, TPOT, end-to-end, the batch log."""
    import httpx

    # The stand-in logs every step; the real TGI does not, so there the batch size is sampled
    # from its `tgi_batch_current_size` gauge every 50 ms while the burst runs.
    stand_in = httpx.get(url + "/stand-in/batches", timeout=30).status_code == 200
    before = len(httpx.get(url + "/stand-in/batches", timeout=30).json()["steps"]) if stand_in else 0
    sampled: list[dict] = []
    done = threading.Event()

    def sample_gauge() -> None:
        while not done.is_set():
            for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
                if line.startswith("tgi_batch_current_size"):
                    size = int(float(line.split()[-1]))
                    if size:
                        sampled.append({"t": time.perf_counter(), "kind": "decode", "batch_size": size})
            done.wait(0.05)

    n = len(prompts)
    ttft, tpot, e2e, toks = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n
    errors: list[str] = []

    def one(i: int) -> None:
        time.sleep(i * stagger_s)
        body = {"inputs": prompts[i], "parameters": {"max_new_tokens": max_new_tokens}}
        t0 = time.perf_counter()
        times = []
        try:
            with httpx.stream("POST", url + "/generate_stream", json=body, timeout=timeout) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        ev = json.loads(line[5:])
                        if "error" in ev:
                            raise RuntimeError(ev["error"])
                        times.append(time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - reported after the burst
            errors.append(f"request {i}: {e}")
            return
        ttft[i], e2e[i], toks[i] = times[0], times[-1], len(times)
        tpot[i] = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    sampler = None if stand_in else threading.Thread(target=sample_gauge, daemon=True)
    for t in threads + ([sampler] if sampler else []):
        t.start()
    for t in threads:
        t.join()
    done.set()
    if sampler:
        sampler.join()
        for a, b in zip(sampled, sampled[1:]):  # a gauge reading holds until the next one
            a["end"] = b["t"]
        if sampled:
            sampled[-1]["end"] = sampled[-1]["t"] + 0.05
    if errors:
        raise RuntimeError("; ".join(errors))
    steps = httpx.get(url + "/stand-in/batches", timeout=30).json()["steps"][before:] if stand_in else sampled
    return RouterRun(ttft, tpot, e2e, toks, steps)


def ttft_by_prefill_budget(
    workload, budgets: list[int], config: TGIConfig, cost=None
) -> dict[int, list[float]]:
    """Sorted simulated TTFTs of `workload` under TGI's loop for each max_batch_prefill_tokens."""
    from dataclasses import replace

    out = {}
    for budget in budgets:
        res, _ = tgi_sim(workload, replace(config, max_batch_prefill_tokens=int(budget)), cost)
        out[int(budget)] = sorted(r.first_token_time - r.arrival_time for r in res.requests)
    return out


def compare_tgi_vllm(workload, config: TGIConfig, max_num_batched_tokens: int, max_num_seqs: int, cost=None):
    """The same workload under TGI's loop and under vLLM's scheduler: (tgi_result, tgi_policy, vllm_result)."""
    tgi_res, policy = tgi_sim(workload, config, cost)
    return tgi_res, policy, vllm_sim(workload, max_num_batched_tokens, max_num_seqs, cost)
