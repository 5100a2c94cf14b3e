"""The removed engine flow's build and runtime flags, mapped to today's LLM API options.

The reference of lab 08's graded question 08.legacy_to_llm_api: it lives in grader/ so that no
notebook or sandbox can import the mapping (a dict cannot be forbidden the way a function is).

Until 2025, serving a model with TensorRT-LLM meant `convert_checkpoint.py` (Hugging Face weights
to a TensorRT-LLM checkpoint, one per tensor-parallel rank), then `trtllm-build` (a TensorRT engine
compiled for one GPU model, one parallel layout and fixed maximum shapes), then a runtime that
loaded the engine. The PyTorch backend became the LLM API's default in June 2025 (PR #5312), the
engine entry points printed deprecation warnings from February 2026 (PR #11723), and the engine
examples, docs, Triton C++ backend and Python modules were removed from main in June-July 2026
(PRs #15763, #15767, #15907, #15918).

Today the same intent is an LLM API option (in `LLM(...)` or the YAML of `trtllm-serve --config`),
or nothing at all because the PyTorch backend picks its kernels at run time:

    legacy_to_llm_api({"max_batch_size": 64, "tp_size": 2, "use_gemm_plugin": "float16"})
    -> {"max_batch_size": 64, "tensor_parallel_size": 2}
"""

from __future__ import annotations

from typing import Any

# legacy flag -> dotted LLM API key (a dot means "inside that sub-config")
RENAMED: dict[str, str] = {
    "max_batch_size": "max_batch_size",
    "max_num_tokens": "max_num_tokens",
    "max_seq_len": "max_seq_len",
    "max_beam_width": "max_beam_width",
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "dtype": "dtype",
    "tokens_per_block": "kv_cache_config.tokens_per_block",
    "kv_cache_free_gpu_mem_fraction": "kv_cache_config.free_gpu_memory_fraction",
    "max_tokens_in_paged_kv_cache": "kv_cache_config.max_tokens",
    "enable_kv_cache_reuse": "kv_cache_config.enable_block_reuse",
    "kv_cache_dtype": "kv_cache_config.dtype",
    "enable_chunked_context": "enable_chunked_prefill",
}

# flags with no LLM API option, and why
LEGACY_DROPPED: dict[str, str] = {
    "use_gpt_attention_plugin": "no build step: the PyTorch backend chooses attention kernels at run time "
    "(attn_backend selects the implementation)",
    "use_gemm_plugin": "no build step: GEMM kernels are chosen at run time",
    "use_rmsnorm_plugin": "no build step: normalisation kernels are chosen at run time",
    "gpt_attention_plugin": "no build step (newer spelling of use_gpt_attention_plugin)",
    "gemm_plugin": "no build step (newer spelling of use_gemm_plugin)",
    "enable_context_fmha": "fused context attention is the default kernel, not a build switch",
    "use_paged_context_fmha": "prefill attention reads the paged KV cache without a build switch; "
    "chunking is enable_chunked_prefill",
    "remove_input_padding": "requests are packed without padding; nothing to choose",
    "paged_kv_cache": "the KV cache is always paged (kv_cache_config.tokens_per_block sets the block)",
    "multiple_profiles": "TensorRT optimisation profiles belonged to the engine",
    "strongly_typed": "a TensorRT network-building option",
    "max_input_len": "folded into max_seq_len (prompt + output)",
    "max_output_len": "folded into max_seq_len (prompt + output)",
    "quant_mode": "quantize offline with NVIDIA ModelOpt and serve the quantized checkpoint",
    "use_weight_only": "quantize offline with ModelOpt (INT4-AWQ / W8A16) and serve that checkpoint",
    "weight_only_precision": "quantize offline with ModelOpt and serve that checkpoint",
    "use_smooth_quant": "quantize offline with ModelOpt (INT8 SmoothQuant) and serve that checkpoint",
    "qformat": "ModelOpt's quantization format: used when quantizing, not when serving",
    "workers": "engine builds ran in parallel processes; there is no build",
    "output_dir": "there is no engine directory to write",
    "checkpoint_dir": "the model is the Hugging Face folder (or Hub id) itself",
}

_INT_KEYS = {
    "max_batch_size",
    "max_num_tokens",
    "max_seq_len",
    "max_beam_width",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "kv_cache_config.tokens_per_block",
    "kv_cache_config.max_tokens",
}
_BOOL_KEYS = {"kv_cache_config.enable_block_reuse", "enable_chunked_prefill"}


def _as_bool(flag: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "enable", "1", "yes"):
        return True
    if text in ("false", "disable", "0", "no"):
        return False
    raise ValueError(f"{flag}: expected true/false (or enable/disable), got {value!r}")


def _convert(flag: str, key: str, value: Any) -> Any:
    if key in _INT_KEYS:
        if isinstance(value, bool) or int(value) != float(value):
            raise ValueError(f"{flag}: expected a whole number, got {value!r}")
        return int(value)
    if key in _BOOL_KEYS:
        return _as_bool(flag, value)
    if key == "kv_cache_config.free_gpu_memory_fraction":
        return float(value)
    return value


def legacy_to_llm_api(flags: dict[str, Any]) -> dict[str, Any]:
    """Translate legacy `trtllm-build` / runtime flags into an LLM API option dict.

    Renamed flags move to their current key (nested under kv_cache_config where they belong);
    flags in LEGACY_DROPPED disappear; max_input_len + max_output_len become max_seq_len unless
    max_seq_len is given. An unknown flag raises ValueError naming it.
    """
    out: dict[str, Any] = {}
    for flag, value in flags.items():
        if flag in LEGACY_DROPPED:
            continue
        if flag not in RENAMED:
            raise ValueError(f"{flag}: not a legacy flag the course knows; see RENAMED and LEGACY_DROPPED")
        key = RENAMED[flag]
        value = _convert(flag, key, value)
        if "." in key:
            parent, child = key.split(".", 1)
            out.setdefault(parent, {})[child] = value
        else:
            out[key] = value
    if "max_seq_len" not in out and ("max_input_len" in flags or "max_output_len" in flags):
        if not ("max_input_len" in flags and "max_output_len" in flags):
            raise ValueError("max_input_len and max_output_len go together: max_seq_len is their sum")
        out["max_seq_len"] = int(flags["max_input_len"]) + int(flags["max_output_len"])
    return out
