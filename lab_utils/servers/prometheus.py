"""Start and stop a real Prometheus (Debian's `prometheus` package, 2.42) that scrapes the lab's
servers, and ask it PromQL through its HTTP API.

    with PrometheusServer({"vllm": [vllm.url], "gateway": [gw.url]}, scrape_interval_s=1) as prom:
        prom.wait_for_targets()
        prom.query('sum(rate(vllm:generation_tokens_total[30s]))')

The course writes the configuration file (one job per name, scraping `/metrics`), keeps the
time-series database in a private temporary folder removed on stop, and binds the web and API
port to 127.0.0.1. `prometheus_binary()` is None where the package is not installed (`make setup`
installs it with apt as root); tests and labs skip then and say so.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from .base import HOST, ServerProcess


def prometheus_binary() -> str | None:
    """The path of the `prometheus` executable, or None when it is not installed."""
    return shutil.which("prometheus") or next(
        (p for p in ("/usr/bin/prometheus", "/usr/local/bin/prometheus") if Path(p).is_file()), None
    )


def scrape_config(jobs: dict[str, list[str]], scrape_interval_s: float = 1.0) -> str:
    """Prometheus' YAML configuration for `jobs` (name -> base URLs such as http://127.0.0.1:8000).

    JSON is valid YAML, so the file is written with json and needs no YAML library.
    """
    if not jobs:
        raise ValueError("give at least one job: {'vllm': ['http://127.0.0.1:8000']}")
    interval = f"{int(round(scrape_interval_s * 1000))}ms"
    configs = []
    for name, urls in jobs.items():
        targets = []
        for url in urls:
            parts = urllib.parse.urlsplit(url)
            if parts.hostname not in ("127.0.0.1", "localhost") or not parts.port:
                raise ValueError(f"scrape targets must be loopback URLs with a port, got {url!r}")
            targets.append(f"{parts.hostname}:{parts.port}")
        configs.append(
            {"job_name": name, "metrics_path": "/metrics", "static_configs": [{"targets": targets}]}
        )
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": configs,
    }
    return json.dumps(config, indent=1) + "\n"


class PrometheusServer(ServerProcess):
    """Prometheus scraping the given jobs every `scrape_interval_s`, its API on 127.0.0.1."""

    def __init__(
        self,
        jobs: dict[str, list[str]],
        *,
        scrape_interval_s: float = 1.0,
        port: int | None = None,
        startup_timeout: float = 60,
    ):
        binary = prometheus_binary()
        if binary is None:
            raise FileNotFoundError(
                "prometheus is not installed: `apt-get install prometheus` (as root; `make setup` does it)"
            )
        self.jobs = {k: list(v) for k, v in jobs.items()}
        self.workdir = Path(tempfile.mkdtemp(prefix="lab-prometheus-"))
        config = self.workdir / "prometheus.yml"
        config.write_text(scrape_config(self.jobs, scrape_interval_s))
        argv = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            "--web.listen-address={host}:{port}",
            "--storage.tsdb.retention.time=1d",
        ]
        super().__init__(
            "prometheus", argv, port=port, host=HOST, health_path="/-/ready", startup_timeout=startup_timeout
        )

    def stop(self, timeout: float = 15.0) -> int | None:
        code = super().stop(timeout)
        shutil.rmtree(self.workdir, ignore_errors=True)
        return code

    def _api(self, path: str, params: dict[str, str] | None = None) -> dict:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus answered {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """An instant query: a list of {"metric": {labels}, "value": [time, "number"]}."""
        params = {"query": promql}
        if at is not None:
            params["time"] = str(at)
        return self._api("query", params)["result"]

    def query_range(self, promql: str, start: float, end: float, step_s: float = 1.0) -> list[dict]:
        """A range query: a list of {"metric": {labels}, "values": [[time, "number"], ...]}."""
        return self._api(
            "query_range", {"query": promql, "start": str(start), "end": str(end), "step": f"{step_s}s"}
        )["result"]

    def scalar(self, promql: str, default: float = float("nan")) -> float:
        """The first value of an instant query as a float (`default` when it returns nothing)."""
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else default

    def targets(self) -> list[dict]:
        """The active scrape targets with their health ("up", "down", "unknown")."""
        return self._api("targets")["activeTargets"]

    def wait_for_targets(self, timeout: float = 30) -> None:
        """Wait until every target has been scraped successfully once; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.targets()
            if t and all(x.get("health") == "up" for x in t):
                return
            time.sleep(0.5)
        raise TimeoutError(f"Prometheus targets not all up after {timeout} s: {self.targets()}")


__all__ = ["PrometheusServer", "prometheus_binary", "scrape_config"]
