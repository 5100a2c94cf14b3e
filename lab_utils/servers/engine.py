"""Start and stop the course engine's OpenAI-style server (`python -m lab_utils.engine.serve`).

    with EngineServer(max_num_seqs=8, enable_prefix_caching=False) as srv:
        client = openai.OpenAI(**srv.client_kwargs())
        client.completions.create(model=srv.model_name, prompt="Hello", max_tokens=8)

The same addresses and helpers as `VLLMServer` (base_url, model_name, api_key, client_kwargs), so a
benchmark can put the two side by side with the same client code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .base import HOST, OpenAIAddresses, ServerProcess

API_KEY_ENV = "ENGINE_API_KEY"  # what lab_utils/engine/serve.py reads (not imported: that loads the engine)


class EngineServer(OpenAIAddresses, ServerProcess):
    """The course engine behind /v1/completions, as a subprocess on 127.0.0.1.

    Args:
        model: the model folder; None = the course model.
        max_num_seqs, max_num_batched_tokens, max_model_len, kv_cache_gib, dtype, num_threads,
            num_speculative_tokens, enable_prefix_caching: the engine's knobs (EngineConfig).
        api_key: the key clients must send (passed in ENGINE_API_KEY, never on the command line).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        max_num_seqs: int = 32,
        max_num_batched_tokens: int = 512,
        max_model_len: int | None = None,
        kv_cache_gib: float = 1.0,
        dtype: str = "float32",
        num_threads: int | None = None,
        num_speculative_tokens: int = 0,
        enable_prefix_caching: bool = True,
        served_model_name: str | None = None,
        api_key: str | None = None,
        port: int | None = None,
        startup_timeout: float = 300,
    ) -> None:
        if model is None:
            from ..models import course_model_path

            model = course_model_path()
        self.model = str(model)
        self.served_model_name = served_model_name
        argv = [sys.executable, "-m", "lab_utils.engine.serve", "--port", "{port}", "--model", self.model]
        argv += ["--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens", str(max_num_batched_tokens)]
        argv += ["--kv-cache-gib", str(kv_cache_gib), "--dtype", dtype]
        argv += ["--num-speculative-tokens", str(num_speculative_tokens)]
        argv.append("--enable-prefix-caching" if enable_prefix_caching else "--no-enable-prefix-caching")
        if max_model_len is not None:
            argv += ["--max-model-len", str(max_model_len)]
        if num_threads is not None:
            argv += ["--num-threads", str(num_threads)]
        if served_model_name:
            argv += ["--served-model-name", served_model_name]
        self._api_key = api_key
        super().__init__(
            "engine",
            argv,
            port=port,
            host=HOST,
            health_path="/health",
            env={API_KEY_ENV: api_key} if api_key else None,
            startup_timeout=startup_timeout,
        )
        if not api_key:  # an exported key would lock out the course's clients
            self.unset_env.add(API_KEY_ENV)

    def client_kwargs(self) -> dict[str, str]:
        """Keyword arguments for `openai.OpenAI(**kwargs)` against this server."""
        return {"base_url": self.base_url, "api_key": self.api_key}


__all__ = ["EngineServer"]
