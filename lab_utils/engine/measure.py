"""A measured engine run as one object of raw samples: `EngineRun` (from `LLMEngine.measure`).

`measure` runs prompts through the engine like `generate` and keeps, for every step, what the
scheduler planned (tokens per request, blocks each request held, preemptions) and how long the
step took, plus every request's output token ids. The lab's graded functions derive figures
(tokens/s, preemptions, blocks) from these samples; the grader tests them on step logs of its own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class EngineRun:
    """One run of `LLMEngine.measure`: settings, per-step records and outputs (all plain data)."""

    label: str
    # num_blocks, block_size, max_num_seqs, max_num_batched_tokens, max_model_len
    settings: dict
    # in prompt order
    request_ids: list[str]
    prompt_lens: list[int]
    output_token_ids: list[list[int]]
    wall_s: float  # generate() from first request added to last output
    # one dict per step: step, schedule_s, execute_s, update_s, scheduled {rid: tokens},
    # blocks {rid: blocks held after this step's allocation}, preempted [rid], num_free_blocks
    steps: list[dict] = field(default_factory=list)
    free_blocks_after: int = 0

    def raw_samples(self) -> dict:
        """Everything measured, as plain data."""
        return asdict(self)

    # -- figures derived from the raw samples -------------------------------------------------
    @property
    def num_preemptions(self) -> int:
        """Preemptions over the whole run."""
        return sum(len(s["preempted"]) for s in self.steps)

    @property
    def output_tokens(self) -> int:
        """Tokens generated, all requests."""
        return sum(len(t) for t in self.output_token_ids)

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of wall time."""
        return self.output_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    def peak_blocks(self) -> list[int]:
        """Most KV blocks each request held at once, in prompt order."""
        peak = {rid: 0 for rid in self.request_ids}
        for s in self.steps:
            for rid, n in s["blocks"].items():
                if rid in peak:
                    peak[rid] = max(peak[rid], int(n))
        return [peak[rid] for rid in self.request_ids]

    def time_split(self) -> dict[str, float]:
        """Seconds spent scheduling, executing and updating, summed over the steps."""
        return {k: sum(s[k] for s in self.steps) for k in ("schedule_s", "execute_s", "update_s")}

    def __repr__(self) -> str:
        return (
            f"EngineRun({self.label!r}: {len(self.request_ids)} requests, {len(self.steps)} steps, "
            f"{self.output_tokens} tokens in {self.wall_s:.2f} s, {self.num_preemptions} preemptions)"
        )
