"""The `tgi_*` Prometheus series the stand-in exports (names as TGI v3.3.7's router), in text format."""

from __future__ import annotations

import threading
from collections import defaultdict

_BUCKETS = {
    "seconds": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    "tokens": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
}

HISTOGRAMS = {  # name -> bucket kind
    "tgi_request_duration": "seconds",
    "tgi_request_queue_duration": "seconds",
    "tgi_request_inference_duration": "seconds",
    "tgi_request_mean_time_per_token_duration": "seconds",
    "tgi_request_generated_tokens": "tokens",
    "tgi_request_input_length": "tokens",
    "tgi_request_max_new_tokens": "tokens",
    "tgi_batch_next_size": "tokens",
    "tgi_batch_forward_duration": "seconds",
}


class Metrics:
    """Counters, gauges and histograms, thread-safe, rendered in Prometheus' text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[tuple[str, tuple], float] = defaultdict(float)
        self.gauges: dict[str, float] = {
            "tgi_queue_size": 0.0,
            "tgi_batch_current_size": 0.0,
            "tgi_batch_current_max_tokens": 0.0,
        }
        self.hist: dict[tuple[str, tuple], list] = {}

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        with self._lock:
            self.counters[(name, tuple(sorted(labels.items())))] += value

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self.gauges[name] = float(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        buckets = _BUCKETS[HISTOGRAMS[name]]
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            h = self.hist.setdefault(key, [[0] * len(buckets), 0.0, 0])
            for i, b in enumerate(buckets):
                if value <= b:
                    h[0][i] += 1
            h[1] += value
            h[2] += 1

    def render(self) -> str:
        def lab(labels: tuple, extra: str = "") -> str:
            parts = [f'{k}="{v}"' for k, v in labels] + ([extra] if extra else [])
            return "{" + ",".join(parts) + "}" if parts else ""

        lines = []
        with self._lock:
            for name, v in sorted(self.gauges.items()):
                lines += [f"# TYPE {name} gauge", f"{name} {v}"]
            for name in sorted({n for n, _ in self.counters}):
                lines.append(f"# TYPE {name} counter")
                for (n, labels), v in sorted(self.counters.items()):
                    if n == name:
                        lines.append(f"{name}{lab(labels)} {v}")
            for name in sorted({n for n, _ in self.hist}):
                lines.append(f"# TYPE {name} histogram")
                buckets = _BUCKETS[HISTOGRAMS[name]]
                for (n, labels), (counts, total, count) in sorted(self.hist.items()):
                    if n != name:
                        continue
                    for b, c in zip(buckets, counts):
                        le = lab(labels, f'le="{b}"')
                        lines.append(f"{name}_bucket{le} {c}")
                    le = lab(labels, 'le="+Inf"')
                    lines.append(f"{name}_bucket{le} {count}")
                    lines.append(f"{name}_sum{lab(labels)} {total}")
                    lines.append(f"{name}_count{lab(labels)} {count}")
        return "\n".join(lines) + "\n"
