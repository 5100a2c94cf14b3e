"""Start and stop the course gateway (`python -m lab_utils.gateway`) in front of a vLLM server.

    with GatewayServer(vllm.url, {"noisy": TenantPolicy(1, 2), "steady": TenantPolicy(5, 5)}) as gw:
        openai.OpenAI(base_url=gw.base_url, api_key=gw.keys["noisy"])

Each tenant gets a fresh random key, passed to the gateway in its environment (never argv).
"""

from __future__ import annotations

import json
import secrets
import sys
import urllib.request
from dataclasses import asdict

from ..gateway import KEYS_ENV, UPSTREAM_KEY_ENV, TenantPolicy
from .base import HOST, ServerProcess


class GatewayServer(ServerProcess):
    """The per-tenant gateway as a subprocess on 127.0.0.1."""

    def __init__(
        self,
        upstream: str,
        tenants: dict[str, TenantPolicy],
        *,
        upstream_key: str | None = None,
        port: int | None = None,
        startup_timeout: float = 30,
    ):
        if not tenants:
            raise ValueError("give at least one tenant: {'a': TenantPolicy(rate_per_s=2, burst=4)}")
        self.tenants = dict(tenants)
        self.keys = {t: secrets.token_urlsafe(18) for t in self.tenants}
        argv = [
            sys.executable,
            "-m",
            "lab_utils.gateway",
            "--upstream",
            upstream,
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--tenants",
            json.dumps({t: asdict(p) for t, p in self.tenants.items()}),
        ]
        env = {KEYS_ENV: json.dumps(self.keys)}
        if upstream_key:
            env[UPSTREAM_KEY_ENV] = upstream_key
        super().__init__("gateway", argv, port=port, host=HOST, env=env, startup_timeout=startup_timeout)
        if not upstream_key:
            self.unset_env.add(UPSTREAM_KEY_ENV)

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's base_url through the gateway."""
        return self.url + "/v1"

    def metrics_text(self) -> str:
        """The gateway's /metrics page."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            return resp.read().decode()


__all__ = ["GatewayServer"]
