"""Turn the scheduler's plan into tensors, run the model on them, and sample.

The runner owns the device side: the weights, the paged KV tensors and the sampler. It reads the
plan (`SchedulerOutput`) and the requests' token ids; it never decides who runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .llama import AttentionMetadata, DecodeGroup, LlamaModel, PrefillSpan
from .request import Request
from .sampler import Sampler
from .scheduler import SchedulerOutput


@dataclass
class ModelRunnerOutput:
    """The result of one forward pass."""

    # request_id -> the token sampled for it; only requests whose new tokens reach their end
    # (a partial prefill chunk samples nothing).
    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0


class ModelRunner:
    """Loads a Llama checkpoint onto a device and executes scheduled batches against a paged cache."""

    def __init__(
        self,
        model: str | Path,
        device: str = "cpu",
        dtype=None,
        seed: int = 0,
        num_threads: int | None = None,
    ) -> None:
        import torch

        if num_threads is not None and device == "cpu":
            torch.set_num_threads(num_threads)
        self.device = device
        with torch.inference_mode():
            self.model = LlamaModel(model, device=device, dtype=dtype)
        self.config = self.model.config
        self.sampler = Sampler(device=device, seed=seed)
        self.block_size = 0
        # Decodes per attention call. Smaller groups pad less but make more calls. On a 2-core
        # CPU, groups of 4 and 8 ran within noise of each other, and one padded call for all 32
        # decodes spent about twice as long in gather + attention.
        self.decode_group_size = 8

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes one KV block takes across every layer."""
        return self.config.kv_bytes_per_token(self.model.embed_tokens.element_size()) * block_size

    def initialize_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """Allocate the paged K/V tensors."""
        self.block_size = block_size
        self.model.allocate_kv_cache(num_blocks, block_size)

    def _slots(self, block_ids: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [block_ids[p // bs] * bs + p % bs for p in range(start, end)]

    def _decode_group(
        self, start: int, req_ids: list[str], ctx: list[int], block_tables: Mapping[str, list[int]]
    ) -> DecodeGroup:
        """Padded context slots and mask for decode rows start .. start + len(req_ids)."""
        import torch

        longest = max(ctx)
        bs = self.block_size
        nblk = -(-longest // bs)
        table = torch.tensor(
            [(block_tables[r] + [0] * nblk)[:nblk] for r in req_ids], dtype=torch.long
        )  # (n, nblk), padded with block 0
        pos = torch.arange(longest)
        slots = table[:, pos // bs] * bs + pos % bs  # (n, longest)
        real = pos.unsqueeze(0) < torch.tensor(ctx).unsqueeze(1)  # (n, longest)
        # Additive float mask, made once per step: a bool mask would be converted in every layer.
        mask = torch.zeros(real.shape, dtype=self.model.dtype).masked_fill_(~real, float("-inf"))
        return DecodeGroup(
            start,
            start + len(req_ids),
            slots.to(self.device),
            mask.view(len(req_ids), 1, 1, longest).to(self.device),
        )

    def prepare_inputs(self, scheduler_output: SchedulerOutput, requests: Mapping[str, Request]):
        """Flatten the plan: token ids, positions, cache slots, attention layout, rows to sample."""
        import torch

        so = scheduler_output
        dev = self.device

        def context_len(rid: str) -> int:
            return so.num_computed_tokens.get(rid, requests[rid].num_computed_tokens) + 1

        # Single-token requests first, shortest context first, so that neighbours in a decode
        # group need little padding; then the prefill spans.
        decodes = sorted((r for r in so.req_ids if so.num_scheduled_tokens[r] == 1), key=context_len)
        order = decodes + [r for r in so.req_ids if so.num_scheduled_tokens[r] != 1]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_rows: list[int] = []
        sample_ids: list[str] = []
        prefills: list[PrefillSpan] = []
        decode_ctx: list[int] = []
        for rid in order:
            req = requests[rid]
            n = so.num_scheduled_tokens[rid]
            start = so.num_computed_tokens.get(rid, req.num_computed_tokens)
            end = start + n
            blocks = so.block_tables[rid]
            row = len(input_ids)
            input_ids.extend(req.all_token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(self._slots(blocks, start, end))
            if n == 1:
                decode_ctx.append(end)
            else:
                ctx = None
                if start > 0:
                    ctx = torch.tensor(self._slots(blocks, 0, end), dtype=torch.long, device=dev)
                prefills.append(PrefillSpan(row, row + n, start, ctx))
            if end == req.num_tokens:  # the chunk reaches the end: its last row predicts a token
                logits_rows.append(row + n - 1)
                sample_ids.append(rid)
        groups = [
            self._decode_group(
                start,
                decodes[start : start + self.decode_group_size],
                decode_ctx[start : start + self.decode_group_size],
                so.block_tables,
            )
            for start in range(0, len(decodes), self.decode_group_size)
        ]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decodes=len(decodes),
            decode_groups=groups,
            prefills=prefills,
        )
        return (
            torch.tensor(input_ids, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            meta,
            torch.tensor(logits_rows, dtype=torch.long, device=dev),
            sample_ids,
        )

    def execute_model(
        self, scheduler_output: SchedulerOutput, requests: Mapping[str, Request]
    ) -> ModelRunnerOutput:
        """One forward pass over the scheduled tokens, then sampling."""
        import torch

        so = scheduler_output
        if so.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput()
        with torch.inference_mode():
            if so.blocks_to_copy:
                self.model.copy_blocks(so.blocks_to_copy)
            input_ids, positions, meta, logits_rows, sample_ids = self.prepare_inputs(so, requests)
            out = ModelRunnerOutput(
                num_decode_tokens=meta.num_decodes, num_prefill_tokens=len(input_ids) - meta.num_decodes
            )
            if sample_ids:
                logits = self.model.forward(input_ids, positions, meta, logits_rows)
                params = [requests[r].sampling_params for r in sample_ids]
                done = [requests[r].output_token_ids for r in sample_ids]
                tokens = self.sampler.sample(logits, sample_ids, params, done)
                out.sampled_token_ids = dict(zip(sample_ids, tokens))
            else:  # only partial prefill chunks: fill the cache, sample nothing
                self.model.forward(input_ids, positions, meta, logits_rows[:0])
        return out
