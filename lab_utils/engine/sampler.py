"""Turn logits into next tokens: greedy rows in one argmax, sampled rows with their own generator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the top-k tokens and outside the top-p nucleus (1-D logits)."""
    import torch

    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens before it already reach top_p (the first is always kept).
        drop = (probs.cumsum(-1) - probs) >= top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


class Sampler:
    """Samples one token per row of logits.

    A request with `seed` gets its own torch.Generator, created on first use and kept for its
    life, so its tokens do not depend on which other requests share the batch.
    """

    def __init__(self, device: str = "cpu", seed: int = 0) -> None:
        import torch

        self.device = device
        self.default_generator = torch.Generator(device=device).manual_seed(seed)
        self.generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        """Drop a finished request's generator."""
        self.generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams):
        import torch

        if params.seed is None:
            return self.default_generator
        gen = self.generators.get(request_id)
        if gen is None:
            gen = self.generators[request_id] = torch.Generator(device=self.device).manual_seed(params.seed)
        return gen

    def sample(
        self,
        logits: torch.Tensor,
        request_ids: list[str],
        params: list[SamplingParams],
        output_token_ids: list[list[int]] | None = None,
    ) -> list[int]:
        """One token id per row of `logits` (S, vocab); rows with logits_processors go through them first."""
        import torch

        processed = [i for i, p in enumerate(params) if p.logits_processors]
        if processed:
            logits = logits.clone()
            for i in processed:
                done = output_token_ids[i] if output_token_ids is not None else []
                for fn in params[i].logits_processors:
                    logits[i] = fn(done, logits[i])
        tokens = logits.argmax(dim=-1)  # greedy for every row; sampled rows overwrite theirs
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        if sampled_rows:
            tokens = tokens.clone()
            for i in sampled_rows:
                p = params[i]
                row = apply_top_k_top_p(logits[i] / p.temperature, p.top_k, p.top_p)
                probs = row.softmax(-1)
                if not _usable(probs):
                    # A temperature so small that logits / T overflow (inf - inf = NaN), or a row
                    # of NaN logits: sampling is undefined, so take the most likely token instead
                    # of letting multinomial raise and fail every request in the batch.
                    tokens[i] = int(torch.nan_to_num(logits[i], nan=float("-inf")).argmax())
                    continue
                tokens[i] = torch.multinomial(probs, 1, generator=self._generator(request_ids[i], p))[0]
        return tokens.tolist()


def _usable(probs: torch.Tensor) -> bool:
    """True when `probs` is a distribution multinomial accepts: finite, non-negative, some mass."""
    import torch

    return bool(torch.isfinite(probs).all()) and bool((probs >= 0).all()) and float(probs.sum()) > 0
