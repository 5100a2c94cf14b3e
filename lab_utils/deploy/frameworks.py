"""The framework choice, built from the learner's own results file plus cited facts about the
frameworks the course does not run (SGLang, NVIDIA Dynamo, llm-d, llama.cpp).

    rows, missing = decision_table()      # rows: one per framework; missing: figures not yet measured
    framework_rows()                      # what each framework is best at, version and date from lab_utils.facts
    choice_table()                        # each deployment question, your figure, what it points to

Nothing is invented: a figure the results file does not hold is reported as missing (run that
lab), never filled with a typical value.
"""

from __future__ import annotations

import re

# (framework, lab, what the lab measured there, regex on the results file's keys)
MEASURED = [
    ("vLLM", "05", "output tokens/s at concurrency 4", r"^output_tokens_s_at_concurrency_4$"),
    ("vLLM", "05", "TTFT p95 at concurrency 4 (s)", r"^ttft_p95_at_concurrency_4$"),
    ("vLLM", "03", "continuous batching output tokens/s", r"^vllm_continuous_output_tokens_s$"),
    ("TGI (protocol stand-in)", "06", "median TTFT of a router burst (s)", r"^router_burst_median_ttft$"),
    ("TGI (protocol stand-in)", "06", "median TPOT of a router burst (s)", r"^router_burst_median_tpot$"),
    ("Triton", "07", "p99 latency with dynamic batching (s)", r"^tritonserver_p99"),
    ("Triton", "03", "tritonserver p99 at your setting", r"^tritonserver_p99_your_setting$"),
    ("TensorRT-LLM", "08", "INT4 weight error, group 64 (RMS)", r"^int4_g64_rms_weight_error"),
]

# Facts about frameworks the course does not run, with where they were read and when.
ALTERNATIVES = [
    {
        "framework": "SGLang",
        "fact": "RadixAttention keeps computed prefixes in a radix tree and reuses them across "
        "requests (automatic prefix caching); OpenAI-compatible server; structured output through xGrammar",
        "source": "NVIDIA build page 'SGLang inference' (build.nvidia.com/station/sglang-inference), read 2026-12-01",
    },
    {
        "framework": "SGLang",
        "fact": "vLLM's router (`vllm-router`, used in this lab) was adapted from SGLang's router",
        "source": "vllm-router README, 'Built on SGLang Router Foundation' (github.com/Prowindy/vllm-router), read 2026-12-01",
    },
    {
        "framework": "llama.cpp",
        "fact": "`llama-server`: C/C++ server for GGUF models (F16 and quantized) on CPU and "
        "GPU, OpenAI-compatible chat, continuous batching with parallel decoding, schema-constrained JSON",
        "source": "llama.cpp tools/server/README.md (github.com/ggml-org/llama.cpp), read 2026-12-01",
    },
    {
        "framework": "TGI",
        "fact": "in maintenance mode since December 2025; Hugging Face points users to vLLM and SGLang",
        "source": "the course's DESIGN notes (lab 06), checked 2026-12-01",
    },
]


def decision_table(results: dict | None = None) -> tuple[list[dict], list[str]]:
    """(rows of measured figures by framework, the figures that are missing) from the results file."""
    if results is None:
        from ..results import load_results

        results = load_results()
    rows, missing = [], []
    for framework, lab, what, pattern in MEASURED:
        figures = results.get(lab, {})
        hits = [k for k in sorted(figures) if re.search(pattern, k)]
        if not hits:
            missing.append(f"{framework}: {what} (run lab {lab})")
            continue
        entry = figures[hits[0]]
        value = entry.get("value") if isinstance(entry, dict) else entry
        if value is None:
            missing.append(f"{framework}: {what} (recorded without a value: rerun lab {lab})")
            continue
        rows.append(
            {
                "framework": framework,
                "lab": lab,
                "figure": what,
                "value": value,
                "unit": entry.get("unit", "") if isinstance(entry, dict) else "",
                "mode": entry.get("mode", "") if isinstance(entry, dict) else "",
            }
        )
    return rows, missing


# ---- the frameworks of 2026 side by side: what each is best at, with its version from lab_utils.facts ----

# (framework, best at, the fact that dates it, where the "best at" was read). The version column is
# read from lab_utils.facts at call time, so a stale version fails tests/test_facts.py, not a reader.
FRAMEWORKS = [
    (
        "vLLM",
        "the default for open models: continuous batching, paged KV, automatic prefix caching, OpenAI "
        "API, and vllm-router for replicas (labs 03-05, 10); runs here on CPU",
        "vllm.version",
        "labs 03-05 and 10 of this course",
    ),
    (
        "SGLang",
        "prefix-heavy traffic (agents, many-turn chat, shared few-shot prompts): RadixAttention keeps every "
        "computed prefix in a radix tree shared across requests; its scheduler can order the queue by "
        "longest cached prefix (lpm) instead of arrival (fcfs); fast structured output (xgrammar, and "
        "jump-forward over spans the grammar forces); no CPU path here",
        "sglang.version",
        "SGLang paper (arXiv 2312.07104: RadixAttention, cache-aware scheduling, compressed FSM); SGLang "
        "scheduler policies fcfs/lpm/dfs-weight (sgl-project docs)",
    ),
    (
        "NVIDIA Dynamo",
        "a GPU fleet: prefill/decode disaggregation with NIXL KV transfer, a KV-aware router fed by workers' "
        "KV events, over vLLM, SGLang or TensorRT-LLM workers (lab 14)",
        "dynamo.version",
        "docs.nvidia.com/dynamo: disaggregated serving and architecture flow design docs",
    ),
    (
        "llm-d",
        "the same ideas on Kubernetes: vLLM (or SGLang) pods behind a Gateway API inference extension "
        "endpoint picker with KV-cache-, load- and P/D-aware scoring (lab 14)",
        "llm_d.docs_version",
        "llm-d.ai/docs architecture and getting-started pages",
    ),
    (
        "TGI",
        "existing deployments only: in maintenance mode, its README points to vLLM and SGLang (lab 06)",
        "tgi.maintenance_since",
        "huggingface/text-generation-inference README",
    ),
    (
        "Triton",
        "an LLM as one model among others: ensembles, pre/post-processing, several backends behind one "
        "KServe v2 protocol (lab 07)",
        "triton.ngc_current",
        "NVIDIA Triton release notes; lab 07",
    ),
    (
        "TensorRT-LLM",
        "the last factor on NVIDIA GPUs: FP8/NVFP4 kernels through the LLM API and trtllm-serve, when the "
        "team accepts its CUDA/PyTorch version coupling (lab 08)",
        "trtllm.engine_backend_removed",
        "TensorRT-LLM API reference (lab 08)",
    ),
]


def framework_rows() -> list[dict]:
    """One row per framework: what it is best at, its version or status from lab_utils.facts, sources."""
    from ..facts import FACTS

    rows = []
    for name, best_at, key, where in FRAMEWORKS:
        f = FACTS[key]
        rows.append(
            {
                "framework": name,
                "best_at": best_at,
                "version": f"{key} = {f.value!r}",
                "as_of": f.date or "installed package",
                "source": f"{where}; {f.evidence}",
            }
        )
    return rows


# ---- the decision table: each question a deployment answers, decided by the learner's own figures ----


def _figure(figures: dict, lab: str, pattern: str):
    """The first recorded value in `lab` whose key matches `pattern`, or None."""
    lab_figures = figures.get(lab, {})
    for key in lab_figures:  # in order: this run's live figures first, then the results file's
        if re.search(pattern, key):
            entry = lab_figures[key]
            value = entry.get("value") if isinstance(entry, dict) else entry
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
    return None


def _prefix_reuse(f):
    ca = _figure(f, "10", r"^cache_aware_prefix_cache_hit_rate_tokens$")
    rr = _figure(f, "10", r"^round_robin_prefix_cache_hit_rate_tokens$")
    if ca is None or rr is None:
        return None, "run lab 10 section 1 (RUN_VLLM = True)"
    shown = f"lab 10: prefix-cache hit rate cache_aware {ca:.2f} vs round_robin {rr:.2f}"
    if ca - rr > 0.05:
        return shown, (
            f"prefix-aware routing raised the hit rate by {ca - rr:.2f}: SGLang (RadixAttention), "
            "vLLM behind vllm-router cache_aware or kv_aware; on a fleet, llm-d or Dynamo"
        )
    return shown, "little prefix reuse across replicas: plain vLLM replicas, any policy"


def _disaggregation(f):
    colo = _figure(f, "10", r"^colocated_tpot_p95_simulated$")
    split = _figure(f, "10", r"^disaggregated_.*_tpot_p95_simulated$")
    if colo is None or split is None:
        return None, "run lab 10 section 3"
    shown = (
        f"lab 10 (simulated): TPOT p95 colocated {colo * 1e3:.1f} ms vs disaggregated {split * 1e3:.1f} ms"
    )
    if split < colo:
        return shown, (
            f"separate prefill and decode pools cut TPOT p95 {colo / split:.1f}x: NVIDIA Dynamo or llm-d "
            "(vllm-router's PD mode on a small scale; lab 14 moves real KV)"
        )
    return shown, "colocated serving is enough at this load: one vLLM pool"


def _one_model_among_many(f):
    ratio = _figure(f, "07", r"^median_request_overhead_three_calls_ensemble")
    if ratio is None:
        return None, "run lab 07 (RUN_REAL)"
    shown = f"lab 07: three separate calls cost {ratio:.2f}x the ensemble's overhead"
    if ratio > 1:
        return (
            shown,
            "the LLM is one step of a pipeline: Triton (an ensemble) in front, or beside, the LLM engine",
        )
    return shown, "no saving from an ensemble here: call the LLM server directly"


def _continuous_batching(f):
    gain = _figure(f, "03", r"^continuous_static_no_queue")
    if gain is None:
        return None, "run lab 03"
    shown = f"lab 03: continuous batching {gain:.2f}x static on your step cost"
    return shown, (
        "any engine with iteration-level batching (vLLM, SGLang, TensorRT-LLM); a request-level batcher "
        "(Triton's dynamic batcher on a plain model) leaves that on the table"
        if gain > 1
        else "batching barely matters at this load"
    )


def _quantization(f):
    err = _figure(f, "08", r"^int4_g64_rms_weight_error")
    if err is None:
        return None, "run lab 08"
    return f"lab 08: INT4 (group 64) RMS weight error {err:.3g}", (
        "if that error is acceptable and the GPUs are NVIDIA's, TensorRT-LLM's FP8/NVFP4/INT4 kernels buy "
        "the last factor; otherwise vLLM or SGLang with the same quantized checkpoint"
    )


DECISIONS = [
    ("Do requests share long prefixes (system prompts, agents, many-turn chat)?", _prefix_reuse),
    ("Does prefill interfere with decode (long prompts, strict TPOT)?", _disaggregation),
    ("Is the LLM one model in a pipeline?", _one_model_among_many),
    ("Does batching pay on this traffic?", _continuous_batching),
    ("Do you need the last factor on NVIDIA GPUs?", _quantization),
]


def choice_table(results: dict | None = None, live: dict | None = None) -> list[dict]:
    """The decision table: for each question, your figure and what it points to (or what to run).

    Args:
        results: the results file's labs ({lab: {key: entry}}); read from disk when None.
        live: figures measured in this run and not recorded yet, same shape; they win over `results`.
    """
    if results is None:
        from ..results import load_results

        results = load_results()
    live = live or {}
    figures = {}
    for lab in set(results) | set(live):
        mine = dict(live.get(lab, {}))
        recorded = results.get(lab, {})
        figures[lab] = {**mine, **{k: recorded[k] for k in sorted(recorded) if k not in mine}}
    rows = []
    for question, decide in DECISIONS:
        shown, verdict = decide(figures)
        rows.append({"question": question, "your figure": shown or "missing", "points to": verdict})
    return rows


def markdown(rows: list[dict]) -> str:
    """A list of dict rows as a Markdown table (columns in the first row's order)."""
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]).replace("|", "/") for c in cols) + " |" for r in rows]
    return "\n".join(lines)


__all__ = [
    "ALTERNATIVES",
    "DECISIONS",
    "FRAMEWORKS",
    "MEASURED",
    "choice_table",
    "decision_table",
    "framework_rows",
    "markdown",
]
