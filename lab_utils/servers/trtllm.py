"""Start and stop `trtllm-serve` (TensorRT-LLM's OpenAI-compatible server) on a GPU machine.

    with TRTLLMServer(options={"kv_cache_config": {"free_gpu_memory_fraction": 0.5}}) as srv:
        client = openai.OpenAI(**srv.client_kwargs())
        srv.prometheus_text()          # request latency histograms (Prometheus text)
        srv.iteration_stats()          # per-iteration JSON: KV blocks, in-flight batch

Facts this launcher relies on (TensorRT-LLM docs and pull requests, read 2026-12-01):

- `trtllm-serve MODEL --host H --port P` serves a Hugging Face folder or Hub id with the PyTorch
  backend (the default since mid-2025) at /v1/models, /v1/completions, /v1/chat/completions,
  plus /health, /metrics and /version.
- LLM API options that have no flag of their own go in a YAML file: `--config FILE` (an alias of
  `--extra_llm_api_options`, added in PR #9104, Nov 2025, and the spelling the docs now prefer;
  older releases know only `--extra_llm_api_options`: pass `config_flag=` for those).
- /metrics returns per-iteration statistics as JSON (with `enable_iter_perf_stats: true` on the
  PyTorch backend); Prometheus text is at /prometheus/metrics (PR #5785, Aug 2025).
- No API key: an `--api-key` flag was requested (issue #9950, Dec 2025) and not available as of
  Jan 2026; the course could not confirm a later release added it, so clients send a placeholder.

The process is validated before it starts: the option file goes through
`lab_utils.trtllm.options.validate_options`, so a typo fails here, not after the model loads.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.request
from pathlib import Path

from .base import HOST, ServerProcess, ServerStartError


def trtllm_serve_path() -> str | None:
    """The trtllm-serve executable: $TRTLLM_SERVE, then <repo>/.venv-trtllm/bin, then PATH.

    TensorRT-LLM pins its own torch and CUDA builds, which clash with vLLM's, so the course installs
    it in its own environment (.venv-trtllm, see README) and only runs its server from there.
    """
    import os

    from ..runtime import repo_root

    for candidate in (
        os.environ.get("TRTLLM_SERVE"),
        str(repo_root() / ".venv-trtllm" / "bin" / "trtllm-serve"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("trtllm-serve")


def trtllm_available() -> tuple[bool, str]:
    """(usable, reason): TensorRT-LLM needs an NVIDIA GPU and an installed `trtllm-serve`."""
    from ..runtime import cuda_available

    if not cuda_available():
        return False, "no CUDA device: TensorRT-LLM runs only on NVIDIA GPUs"
    if trtllm_serve_path() is None:
        return False, (
            "trtllm-serve is not installed: see README, 'TensorRT-LLM on a GPU machine' "
            "(.venv-trtllm, or set TRTLLM_SERVE)"
        )
    return True, "CUDA and trtllm-serve present"


class TRTLLMServer(ServerProcess):
    """`trtllm-serve` as a subprocess on 127.0.0.1 and a free port, with a validated option file."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        options: dict | None = None,
        config_flag: str = "--config",
        max_batch_size: int | None = None,
        max_num_tokens: int | None = None,
        max_seq_len: int | None = None,
        tensor_parallel_size: int | None = None,
        port: int | None = None,
        startup_timeout: float = 900,
        extra_args: list[str] | tuple[str, ...] = (),
    ):
        from ..trtllm.options import to_yaml

        if config_flag not in ("--config", "--extra_llm_api_options"):
            raise ValueError(
                "config_flag is '--config' (current) or '--extra_llm_api_options' (older releases)"
            )
        if model is None:
            from ..models import course_model_path

            model = course_model_path()
        self.model = str(model)
        self.options = dict(options or {})
        argv = [trtllm_serve_path() or "trtllm-serve"]  # the console script installed with tensorrt_llm
        argv += [self.model, "--host", "{host}", "--port", "{port}"]
        for flag, value in (
            ("--max_batch_size", max_batch_size),
            ("--max_num_tokens", max_num_tokens),
            ("--max_seq_len", max_seq_len),
            ("--tp_size", tensor_parallel_size),
        ):
            if value is not None:
                argv += [flag, str(int(value))]
        self.config_path: Path | None = None
        if self.options:
            text = to_yaml(self.options)  # raises OptionsError naming the key before anything starts
            fd, name = tempfile.mkstemp(prefix="trtllm-options-", suffix=".yaml")
            with open(fd, "w") as f:
                f.write(text)
            self.config_path = Path(name)
            argv += [config_flag, str(self.config_path)]
        argv += [str(a) for a in extra_args]
        super().__init__(
            "trtllm-serve", argv, port=port, host=HOST, health_path="/health", startup_timeout=startup_timeout
        )

    def start(self) -> TRTLLMServer:
        ok, why = trtllm_available()
        if not ok:
            raise ServerStartError(f"cannot start trtllm-serve here: {why}")
        super().start()
        return self

    def __enter__(self) -> TRTLLMServer:
        return self.start()

    # -- addresses and clients ----------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """The OpenAI SDK's base_url (server URL + /v1)."""
        return self.url + "/v1"

    @property
    def api_key(self) -> str:
        """trtllm-serve checks no key; the OpenAI SDK still wants a non-empty string."""
        return "tensorrt_llm"

    def client_kwargs(self) -> dict[str, str]:
        """Keyword arguments for `openai.OpenAI(**kwargs)` against this server."""
        return {"base_url": self.base_url, "api_key": self.api_key}

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=30) as resp:
            return resp.read()

    def models(self) -> list[str]:
        """Model ids at /v1/models (send one of these as `model`)."""
        return [m["id"] for m in json.loads(self._get("/v1/models"))["data"]]

    def iteration_stats(self) -> list[dict]:
        """/metrics: a JSON list of recent iteration statistics (empty until requests ran)."""
        data = json.loads(self._get("/metrics") or b"[]")
        return data if isinstance(data, list) else [data]

    def prometheus_text(self) -> str:
        """/prometheus/metrics: request counters and latency histograms in Prometheus text."""
        return self._get("/prometheus/metrics").decode("utf-8", "replace")

    def stop(self, timeout: float = 30.0) -> int | None:
        code = super().stop(timeout)
        if self.config_path is not None:
            self.config_path.unlink(missing_ok=True)
        return code


__all__ = ["TRTLLMServer", "trtllm_available", "trtllm_serve_path"]
