"""Workloads for the batching simulator: who arrives when, with how long a prompt and an answer.

Everything is seeded: the same arguments give the same workload on every machine, so a check can
re-run a learner's experiment and get the learner's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

LENGTH_KINDS = ("fixed", "uniform", "lognormal", "choice")


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload: an arrival time and a token count in each direction."""

    request_id: int
    arrival_time: float  # seconds from the start of the run
    prompt_len: int  # tokens in the prompt (prefill work)
    output_len: int  # tokens to generate, the first one included (decode work)

    def __post_init__(self) -> None:
        if self.arrival_time < 0:
            raise ValueError(f"request {self.request_id}: arrival_time must be >= 0, got {self.arrival_time}")
        if self.prompt_len < 1:
            raise ValueError(f"request {self.request_id}: prompt_len must be at least 1 token")
        if self.output_len < 1:
            raise ValueError(
                f"request {self.request_id}: output_len must be at least 1 token "
                "(the first token is the one prefill produces)"
            )


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts.

    kind:
        "fixed": always `mean`;
        "uniform": integers from `low` to `high` inclusive;
        "lognormal": mean `mean`, shape `sigma` (long-tailed, like real chat answers), clipped to
            [low, high];
        "choice": one of `values`, with probabilities `weights` (equal when empty).
    """

    kind: str = "fixed"
    mean: float = 128.0
    low: int = 1
    high: int = 4096
    sigma: float = 0.8
    values: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"LengthDist kind must be one of {LENGTH_KINDS}, got {self.kind!r}")
        if self.low < 1 or self.high < self.low:
            raise ValueError(f"LengthDist needs 1 <= low <= high, got low={self.low}, high={self.high}")
        if self.kind in ("fixed", "lognormal") and self.mean < 1:
            raise ValueError(f"LengthDist mean must be at least 1 token, got {self.mean}")
        if self.kind == "choice":
            if not self.values or min(self.values) < 1:
                raise ValueError("LengthDist('choice') needs values=(...) of positive token counts")
            if self.weights and len(self.weights) != len(self.values):
                raise ValueError("LengthDist weights must have one entry per value")

    def sample(self, n: int, rng) -> list[int]:
        """Draw `n` lengths with numpy Generator `rng`."""
        import numpy as np

        if self.kind == "fixed":
            return [int(round(self.mean))] * n
        if self.kind == "uniform":
            return [int(x) for x in rng.integers(self.low, self.high + 1, size=n)]
        if self.kind == "choice":
            p = np.asarray(self.weights, float) if self.weights else None
            return [
                int(x)
                for x in rng.choice(np.asarray(self.values), size=n, p=None if p is None else p / p.sum())
            ]
        # lognormal with the requested mean: E[exp(N(mu, s^2))] = exp(mu + s^2/2)
        mu = np.log(self.mean) - self.sigma**2 / 2
        xs = np.clip(np.rint(rng.lognormal(mu, self.sigma, size=n)), self.low, self.high)
        return [int(x) for x in xs]


def fixed_workload(
    prompt_lens: list[int], output_lens: list[int], arrival_times: list[float] | None = None
) -> list[WorkloadRequest]:
    """A hand-written workload: request i has prompt_lens[i], output_lens[i], arrives at arrival_times[i] (0 by default)."""
    if len(prompt_lens) != len(output_lens):
        raise ValueError(
            f"prompt_lens ({len(prompt_lens)}) and output_lens ({len(output_lens)}) differ in length"
        )
    if arrival_times is None:
        arrival_times = [0.0] * len(prompt_lens)
    if len(arrival_times) != len(prompt_lens):
        raise ValueError("arrival_times needs one entry per request")
    return [
        WorkloadRequest(i, float(t), int(p), int(o))
        for i, (t, p, o) in enumerate(zip(arrival_times, prompt_lens, output_lens))
    ]


def poisson_workload(
    num_requests: int,
    rate: float,
    prompt_len: LengthDist | int = 128,
    output_len: LengthDist | int = 128,
    seed: int = 0,
) -> list[WorkloadRequest]:
    """`num_requests` requests arriving as a Poisson process of `rate` requests per second.

    `rate=float("inf")` makes every request arrive at time 0 (a closed batch, the offline case).
    An int length means every request has exactly that many tokens.
    """
    import numpy as np

    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if not rate > 0:
        raise ValueError(f"rate must be positive (requests per second), got {rate}")
    rng = np.random.default_rng(seed)
    pdist = prompt_len if isinstance(prompt_len, LengthDist) else LengthDist("fixed", mean=int(prompt_len))
    odist = output_len if isinstance(output_len, LengthDist) else LengthDist("fixed", mean=int(output_len))
    if rate == float("inf"):
        arrivals = [0.0] * num_requests
    else:
        # exponential gaps between arrivals make a Poisson process
        arrivals = [float(x) for x in np.cumsum(rng.exponential(1.0 / rate, size=num_requests))]
    prompts = pdist.sample(num_requests, rng)
    outputs = odist.sample(num_requests, rng)
    return [WorkloadRequest(i, arrivals[i], prompts[i], outputs[i]) for i in range(num_requests)]


def seed_scenario(
    num_short: int = 7, short_len: int = 50, long_len: int = 500, prompt_len: int = 32
) -> list[WorkloadRequest]:
    """The seed's example: a batch where `num_short` answers need `short_len` tokens and one needs `long_len`."""
    outs = [short_len] * num_short + [long_len]
    return fixed_workload([prompt_len] * len(outs), outs)
