"""Turn the scheduler's plan into tensors, run the model on them, and sample.

The runner owns the device side: the weights, the paged KV tensors and the sampler. It reads the
plan (`SchedulerOutput`) and the requests' token ids; it never decides who runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .llama import AttentionMetadata, LlamaModel
from .request import Request
from .sampler import Sampler
from .scheduler import SchedulerOutput


@dataclass
class ModelRunnerOutput:
    """The result of one forward pass."""

    # request_id -> the tokens sampled for it; only requests whose new tokens reach their end
    # (a partial prefill chunk samples nothing). One token, or with speculative decoding the
    # drafts the model agreed with followed by its own next token.
    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0


def accept_greedy(drafts: list[int], predicted: list[int]) -> list[int]:
    """The tokens a speculative step produces for one greedy request (vLLM's rejection sampler).

    `predicted[j]` is the model's greedy token after the real tokens and the first j drafts. Drafts
    are kept while each equals the token the model predicts in its place; the model's prediction
    at the first mismatch (or after the last draft) follows. The result is exactly what decoding
    one token per step would have produced, in fewer steps.
    """
    if len(predicted) != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} predictions, got {len(predicted)}")
    n = 0
    while n < len(drafts) and drafts[n] == predicted[n]:
        n += 1
    return list(predicted[: n + 1])


class ModelRunner:
    """Loads a Llama checkpoint onto a device and executes scheduled batches against a paged cache.

    `fast=True` loads `fast.FastLlamaModel` (the same model with CPU kernels swapped in), False the
    readable `llama.LlamaModel`; None reads the `LAB_ENGINE_FAST` environment variable (on unless
    it is 0). Both take the same inputs, built here.
    """

    def __init__(
        self,
        model: str | Path,
        device: str = "cpu",
        dtype=None,
        seed: int = 0,
        num_threads: int | None = None,
        fast: bool | None = None,
        kv_cache_dtype: str = "auto",
    ) -> None:
        import torch

        from .fast import FastLlamaModel, fast_enabled

        if num_threads is not None and device == "cpu":
            torch.set_num_threads(num_threads)
        self.device = device
        self.fast = fast_enabled(fast)
        with torch.inference_mode():
            self.model = (FastLlamaModel if self.fast else LlamaModel)(
                model, device=device, dtype=dtype, kv_cache_dtype=kv_cache_dtype
            )
        self.config = self.model.config
        self.sampler = Sampler(device=device, seed=seed)
        self.block_size = 0
        # Lab 04: a learner's greedy verifier `fn(draft_tokens, target_logits) -> tokens` (rows of
        # logits as lists) in place of `accept_greedy`; None uses the engine's own.
        self.verify_greedy = None

    def _verify_with(self, drafts: list[int], rows) -> list[int]:
        """Run `verify_greedy` on one request's rows and refuse an answer no step could emit."""
        got = [int(t) for t in self.verify_greedy(list(drafts), rows.tolist())]
        if not 1 <= len(got) <= len(drafts) + 1 or got[:-1] != list(drafts[: len(got) - 1]):
            raise ValueError(
                f"verify_greedy returned {len(got)} tokens for {len(drafts)} drafts: a step emits the "
                "drafts it keeps (a prefix of them), then one token of the target's"
            )
        return got

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes one KV block takes across every layer, in the cache's dtype with its scales."""
        from .kv_quant import engine_kv_bytes_per_token

        return engine_kv_bytes_per_token(self.config, self.model.kv_dtype) * block_size

    def initialize_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """Allocate the paged K/V tensors."""
        self.block_size = block_size
        self.model.allocate_kv_cache(num_blocks, block_size)

    def prepare_inputs(self, scheduler_output: SchedulerOutput, requests: Mapping[str, Request]):
        """Flatten the plan: token ids, positions, cache slots, attention layout, rows to sample."""
        import torch

        so = scheduler_output
        dev = self.device
        bs = self.block_size

        def computed(rid: str) -> int:
            return so.num_computed_tokens.get(rid, requests[rid].num_computed_tokens)

        # Single-token requests first (shortest context first, so neighbours pad little when the
        # fast path groups them), then the prompt chunks: vLLM's CPU runner orders decodes first too.
        decodes = sorted((r for r in so.req_ids if so.num_scheduled_tokens[r] == 1), key=computed)
        order = decodes + [r for r in so.req_ids if so.num_scheduled_tokens[r] != 1]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        logits_rows: list[int] = []
        sample_ids: list[str] = []  # the request of each row in logits_rows
        for rid in order:
            req = requests[rid]
            start = computed(rid)
            end = start + so.num_scheduled_tokens[rid]
            blocks = so.block_tables[rid]
            drafts = so.scheduled_spec_tokens.get(rid, [])
            input_ids.extend(
                req.all_token_ids[start:end] if not drafts else (req.all_token_ids + drafts)[start:end]
            )
            positions.extend(range(start, end))
            slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, end))
            query_start_loc.append(len(input_ids))
            seq_lens.append(end)
            if end >= req.num_tokens:
                # The chunk reaches the end: its last real token predicts the next one, and each
                # draft after it predicts the token after that draft.
                first = len(input_ids) - (end - req.num_tokens) - 1
                logits_rows.extend(range(first, len(input_ids)))
                sample_ids.extend([rid] * (len(input_ids) - first))
        width = max(-(-n // bs) for n in seq_lens)
        table = [(so.block_tables[r] + [0] * width)[:width] for r in order]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_table=torch.tensor(table, dtype=torch.long, device=dev),  # (num_reqs, width)
            num_decodes=len(decodes),
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
                # The rows of each request with drafts; a sampled one's are decided together by
                # rejection sampling, so the sampler does not draw them one by one.
                spec_rows: dict[str, list[int]] = {}
                for i, rid in enumerate(sample_ids):
                    if rid in so.scheduled_spec_tokens:
                        spec_rows.setdefault(rid, []).append(i)
                skip = {i for rid, rows in spec_rows.items() if not params[rows[0]].greedy for i in rows}
                tokens = self.sampler.sample(logits, sample_ids, params, done, skip=skip)
                for rid, token in zip(sample_ids, tokens):
                    out.sampled_token_ids.setdefault(rid, []).append(token)
                for rid, drafts in so.scheduled_spec_tokens.items():
                    if rid not in spec_rows:
                        continue
                    p = requests[rid].sampling_params
                    if not p.greedy:
                        rows = logits[spec_rows[rid]]
                        out.sampled_token_ids[rid] = self.sampler.accept_sampled(rows, drafts, rid, p)
                    elif self.verify_greedy is not None:
                        out.sampled_token_ids[rid] = self._verify_with(drafts, logits[spec_rows[rid]])
                    else:
                        out.sampled_token_ids[rid] = accept_greedy(drafts, out.sampled_token_ids[rid])
            else:  # only partial prefill chunks: fill the cache, sample nothing
                self.model.forward(input_ids, positions, meta, logits_rows[:0])
        return out
