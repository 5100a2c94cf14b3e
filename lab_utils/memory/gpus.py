"""A small catalog of data-centre GPUs: memory, bandwidth, dense bf16 compute, indicative price.

Memory is what `nvidia-smi` reports as total (MiB), slightly less than the marketing figure for
some parts. Bandwidth and TFLOP/s are NVIDIA's datasheet numbers for the SXM (or only) variant;
TFLOP/s are DENSE bf16 tensor-core figures (datasheets often print the 2x "with sparsity" one).
A10G is an AWS-only variant without a public datasheet; its numbers are the commonly quoted ones.

Prices are INDICATIVE on-demand US dollars per GPU-hour, as of PRICES_AS_OF, read across public
price lists of large and specialist clouds. They move every month and vary by region, commitment
and provider by 2x or more: pass your own with `GPU.with_price(...)` before deciding anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

PRICES_AS_OF = "2025-06"
PRICE_NOTE = (
    f"indicative on-demand USD per GPU-hour as of {PRICES_AS_OF}; "
    "check your provider, prices vary by 2x or more"
)
MiB = 1 << 20


@dataclass(frozen=True)
class GPU:
    """One GPU model and the numbers sizing needs."""

    name: str
    memory_bytes: int  # total device memory as nvidia-smi reports it
    bandwidth_gb_s: float  # HBM/GDDR bandwidth, GB/s (1e9 bytes/s)
    bf16_tflops: float  # dense bf16 tensor-core peak, TFLOP/s
    price_per_hour: float  # indicative, see PRICE_NOTE
    price_note: str = PRICE_NOTE

    def __post_init__(self) -> None:
        for field_name in ("memory_bytes", "bandwidth_gb_s", "bf16_tflops"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"GPU {self.name!r}: {field_name} must be positive, got {value!r}")
        if (
            isinstance(self.price_per_hour, bool)
            or not isinstance(self.price_per_hour, (int, float))
            or self.price_per_hour < 0
        ):
            raise ValueError(
                f"GPU {self.name!r}: price_per_hour must be >= 0 dollars, got {self.price_per_hour!r}"
            )

    @property
    def memory_gib(self) -> float:
        """Device memory in GiB."""
        return self.memory_bytes / (1 << 30)

    def with_price(self, price_per_hour: float, note: str = "your price") -> GPU:
        """A copy with your own hourly price."""
        return replace(self, price_per_hour=price_per_hour, price_note=note)


GPUS: dict[str, GPU] = {
    g.name: g
    for g in [
        GPU("A10G", 23_028 * MiB, 600, 70, 1.01),
        GPU("L4", 23_034 * MiB, 300, 121, 0.80),
        GPU("L40S", 46_068 * MiB, 864, 362, 1.40),
        GPU("A100-40GB", 40_960 * MiB, 1_555, 312, 1.30),
        GPU("A100-80GB", 81_920 * MiB, 2_039, 312, 1.80),
        GPU("H100-80GB", 81_559 * MiB, 3_350, 989, 2.50),
        GPU("H200", 143_771 * MiB, 4_800, 989, 3.50),
        GPU("B200", 183_359 * MiB, 8_000, 2_250, 5.50),
    ]
}


def get_gpu(gpu: str | GPU) -> GPU:
    """A catalog GPU by name (case and dashes ignored), or the GPU object itself."""
    if isinstance(gpu, GPU):
        return gpu
    key = str(gpu).replace("_", "-").replace(" ", "-").upper()
    for name, g in GPUS.items():
        if name.upper() == key or name.upper().replace("-", "") == key.replace("-", ""):
            return g
    raise ValueError(f"unknown GPU {gpu!r}; choose from {list(GPUS)} or build a GPU(...) yourself")
