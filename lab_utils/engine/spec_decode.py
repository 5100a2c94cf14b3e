"""Speculative decoding: n-gram drafts ("prompt lookup", vLLM's `method="ngram"`) or a draft model.

A decode step reads every weight of the model to produce one token per request. If we can guess
the next few tokens cheaply, one step can compute the real token *and* check the guesses: the
model's prediction after each draft says whether the draft was right. Every draft up to the first
wrong one is kept, plus the model's own token at that point, so a greedy request produces exactly
the tokens it would have produced one step at a time, in fewer steps. On a CPU the step's cost
grows slowly with its rows (the weights are read once per step either way), so fewer, fuller steps
mean more tokens per second.

The guesses here cost nothing: look for the last `n` tokens of the request (n from
`prompt_lookup_max` down to `prompt_lookup_min`) earlier in its prompt or output, and propose
the `num_speculative_tokens` tokens that followed that earlier occurrence. Text that repeats
itself (code, quoted documents, a small model stuck in a loop) is guessed well; fresh text is not,
and then no drafts are proposed and the step is an ordinary decode.

    LLMEngine(num_speculative_tokens=4)              # prompt_lookup_min=2, prompt_lookup_max=4
    vLLM: LLM(..., speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                       "prompt_lookup_min": 2, "prompt_lookup_max": 4})

`DraftModelProposer` drafts with a smaller model of the same tokenizer instead (vLLM's
`speculative_config={"model": DIR, ...}`); both proposers feed the same verification below.

Requests without logits processors or stop strings get drafts (those others decode one token
per step). Greedy requests keep drafts while they equal the argmax (`accept_greedy`); sampled
requests keep them by rejection sampling (`Sampler.accept_sampled`, as vLLM's rejection sampler
treats n-gram drafts), so their tokens follow the same distribution as one-token steps. At
temperature 0.8 a draft is kept with the probability the model gives it, so fewer are kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class Proposer:
    """What the engine asks of a proposer (n-gram or draft model): drafts per request, within limits.

    Both kinds feed the same verification: greedy requests keep drafts while they equal the
    target's argmax (`accept_greedy`), sampled ones by rejection sampling (`Sampler.accept_sampled`).
    """

    def propose(self, request_id: str, token_ids: list[int], max_drafts: int | None = None) -> list[int]:
        raise NotImplementedError

    def forget(self, request_id: str) -> None:
        """Drop what is kept for a finished request (nothing by default)."""

    def propose_for(self, requests: Iterable[Any], max_model_len: int) -> None:
        """Set `spec_token_ids` on each request that may speculate, within its length limits.

        A request may speculate when it has no logits processors or stop strings (greedy or
        sampled). Drafts never take it past `max_tokens` or `max_model_len`: a step adds at most
        one token beyond its drafts.
        """
        for req in requests:
            params = req.sampling_params
            if req.is_finished or params.logits_processors or params.stop_strings:
                continue
            room = min(params.max_tokens - req.num_output_tokens, max_model_len - req.num_tokens) - 1
            req.spec_token_ids = self.propose(req.request_id, req.all_token_ids, room) if room > 0 else []


class NgramProposer(Proposer):
    """Drafts for each request from the most recent earlier occurrence of its last n tokens.

    Per request it keeps a map from every n-gram seen so far (for each n) to the position right
    after its latest occurrence, extended with the tokens added since the last call, so a
    proposal costs O(new tokens), not a scan of the whole history.
    """

    def __init__(
        self, num_speculative_tokens: int, prompt_lookup_min: int = 2, prompt_lookup_max: int = 4
    ) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{prompt_lookup_min} and {prompt_lookup_max}"
            )
        self.k = num_speculative_tokens
        self.n_min, self.n_max = prompt_lookup_min, prompt_lookup_max
        # request_id -> (n-gram -> index after its latest occurrence, tokens indexed so far)
        self._index: dict[str, tuple[dict[tuple, int], int]] = {}

    def propose(self, request_id: str, token_ids: list[int], max_drafts: int | None = None) -> list[int]:
        """Up to `num_speculative_tokens` (and `max_drafts`) draft tokens to follow `token_ids`."""
        k = self.k if max_drafts is None else min(self.k, max_drafts)
        if k < 1 or len(token_ids) <= self.n_min:
            return []
        seen, done = self._index.get(request_id, ({}, 0))
        if done > len(token_ids):  # the history was replaced (a reused id): start again
            seen, done = {}, 0
        # Index every n-gram that some token follows; the last n tokens themselves (the pattern
        # looked up) have no follower yet, so they never count as an earlier occurrence.
        length = len(token_ids)
        for end in range(max(done, self.n_min), length):
            for n in range(self.n_min, min(self.n_max, end) + 1):
                seen[tuple(token_ids[end - n : end])] = end
        self._index[request_id] = (seen, length)
        for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
            after = seen.get(tuple(token_ids[length - n :]))
            if after is None:
                continue
            # Token `length` lines up with token `after`, so each draft copies the token the same
            # distance after `after`; past the end of the history that is an earlier draft (a
            # short loop such as "a b a b" continues as "a b").
            drafts: list[int] = []
            for j in range(k):
                i = after + j
                drafts.append(token_ids[i] if i < length else drafts[i - length])
            return drafts
        return []

    def forget(self, request_id: str) -> None:
        """Drop a finished request's index."""
        self._index.pop(request_id, None)


class DraftModelProposer(Proposer):
    """Drafts from a smaller model with the target's tokenizer: its greedy tokens, k ahead.

        engine = LLMEngine()
        engine.proposer = DraftModelProposer(DRAFT_DIR, num_speculative_tokens=3)
    vLLM: LLM(..., speculative_config={"model": DRAFT_DIR, "num_speculative_tokens": 3})

    Written to be read, not to be fast: the draft keeps no cache between steps. Each proposal runs
    the draft over the request's whole history once (a prefill into its own scratch cache), then
    k - 1 one-token steps, so a draft of L layers costs about L/target-layers of a target step per
    draft token *plus* the re-read history. vLLM keeps the draft's KV cache across steps.

    The drafts are the draft's greedy tokens. A sampled request checks them as point masses, as it
    checks n-gram drafts (kept with the target's probability of the token): its tokens still follow
    the target's distribution exactly; vLLM samples drafts and hands the draft's probabilities q
    to its rejection sampler (keep with min(1, p/q)), which keeps more of them.
    """

    def __init__(
        self,
        model,
        num_speculative_tokens: int,
        device: str = "cpu",
        dtype=None,
        max_model_len: int = 2048,
        block_size: int = 16,
    ) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        import torch

        from .llama import LlamaModel

        self.k = num_speculative_tokens
        with torch.inference_mode():
            self.model = LlamaModel(model, device=device, dtype=dtype)
        self.max_len = min(max_model_len, self.model.config.max_position_embeddings)
        self.num_blocks = -(-self.max_len // block_size)
        self.model.allocate_kv_cache(self.num_blocks, block_size)
        self.block_size = block_size
        self.num_forward_tokens = 0  # tokens the draft has run, for its cost

    def propose(self, request_id: str, token_ids: list[int], max_drafts: int | None = None) -> list[int]:
        """Up to `num_speculative_tokens` (and `max_drafts`) greedy tokens of the draft after `token_ids`."""
        import torch

        from .llama import AttentionMetadata

        k = self.k if max_drafts is None else min(self.k, max_drafts)
        k = min(k, self.max_len - len(token_ids))
        if k < 1 or not token_ids:
            return []
        dev = self.model.device
        table = torch.arange(self.num_blocks, dtype=torch.long, device=dev).unsqueeze(0)  # (1, blocks)
        ids, start, drafts = list(token_ids), 0, []
        with torch.inference_mode():
            for _ in range(k):
                # Positions start..len(ids)-1 are new; the scratch cache's slot of position i is i.
                new = torch.arange(start, len(ids), dtype=torch.long, device=dev)
                meta = AttentionMetadata(
                    slot_mapping=new,
                    query_start_loc=[0, len(new)],
                    seq_lens=[len(ids)],
                    block_table=table,
                    num_decodes=1 if len(new) == 1 else 0,
                )
                inputs = torch.tensor(ids[start:], dtype=torch.long, device=dev)
                last = torch.tensor([len(new) - 1], dtype=torch.long, device=dev)
                logits = self.model.forward(inputs, new, meta, last)  # (1, vocab)
                self.num_forward_tokens += len(new)
                drafts.append(int(logits[0].argmax()))
                start = len(ids)
                ids.append(drafts[-1])
        return drafts
