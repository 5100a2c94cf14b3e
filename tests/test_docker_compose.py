"""docker/*.yml: every compose file is valid for a real compose parser, and says what a GPU lab
machine needs.

With `docker-compose` (Debian's 1.29 package: `apt-get install docker-compose`) on PATH, each file
goes through `docker-compose -f FILE config`, which needs no Docker engine, expands variables
and rejects misspelt keys. Without it, a JSON schema for the keys the course uses (a strict
subset of the Compose specification) stands in.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

DOCKER = Path(__file__).resolve().parent.parent / "docker"
FILES = sorted(DOCKER.glob("*.yml")) + sorted(DOCKER.glob("*.yaml"))
COMPOSE = shutil.which("docker-compose")
REQUIRED_VAR = re.compile(r"\$\{(\w+):\?")

_STR_OR_LIST = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": ["string", "number"]}}]}
_DEVICE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "driver": {"type": "string"},
        "count": {"type": ["integer", "string"]},
        "device_ids": {"type": "array"},
        "capabilities": {"type": "array", "items": {"type": "string"}},
        "options": {"type": "object"},
    },
}
_SERVICE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["image"],
    "properties": {
        "image": {"type": "string"},
        "command": _STR_OR_LIST,
        "entrypoint": _STR_OR_LIST,
        "environment": {"type": ["object", "array"]},
        "env_file": _STR_OR_LIST,
        "ports": {"type": "array"},
        "volumes": {"type": "array"},
        "ipc": {"type": "string"},
        "shm_size": {"type": ["string", "integer"]},
        "restart": {"type": "string"},
        "working_dir": {"type": "string"},
        "depends_on": {"type": ["array", "object"]},
        "runtime": {"type": "string"},
        "ulimits": {"type": "object"},
        "container_name": {"type": "string"},
        "healthcheck": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "test": _STR_OR_LIST,
                "interval": {"type": "string"},
                "timeout": {"type": "string"},
                "retries": {"type": "integer"},
                "start_period": {"type": "string"},
                "disable": {"type": "boolean"},
            },
        },
        "deploy": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "replicas": {"type": "integer"},
                "resources": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "limits": {"type": "object"},
                        "reservations": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "cpus": {"type": ["string", "number"]},
                                "memory": {"type": "string"},
                                "devices": {"type": "array", "items": _DEVICE},
                            },
                        },
                    },
                },
            },
        },
    },
}
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["services"],
    "patternProperties": {"^x-": {}},
    "properties": {
        "version": {"type": "string"},
        "services": {"type": "object", "additionalProperties": _SERVICE},
        "volumes": {"type": "object"},
        "networks": {"type": "object"},
    },
}


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _compose_config(path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for var in REQUIRED_VAR.findall(path.read_text()):
        env.setdefault(var, f"placeholder-{var.lower()}")
    return subprocess.run(
        [COMPOSE, "-f", str(path), "config"],
        capture_output=True,
        text=True,
        env=env,
        cwd=path.parent,
        timeout=60,
    )


def _validate(path: Path) -> None:
    """Raise when `path` is not a valid compose file (docker-compose if present, else the schema)."""
    if COMPOSE:
        proc = _compose_config(path)
        if proc.returncode != 0:
            raise AssertionError(f"docker-compose config rejected {path.name}:\n{proc.stderr}")
        return
    jsonschema = pytest.importorskip("jsonschema")
    try:
        jsonschema.validate(_load(path), SCHEMA)
    except jsonschema.ValidationError as exc:
        raise AssertionError(f"{path.name}: {exc.message} at {list(exc.absolute_path)}") from None


def test_there_are_compose_files():
    assert any(p.name == "vllm-compose.yml" for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_compose_file_is_valid(path):
    _validate(path)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_images_are_pinned_and_services_have_healthchecks(path):
    for name, svc in _load(path)["services"].items():
        image = svc["image"]
        assert ":" in image.rsplit("/", 1)[-1], f"{path.name}/{name}: pin the image tag, not the default"
        assert not image.endswith((":latest", ":main", ":nightly")), f"{path.name}/{name}: {image} moves"
        assert "healthcheck" in svc, f"{path.name}/{name}: add a healthcheck"


def test_validator_rejects_a_misspelt_gpu_key(tmp_path):
    text = (DOCKER / "vllm-compose.yml").read_text()
    assert "capabilities: [gpu]" in text
    bad = tmp_path / "bad.yml"
    bad.write_text(text.replace("capabilities: [gpu]", "capabilitiez: [gpu]"))
    with pytest.raises(AssertionError, match="capabilitiez"):
        _validate(bad)


@pytest.mark.skipif(
    COMPOSE is None, reason="docker-compose is not installed (apt-get install docker-compose)"
)
def test_compose_refuses_to_start_without_the_secrets():
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "VLLM_API_KEY")}
    proc = subprocess.run(
        [COMPOSE, "-f", str(DOCKER / "vllm-compose.yml"), "config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode != 0 and "HF_TOKEN" in proc.stderr


def test_vllm_compose_says_what_a_gpu_machine_needs():
    svc = _load(DOCKER / "vllm-compose.yml")["services"]["vllm"]
    assert re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+", svc["image"])
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert svc["ports"] == ["127.0.0.1:${VLLM_PORT:-8000}:8000"]
    env = svc["environment"]
    assert env["HF_TOKEN"].startswith("${HF_TOKEN:?") and env["VLLM_API_KEY"].startswith("${VLLM_API_KEY:?")
    assert any(v.endswith(":/root/.cache/huggingface") for v in svc["volumes"])
    assert "/health" in " ".join(svc["healthcheck"]["test"])
    cmd = svc["command"]
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "${VLLM_GPU_MEMORY_UTILIZATION:-0.90}"
    assert "--api-key" not in cmd  # the key comes from VLLM_API_KEY, never from the file


@pytest.mark.skipif(COMPOSE is None, reason="docker-compose is not installed")
def test_vllm_compose_expands_defaults():
    out = yaml.safe_load(_compose_config(DOCKER / "vllm-compose.yml").stdout)
    cmd = out["services"]["vllm"]["command"]
    assert cmd[0] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.90"
    assert out["services"]["vllm"]["ports"][0].startswith("127.0.0.1:8000:8000")


def test_tgi_compose_says_what_a_gpu_machine_needs():
    svc = _load(DOCKER / "tgi-compose.yml")["services"]["tgi"]
    assert re.fullmatch(r"ghcr\.io/huggingface/text-generation-inference:\d+\.\d+\.\d+", svc["image"])
    assert svc["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    ]
    assert svc["shm_size"] == "1g" and svc["ports"][0].startswith("127.0.0.1:")
    assert svc["environment"]["HF_TOKEN"].startswith("${HF_TOKEN:?")
    assert any(v.endswith(":/data") for v in svc["volumes"])
    assert "/health" in " ".join(svc["healthcheck"]["test"])
    cmd = svc["command"]
    for flag in (
        "--model-id",
        "--num-shard",
        "--max-input-tokens",
        "--max-total-tokens",
        "--max-batch-prefill-tokens",
        "--max-concurrent-requests",
        "--waiting-served-ratio",
        "--max-waiting-tokens",
    ):
        assert flag in cmd, flag
