"""TensorRT-LLM as it is today (PyTorch backend, LLM API, `trtllm-serve`), and what CPU mode can do
without it: validate option files, plan GPU memory, and measure weight quantization for real.

One idea per module:

- `options`  the LLM API option keys the course keeps from TensorRT-LLM's docs, and a validator
             for the YAML a learner hands to `trtllm-serve --config`;
- `plan`     memory planning per weight format (FP16, FP8, NVFP4, INT4-AWQ) and KV dtype;
- `quant`    per-tensor, per-channel and group-wise INT8/INT4 weight quantization with torch,
             an AWQ-style scale search, and the measurements (bytes, agreement, perplexity).

The legacy-flag mapping (lab 08's graded translation) is the grader's reference
(`grader/trtllm_legacy.py`), not part of the learner's library.
The `trtllm-serve` launcher is `lab_utils.servers.trtllm.TRTLLMServer`.
"""

from .options import OptionsError, known_options, validate_options
from .plan import WEIGHT_FORMATS, MemoryPlan, concurrent_sequences, plan_memory, weight_bytes_in

__all__ = [
    "MemoryPlan",
    "OptionsError",
    "WEIGHT_FORMATS",
    "concurrent_sequences",
    "known_options",
    "plan_memory",
    "validate_options",
    "weight_bytes_in",
]
