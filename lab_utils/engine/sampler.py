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
        skip: frozenset[int] | set[int] = frozenset(),
    ) -> list[int]:
        """One token id per row of `logits` (S, vocab); rows with logits_processors go through them first.

        Sampled rows listed in `skip` are not drawn (their argmax stands in): speculative rows of a
        sampled request, which `accept_sampled` decides together.
        """
        import torch

        processed = [i for i, p in enumerate(params) if p.logits_processors]
        if processed:
            logits = logits.clone()
            for i in processed:
                done = output_token_ids[i] if output_token_ids is not None else []
                for fn in params[i].logits_processors:
                    logits[i] = fn(done, logits[i])
        tokens = logits.argmax(dim=-1)  # greedy for every row; sampled rows overwrite theirs
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy and i not in skip]
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

    def accept_sampled(
        self, logits: torch.Tensor, drafts: list[int], request_id: str, params: SamplingParams
    ) -> list[int]:
        """The tokens a speculative step produces for one sampled request: rejection sampling.

        `logits` has len(drafts) + 1 rows: row j is the model's distribution p_j after the real
        tokens and the first j drafts. An n-gram draft is a guess with no probability of its own,
        so as in vLLM's rejection sampler its draft distribution is all on the drafted token:
        draft j is kept with probability p_j(draft); at the first rejection the token is drawn from
        p_j with the draft's share removed (the residual max(p - q, 0), renormalised); after the
        last kept draft one more token is drawn from p_k. Each token this returns is distributed
        exactly as one-token-per-step sampling would draw it, whatever the drafts were.
        """
        import torch

        if logits.shape[0] != len(drafts) + 1:
            raise ValueError(
                f"{len(drafts)} drafts need {len(drafts) + 1} rows of logits, got {logits.shape[0]}"
            )
        gen = self._generator(request_id, params)
        out: list[int] = []
        for j in range(len(drafts) + 1):
            probs = apply_top_k_top_p(logits[j] / params.temperature, params.top_k, params.top_p).softmax(-1)
            if not _usable(probs):  # as in `sample`: take the most likely token, then stop checking
                out.append(int(torch.nan_to_num(logits[j], nan=float("-inf")).argmax()))
                if j < len(drafts) and out[-1] == drafts[j]:
                    continue
                return out
            if j == len(drafts):  # every draft kept: the bonus token
                out.append(int(torch.multinomial(probs, 1, generator=gen)[0]))
                return out
            d = drafts[j]
            if float(torch.rand((), generator=gen)) < float(probs[d]):
                out.append(d)
                continue
            residual = probs.clone()
            residual[d] = 0.0  # p(d) < 1 here (a draw below 1 always keeps it), so mass is left
            out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=gen)[0]))
            return out
        return out


def _usable(probs: torch.Tensor) -> bool:
    """True when `probs` is a distribution multinomial accepts: finite, non-negative, some mass."""
    import torch

    return bool(torch.isfinite(probs).all()) and bool((probs >= 0).all()) and float(probs.sum()) > 0
