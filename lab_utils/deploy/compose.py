"""What a compose file for a GPU serving container must say, checked offline (lab 10).

`docker-compose -f FILE config` (Debian's 1.29 package) validates the syntax without an engine
when it is installed (tests/test_docker_compose.py runs it, or a JSON schema without it); these
checks are about behaviour, the points the seeds got wrong:

    pinned image      a version tag, never `latest` or none: the server must not change under you
    GPU reservation   deploy.resources.reservations.devices with capabilities [gpu] (Compose spec);
                      `runtime: nvidia` is still a Compose Specification key, but it only picks
                      the container runtime and reserves no GPU (and needs that runtime configured)
    token from env    HF_TOKEN: ${HF_TOKEN...} (the variable the Hub libraries read), never a literal
    health check      so `depends_on: condition: service_healthy` and restarts work
    model cache       a volume, so a restart does not download the weights again
"""

from __future__ import annotations

import re
from pathlib import Path

DOCKER_DIR = Path(__file__).resolve().parents[2] / "docker"
PINNED = re.compile(r":(v?\d+(\.\d+)+[\w.-]*|\$\{[A-Z_]+:-[\w.-]*\d[\w.-]*\})$")
CACHE_TARGETS = ("/root/.cache/huggingface", "/data")
# model servers, which need the GPU, the token and the cache (a router or a proxy does not)
SERVING_IMAGES = ("vllm-openai", "text-generation-inference", "tritonserver")


def service_problems(name: str, svc: dict) -> list[str]:
    """Behaviour problems of one compose service; [] when it has none."""
    out = []
    image = str(svc.get("image", ""))
    if not PINNED.search(image.rsplit("/", 1)[-1]):
        out.append(f"{name}: image {image!r} is not pinned to a version tag")
    if "runtime" in svc:
        out.append(
            f"{name}: `runtime: {svc['runtime']}` picks a container runtime but reserves no GPU; "
            "reserve the GPU under deploy.resources.reservations.devices"
        )
    devices = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get(
        "devices"
    ) or []
    if not any("gpu" in (d.get("capabilities") or []) for d in devices):
        out.append(f"{name}: no GPU reserved (deploy.resources.reservations.devices with capabilities [gpu])")
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
    for key, value in env.items():
        if "TOKEN" in key and value and not str(value).startswith("${"):
            out.append(f"{name}: {key} is written into the file; read it from the environment")
    if "HUGGING_FACE_HUB_TOKEN" in env and "HF_TOKEN" not in env:
        out.append(
            f"{name}: HUGGING_FACE_HUB_TOKEN is the old variable name; the Hub libraries read HF_TOKEN"
        )
    if "healthcheck" not in svc:
        out.append(f"{name}: no healthcheck")
    vols = [str(v) for v in svc.get("volumes") or []]
    if not any(
        v.split(":")[-1] in CACHE_TARGETS or (":" in v and v.rsplit(":", 2)[-2] in CACHE_TARGETS)
        for v in vols
    ):
        out.append(f"{name}: no volume for the model cache")
    return out


def compose_problems(path: str | Path) -> list[str]:
    """Behaviour problems of every service in a compose file."""
    import yaml

    doc = yaml.safe_load(Path(path).read_text())
    out = []
    for name, svc in (doc.get("services") or {}).items():
        if any(k in str(svc.get("image", "")) for k in SERVING_IMAGES):
            out += service_problems(name, svc)
    return out


def check_all(directory: str | Path = DOCKER_DIR) -> dict[str, list[str]]:
    """{file: problems} for the course's compose files."""
    return {p.name: compose_problems(p) for p in sorted(Path(directory).glob("*-compose.yml"))}


__all__ = ["DOCKER_DIR", "check_all", "compose_problems", "service_problems"]
