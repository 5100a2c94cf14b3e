"""Turn logits into next tokens: greedy rows in one argmax, sampled rows in one batched draw."""

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


_BLOCK = 256  # tokens per block of the two-level inverse-CDF draw (49,152 = 192 x 256)


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

        processed = [i for i, p in enumerate(params) if p.logits_processors]
        if processed:
            logits = logits.clone()
            for i in processed:
                done = output_token_ids[i] if output_token_ids is not None else []
                for fn in params[i].logits_processors:
                    logits[i] = fn(done, logits[i])
        tokens = logits.argmax(dim=-1)  # greedy for every row; sampled rows overwrite theirs
        rows = [i for i, p in enumerate(params) if not p.greedy and i not in skip]
        if rows:
            tokens = tokens.clone()
            tokens[rows] = self._draw(logits, rows, request_ids, params)
        return tokens.tolist()

    def _uniforms(self, rows: list[int], request_ids: list[str], params: list[SamplingParams]):
        """One uniform number in [0, 1) per sampled row: a seeded request's from its own generator
        (so its tokens do not depend on its neighbours), the others' from the shared one in one call."""
        import torch

        u = torch.empty(len(rows), dtype=torch.float64)
        shared = [j for j, i in enumerate(rows) if params[i].seed is None]
        if shared:
            u[shared] = torch.rand(len(shared), generator=self.default_generator, dtype=torch.float64)
        for j, i in enumerate(rows):
            if params[i].seed is not None:
                u[j] = float(torch.rand((), generator=self._generator(request_ids[i], params[i])))
        return u

    def _draw(
        self, logits: torch.Tensor, rows: list[int], request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        """Sample one token for each of `rows` in a few batched ops (vLLM samples a batch at once).

        Inverse-CDF sampling in two levels: the probabilities softmax(logits / T) of every row at
        once, their sums over blocks of 256 tokens, the block where the running sum of blocks
        passes u, then the token inside that block where the running sum passes what is left. Each
        row needs one random number u, not a Python pass over 49,152 logits, and a running sum over
        256 + 192 values, not 49,152. The token follows softmax(logits / T) as multinomial would
        draw it.
        """
        import torch

        sub = logits if len(rows) == logits.shape[0] else logits[rows]  # (R, vocab)
        temps = torch.tensor([params[i].temperature for i in rows], dtype=sub.dtype, device=sub.device)
        scaled = sub / temps.unsqueeze(1)  # (R, vocab), a new tensor: the logits stay as they were
        for j, i in enumerate(rows):  # top-k / top-p rows only (rare): mask outside the kept set
            p = params[i]
            if p.top_k or p.top_p < 1.0:
                scaled[j] = apply_top_k_top_p(scaled[j], p.top_k, p.top_p)
        probs = scaled.softmax(dim=-1)  # (R, vocab)
        num_rows, vocab = probs.shape
        width = _BLOCK
        if vocab % width:  # pad with zero-probability tokens to whole blocks
            probs = torch.nn.functional.pad(probs, (0, width - vocab % width))
        blocks = probs.view(num_rows, -1, width)  # (R, nb, width)
        block_cdf = blocks.sum(dim=-1).cumsum(dim=-1)  # (R, nb)
        total = block_cdf[:, -1]  # (R,), 1 up to rounding; NaN for a row with no distribution
        u = self._uniforms(rows, request_ids, params).to(sub.device, sub.dtype)
        target = (u * total).unsqueeze(1)  # (R, 1)
        b = torch.searchsorted(block_cdf, target, right=True).clamp_(max=blocks.shape[1] - 1)  # (R, 1)
        before = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp(min=0)), torch.zeros_like(target))
        inner_cdf = blocks[torch.arange(num_rows, device=sub.device), b.squeeze(1)].cumsum(
            dim=-1
        )  # (R, width)
        # Rounding may put what is left a hair past the block's own sum: keep it inside, so the
        # token found always has probability > 0.
        left = torch.minimum(target - before, inner_cdf[:, -1:] * (1 - 2**-20))
        t = torch.searchsorted(inner_cdf, left, right=True).clamp_(max=width - 1)  # (R, 1)
        drawn = (b * width + t).squeeze(1)  # (R,)
        # A row of NaN logits, or a temperature so small that logits / T overflow: sampling is
        # undefined, so take the most likely token instead of failing every request in the batch.
        bad = ~torch.isfinite(total) | (total <= 0) | (drawn >= vocab)
        if bool(bad.any()):
            fallback = torch.nan_to_num(sub, nan=float("-inf")).argmax(dim=-1)
            drawn = torch.where(bad, fallback, drawn.clamp(max=vocab - 1))
        return drawn

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
