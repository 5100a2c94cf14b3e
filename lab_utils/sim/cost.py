"""How long one engine step takes: the step cost model the simulator advances its clock with.

One step runs the model once over every token scheduled in it. Its time has three parts:

    fixed_s                      paid once per step whatever the batch: reading all the weights
                                 (decode is memory-bound), kernel launches, Python overhead
    per_token_s * num_tokens     matmul work for every scheduled token, prefill or decode
    per_context_token_s * ctx    attention reading the KV cache of every scheduled request

So prefill costs `per_token_s` per prompt token, and a decode step of batch b at mean context c
costs `fixed_s + b * (per_token_s + c * per_context_token_s)`. `combine="sum"` adds the parts (a
fit to measurements on this machine); `combine="max"` takes max(memory, compute) as a roofline does.
"""

from __future__ import annotations

from dataclasses import dataclass

COMBINE = ("sum", "max")


@dataclass(frozen=True)
class StepCostModel:
    """Seconds per engine step as a function of scheduled tokens and KV tokens read."""

    fixed_s: float = 0.025  # per step: weight reads + overheads
    per_token_s: float = 0.001  # per scheduled token (compute)
    per_context_token_s: float = 0.0  # per KV token read by attention
    combine: str = "sum"  # "sum" (fitted) or "max" (roofline: memory vs compute)

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_token_s", "per_context_token_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"StepCostModel.{name} must be >= 0 seconds, got {value}")
        if self.fixed_s + self.per_token_s <= 0:
            raise ValueError(
                "StepCostModel: fixed_s and per_token_s cannot both be 0 (steps would take no time)"
            )
        if self.combine not in COMBINE:
            raise ValueError(f"StepCostModel.combine must be one of {COMBINE}, got {self.combine!r}")

    def step_time(self, num_tokens: int, num_context_tokens: int = 0) -> float:
        """Seconds for one step that schedules `num_tokens` tokens over `num_context_tokens` KV tokens."""
        memory = self.fixed_s + self.per_context_token_s * num_context_tokens
        compute = self.per_token_s * num_tokens
        return memory + compute if self.combine == "sum" else max(memory, compute)

    def decode_step_time(self, batch_size: int, context_len: int = 0) -> float:
        """Seconds for a decode step of `batch_size` sequences of `context_len` tokens each."""
        return self.step_time(batch_size, batch_size * context_len)

    def prefill_time(self, num_prompt_tokens: int) -> float:
        """Seconds to prefill `num_prompt_tokens` in one step (attention cost included)."""
        return self.step_time(num_prompt_tokens, num_prompt_tokens)

    @classmethod
    def from_roofline(
        cls,
        num_params: float,
        bytes_per_param: float,
        mem_bandwidth_gb_s: float,
        peak_tflops: float,
        kv_bytes_per_token: float = 0.0,
        efficiency: float = 1.0,
    ) -> StepCostModel:
        """A roofline cost model for a GPU: weights read once per step, 2 FLOPs per parameter per token.

        Args:
            num_params: model parameters (135e6 for the course model).
            bytes_per_param: 2 for bf16, 4 for float32.
            mem_bandwidth_gb_s: memory bandwidth in GB/s (H100 SXM: about 3350).
            peak_tflops: dense matmul TFLOP/s at that precision (H100 SXM bf16: about 989).
            kv_bytes_per_token: KV cache bytes per token (K and V, every layer).
            efficiency: fraction of the peaks reached in practice (0.5 is a common rule of thumb).
        """
        if not (mem_bandwidth_gb_s > 0 and peak_tflops > 0 and num_params > 0 and bytes_per_param > 0):
            raise ValueError(
                "from_roofline needs positive num_params, bytes_per_param, bandwidth and TFLOP/s"
            )
        if not 0 < efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
        bw = mem_bandwidth_gb_s * 1e9 * efficiency
        flops = peak_tflops * 1e12 * efficiency
        return cls(
            fixed_s=num_params * bytes_per_param / bw,
            per_token_s=2.0 * num_params / flops,
            per_context_token_s=kv_bytes_per_token / bw,
            combine="max",
        )

    @classmethod
    def from_gpu(
        cls,
        gpu,
        num_params: float,
        bytes_per_param: float = 2.0,
        kv_bytes_per_token: float = 0.0,
        efficiency: float = 0.6,
    ) -> StepCostModel:
        """A roofline cost model for a GPU of lab 01's catalog (`lab_utils.memory.get_gpu`): name or GPU."""
        from lab_utils.memory import get_gpu  # lab 01's catalog, imported only when asked for

        spec = get_gpu(gpu)
        return cls.from_roofline(
            num_params, bytes_per_param, spec.bandwidth_gb_s, spec.bf16_tflops, kv_bytes_per_token, efficiency
        )
