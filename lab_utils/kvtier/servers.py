"""Start and stop the course's prefill/decode proxy (`python -m lab_utils.kvtier.proxy`).

with PDProxyServer(prefill.url, decode.url) as pd:
    openai.OpenAI(base_url=pd.base_url, api_key="unused")
"""

from __future__ import annotations

import sys

from ..servers.base import HOST, ServerProcess


class PDProxyServer(ServerProcess):
    """The prefill/decode proxy as a subprocess on 127.0.0.1 (stopped with the kernel, like every
    course server)."""

    def __init__(
        self, prefill_url: str, decode_url: str, *, port: int | None = None, startup_timeout: float = 30
    ):
        self.prefill_url, self.decode_url = prefill_url.rstrip("/"), decode_url.rstrip("/")
        argv = [
            sys.executable, "-m", "lab_utils.kvtier.proxy",
            "--prefill", self.prefill_url, "--decode", self.decode_url,
            "--host", "{host}", "--port", "{port}",
        ]  # fmt: skip
        super().__init__("pd-proxy", argv, port=port, host=HOST, startup_timeout=startup_timeout)

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's base_url through the proxy."""
        return self.url + "/v1"


__all__ = ["PDProxyServer"]
