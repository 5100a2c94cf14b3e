"""The framework decision table, built from the learner's own results file (labs 05-09) plus cited
facts about two alternatives the course does not run.

    rows, missing = decision_table()      # rows: one per framework; missing: figures not yet measured

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


__all__ = ["ALTERNATIVES", "MEASURED", "decision_table"]
