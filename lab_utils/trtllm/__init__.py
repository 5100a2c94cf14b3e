"""TensorRT-LLM as it is today (PyTorch backend, LLM API, `trtllm-serve`), and what CPU mode can do
without it: validate option files, plan GPU memory, and measure weight quantization for real.

One idea per module:

- `options`  the LLM API option keys the course keeps from TensorRT-LLM's docs, and a validator
             for the YAML a learner hands to `trtllm-serve --config`;
- `legacy`   the removed engine flow (`trtllm-build` flags) mapped to today's LLM API options;
- `plan`     memory planning per weight format (FP16, FP8, NVFP4, INT4-AWQ) and KV dtype;
- `quant`    per-tensor, per-channel and group-wise INT8/INT4 weight quantization with torch,
             an AWQ-style scale search, and the measurements (bytes, agreement, perplexity).

The `trtllm-serve` launcher is `lab_utils.servers.trtllm.TRTLLMServer`.
"""

from .legacy import LEGACY_DROPPED, legacy_to_llm_api
from .options import OptionsError, known_options, validate_options
from .plan import WEIGHT_FORMATS, MemoryPlan, concurrent_sequences, plan_memory, weight_bytes_in

__all__ = [
    "LEGACY_DROPPED",
    "MemoryPlan",
    "OptionsError",
    "WEIGHT_FORMATS",
    "concurrent_sequences",
    "known_options",
    "legacy_to_llm_api",
    "plan_memory",
    "validate_options",
    "weight_bytes_in",
]
