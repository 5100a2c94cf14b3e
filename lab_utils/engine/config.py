"""The engine's knobs, validated where they are set (nano-vllm's config.py, vLLM's EngineArgs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class EngineConfig:
    """Everything `LLMEngine` needs besides the model folder.

    Args:
        max_num_seqs: most requests in one batch (vLLM `--max-num-seqs`).
        max_num_batched_tokens: the token budget of one step, prefill and decode together.
        block_size: tokens per KV block.
        kv_cache_gib: memory for the KV cache, used when `num_kv_blocks` is None.
        num_kv_blocks: the exact number of KV blocks (small values force preemption).
        max_model_len: longest prompt + output; None = the model's context, capped by the cache.
        enable_chunked_prefill: split long prompts across steps to fit the token budget.
        long_prefill_token_threshold: at most this many prompt tokens per request per step (0 = off).
        enable_prefix_caching: reuse full blocks of identical prefixes.
        dtype: "float32" (matches transformers token for token), "bfloat16", "float16" or "auto"
            (float32 on CPU, bfloat16 on CUDA).
        kv_cache_dtype: how K/V are stored (vLLM `--kv-cache-dtype`): "auto" (the model's dtype),
            "float32", "bfloat16", "float16", "fp8"/"fp8_e4m3", "fp8_e5m2", or "int8" with a scale
            per token and head (`engine/kv_quant.py`). At one `kv_cache_gib` fp8 holds twice the
            blocks of bf16.
        device: "cpu", "cuda" or "auto".
        num_threads: torch CPU threads; None leaves torch's choice.
        fast: True runs `engine/fast.py` (prepacked weights, vLLM's CPU kernels where installed),
            False the plain-torch model of `engine/llama.py` alone; None reads the LAB_ENGINE_FAST
            environment variable (fast unless it is 0). Both give the same greedy tokens.
        num_speculative_tokens: draft tokens proposed per request and step by n-gram
            lookup (`engine/spec_decode.py`, vLLM's speculative_config method "ngram"); 0 = off.
        prompt_lookup_min, prompt_lookup_max: the shortest and longest tail of the request
            (in tokens) looked up earlier in its prompt and output to find drafts.
        seed: seeds sampling for requests without their own seed.
        record_steps: keep a StepSnapshot per step in `engine.snapshots`.
        record_frames: also keep a lab 02 `Frame` (every block's state) per step; costs memory.
    """

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    block_size: int = 16
    kv_cache_gib: float = 1.0
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    device: str = "auto"
    num_threads: int | None = None
    fast: bool | None = None
    num_speculative_tokens: int = 0
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    seed: int = 0
    record_steps: bool = True
    record_frames: bool = False

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            value = getattr(self, name)
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.num_kv_blocks is not None and (
            int(self.num_kv_blocks) != self.num_kv_blocks or self.num_kv_blocks < 1
        ):
            raise ValueError(
                f"num_kv_blocks must be >= 1 (or None to size from kv_cache_gib), got {self.num_kv_blocks!r}"
            )
        if self.num_kv_blocks is None and not self.kv_cache_gib > 0:
            raise ValueError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(
                f"max_model_len must be >= 2 tokens (a prompt and one output), got {self.max_model_len!r}"
            )
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0 (0 turns it off)")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        from .kv_quant import KV_CACHE_DTYPES

        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if int(self.num_speculative_tokens) != self.num_speculative_tokens or self.num_speculative_tokens < 0:
            raise ValueError(
                f"num_speculative_tokens must be a whole number >= 0 (0 = no speculation), got "
                f"{self.num_speculative_tokens!r}"
            )
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min!r} and {self.prompt_lookup_max!r}"
            )
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {self.num_threads!r}")

    def resolved_device(self) -> str:
        """ "cpu" or "cuda" ("auto" picks CUDA when torch sees it)."""
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device; use device='cpu' or 'auto'")
        return self.device

    def resolved_dtype(self, device: str):
        """The torch dtype for weights and KV cache."""
        import torch

        name = self.dtype if self.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
        return getattr(torch, name)


def resolve_model(model: str | Path | None) -> Path:
    """The model folder: the course model when `model` is None."""
    if model is None:
        from lab_utils.models import course_model_path

        return Path(course_model_path())
    path = Path(model).expanduser()
    if not (path / "config.json").exists():
        raise ValueError(
            f"{path} is not a Hugging Face model folder (no config.json); pass the "
            "folder that holds config.json and *.safetensors, or None for the course model"
        )
    return path
