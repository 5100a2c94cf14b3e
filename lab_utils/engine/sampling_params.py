"""How to pick the next token and when to stop: vLLM's `SamplingParams`, the fields the course needs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """Sampling and stopping rules for one request (names and defaults follow vLLM).

    Args:
        temperature: 0 means greedy (argmax); higher flattens the distribution.
        top_p: keep the smallest set of tokens whose probabilities add up to at least top_p.
        top_k: keep the k most likely tokens; 0 (or -1) keeps all.
        seed: a per-request seed, so the same request samples the same tokens in any batch.
        max_tokens: most tokens to generate.
        stop: strings that end the output; the stop string is not included in the text.
        stop_token_ids: token ids that end the output (as well as the model's EOS).
        ignore_eos: keep going past EOS (benchmarks use this for fixed output lengths).
        logits_processors: callables `fn(output_token_ids, logits) -> logits` applied to this
            request's row of logits (1-D, vocab) before sampling, in order: how constrained
            decoding (a grammar's token mask) plugs in, as in vLLM's v0 API.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logits_processors: list | None = field(default=None, repr=False, compare=False)
    # Filled in by __post_init__: `stop` always as a list.
    stop_strings: list[str] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}; 1 keeps every token")
        if self.top_k == -1:
            self.top_k = 0
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"top_k must be a whole number >= 0 (0 or -1 keeps all), got {self.top_k}")
        if int(self.max_tokens) != self.max_tokens or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a whole number >= 1, got {self.max_tokens}")
        if self.seed is not None and int(self.seed) != self.seed:
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        self.stop_strings = stops
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
        self.top_k, self.max_tokens = int(self.top_k), int(self.max_tokens)

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax (temperature 0)."""
        return self.temperature == 0
