"""Start and stop TGI: the course's TGI-protocol stand-in in CPU mode, the real container on a GPU machine.

    with TGIServer(max_batch_total_tokens=4096) as srv:       # CPU: python -m lab_utils.tgi
        from text_generation import Client
        Client(srv.url).generate("Hello", max_new_tokens=8).generated_text

The real TGI (`ghcr.io/huggingface/text-generation-inference`, pinned below; the project is in
maintenance mode since 2025-12-11 and 3.3.7 of 2025-12-18 is its last release) needs Docker and
a GPU: `TGIContainer` builds and runs that `docker run` command with the same limits.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from dataclasses import asdict
from pathlib import Path

from ..tgi.admission import TGIConfig
from .base import HOST, ServerProcess

TGI_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.7"


def _limit_args(cfg: TGIConfig) -> list[str]:
    return cfg.launcher_args()


class TGIServer(ServerProcess):
    """The stand-in router (`python -m lab_utils.tgi`) as a subprocess on 127.0.0.1.

    Keyword arguments are TGIConfig's fields (the launcher's limits), e.g. max_batch_total_tokens.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        api_key: str | None = None,
        port: int | None = None,
        num_threads: int | None = None,
        startup_timeout: float = 180,
        payload_limit: int | None = None,
        request_timeout: float | None = None,
        **limits,
    ) -> None:
        self.config = TGIConfig(**limits)  # fails here, with the launcher's message, on bad limits
        argv = [
            sys.executable,
            "-m",
            "lab_utils.tgi",
            "--port",
            "{port}",
            *_limit_args(self.config),
            "--max-best-of",
            str(self.config.max_best_of),
            "--max-stop-sequences",
            str(self.config.max_stop_sequences),
            "--max-top-n-tokens",
            str(self.config.max_top_n_tokens),
        ]
        if model is not None:
            argv += ["--model-id", str(model)]
        if num_threads is not None:
            argv += ["--num-threads", str(num_threads)]
        if payload_limit is not None:
            argv += ["--payload-limit", str(int(payload_limit))]
        if request_timeout is not None:
            argv += ["--request-timeout", str(float(request_timeout))]
        self._api_key = api_key
        env = {"TGI_STAND_IN_API_KEY": api_key} if api_key else None  # not on the command line
        super().__init__(
            "tgi-stand-in",
            argv,
            port=port,
            host=HOST,
            health_path="/health",
            env=env,
            startup_timeout=startup_timeout,
        )
        if not api_key:  # an exported key would lock out the course's clients
            self.unset_env.add("TGI_STAND_IN_API_KEY")

    @property
    def api_key(self) -> str | None:
        """The key clients must send, or None."""
        return self._api_key

    @property
    def limits(self) -> dict:
        """The admission limits this server runs with."""
        return asdict(self.config)


class TGIContainer(ServerProcess):
    """The real TGI in Docker (GPU lab machines): `docker run --gpus all ... IMAGE --model-id ...`.

    The container gets a unique `--name` and `--rm`; stopping the server (or its reaper, when the
    kernel died) also runs `docker rm -f NAME`, because killing the `docker` client alone leaves
    the container running.

    Args:
        model_id: a Hub id or a folder under `volume` (mounted at /data).
        volume: host folder for downloaded weights (so restarts do not download again).
        image: the pinned image; never `:latest`.
        num_shard: GPUs to shard over (tensor parallelism); quantize: e.g. "awq", "fp8", "eetq".
        limits: TGIConfig fields (max_input_tokens, max_batch_total_tokens, ...).
    """

    def __init__(
        self,
        model_id: str,
        *,
        volume: str | Path = "~/.cache/llm-serving-lab/tgi-data",
        image: str = TGI_IMAGE,
        num_shard: int | None = None,
        quantize: str | None = None,
        shm_size: str = "1g",
        port: int | None = None,
        startup_timeout: float = 1200,
        **limits,
    ) -> None:
        if image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1]:
            raise ValueError(f"pin the TGI image to a version (e.g. {TGI_IMAGE}), got {image!r}")
        self.config = TGIConfig(**limits)
        self.container_name = f"llm-serving-lab-tgi-{uuid.uuid4().hex[:12]}"
        self.command = self.docker_command(
            model_id,
            volume=volume,
            image=image,
            num_shard=num_shard,
            quantize=quantize,
            shm_size=shm_size,
            config=self.config,
            name=self.container_name,
        )
        super().__init__(
            "tgi-container",
            self.command,
            port=port,
            host=HOST,
            health_path="/health",
            startup_timeout=startup_timeout,
            cleanup_command=["docker", "rm", "-f", self.container_name],
        )

    @staticmethod
    def docker_command(
        model_id: str,
        *,
        volume: str | Path,
        image: str,
        num_shard: int | None,
        quantize: str | None,
        shm_size: str,
        config: TGIConfig,
        name: str | None = None,
    ) -> list[str]:
        """The `docker run` argv ("{port}" is filled in by ServerProcess); HF_TOKEN passes through."""
        vol = Path(volume).expanduser()
        argv = [
            "docker",
            "run",
            "--rm",
            *(["--name", name] if name else []),
            "--gpus",
            "all",
            "--shm-size",
            shm_size,
            "-e",
            "HF_TOKEN",
            "-p",
            "{host}:{port}:80",
            "-v",
            f"{vol}:/data",
            image,
            "--model-id",
            model_id,
            *_limit_args(config),
        ]
        if num_shard:
            argv += ["--num-shard", str(num_shard)]
        if quantize:
            argv += ["--quantize", quantize]
        return argv

    @staticmethod
    def available() -> bool:
        """True when a docker CLI and an NVIDIA GPU are both present."""
        return shutil.which("docker") is not None and shutil.which("nvidia-smi") is not None


__all__ = ["TGIContainer", "TGIServer", "TGI_IMAGE"]
