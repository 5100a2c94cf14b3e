"""Lab 10's deployment files checked offline: the Kubernetes manifests of docker/k8s/replicas
(schema with `kubernetes-validate --strict`, reusing lab 09's validator, then behaviour) and broken
copies of the replica Deployment for the find-and-fix exercise.

    deployment_problems(doc)        # [] when the Deployment validates and does what a GPU replica needs
    broken, faults = break_deployment(random.Random(3))   # a Deployment with 1-3 faults of FAULTS

Behaviour, beyond the schema: the image is pinned (a version tag, never `latest`); the GPU is in
`limits` (Kubernetes only schedules extended resources from limits; a request must equal the
limit); the Hugging Face token comes from a Secret, not a literal; startup and readiness probes
GET /health; the model cache is a PersistentVolumeClaim mounted where vLLM looks
(/root/.cache/huggingface); the selector matches the pod labels.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from ..bench.manifests import K8S_DIR, load_documents, validate_file, validate_resource

REPLICAS_DIR = K8S_DIR / "replicas"
REPLICA_FILE = REPLICAS_DIR / "vllm-replicas.yaml"
CACHE_PATH = "/root/.cache/huggingface"
PINNED = re.compile(r"^[\w./-]+:v?\d+(\.\d+)+[\w.-]*$")

# what each fault does to a correct Deployment, and what deployment_problems then reports
FAULTS = {
    "latest_tag": "the image moves under a running service (`:latest` or no tag)",
    "gpu_not_in_limits": "nvidia.com/gpu only in requests: the GPU is never scheduled",
    "token_literal": "HF_TOKEN written into the manifest instead of read from a Secret",
    "misspelt_probe": "a probe key misspelt (`readinesProbe`): strict validation rejects it",
    "port_as_string": "containerPort given as a string: strict validation rejects it",
    "no_model_cache": "no PersistentVolumeClaim at the model cache: every restart downloads the weights again",
    "selector_mismatch": "the selector does not match the pod labels: the Deployment owns no pods",
}


# The replica Deployment of docker/k8s/replicas/vllm-replicas.yaml, kept here too because the grader
# runs checks with a copy of lab_utils only; tests/test_deploy.py proves the two are the same.
REPLICA_DEPLOYMENT_YAML = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: vllm-replica
  labels:
    app: vllm-replica
spec:
  replicas: 2
  selector:
    matchLabels:
      app: vllm-replica
  template:
    metadata:
      labels:
        app: vllm-replica
    spec:
      terminationGracePeriodSeconds: 60
      containers:
      - name: vllm
        image: vllm/vllm-openai:v0.32.0
        args:
        - --model
        - HuggingFaceTB/SmolLM2-135M-Instruct
        - --host
        - 0.0.0.0
        - --port
        - '8000'
        - --enable-prefix-caching
        env:
        - name: HF_TOKEN
          valueFrom:
            secretKeyRef:
              name: hf-token
              key: HF_TOKEN
        ports:
        - name: http
          containerPort: 8000
        resources:
          requests:
            cpu: '4'
            memory: 16Gi
          limits:
            memory: 32Gi
            nvidia.com/gpu: '1'
        startupProbe:
          httpGet:
            path: /health
            port: http
          periodSeconds: 10
          failureThreshold: 60
        readinessProbe:
          httpGet:
            path: /health
            port: http
          periodSeconds: 5
          failureThreshold: 3
        livenessProbe:
          httpGet:
            path: /health
            port: http
          periodSeconds: 15
          failureThreshold: 4
        volumeMounts:
        - name: model-cache
          mountPath: /root/.cache/huggingface
        - name: shm
          mountPath: /dev/shm
      volumes:
      - name: model-cache
        persistentVolumeClaim:
          claimName: vllm-model-cache
      - name: shm
        emptyDir:
          medium: Memory
          sizeLimit: 8Gi
"""


def replica_deployment() -> dict:
    """The correct replica Deployment of docker/k8s/replicas/vllm-replicas.yaml (a fresh copy)."""
    import yaml

    return yaml.safe_load(REPLICA_DEPLOYMENT_YAML)


def _container(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def _probe_ok(c: dict, key: str) -> bool:
    probe = c.get(key) or {}
    return (probe.get("httpGet") or {}).get("path") == "/health"


def deployment_problems(doc: dict) -> list[str]:
    """Why `doc` is not a deployable vLLM GPU replica; [] when it is."""
    problems = validate_resource(doc)
    if problems:
        return problems
    out = []
    spec = doc["spec"]
    pod = spec["template"]
    c = _container(doc)
    if not PINNED.match(str(c.get("image", ""))):
        out.append(f"image {c.get('image')!r} is not pinned to a version tag")
    res = c.get("resources") or {}
    lim, req = res.get("limits") or {}, res.get("requests") or {}
    if "nvidia.com/gpu" not in lim:
        out.append("no nvidia.com/gpu in resources.limits")
    elif "nvidia.com/gpu" in req and str(req["nvidia.com/gpu"]) != str(lim["nvidia.com/gpu"]):
        out.append("nvidia.com/gpu request differs from its limit")
    for e in c.get("env") or []:
        if e.get("name") in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") and "value" in e:
            out.append(f"{e['name']} is a literal value; read it from a Secret (valueFrom.secretKeyRef)")
    if not any(
        e.get("name") == "HF_TOKEN" and (e.get("valueFrom") or {}).get("secretKeyRef")
        for e in c.get("env") or []
    ):
        out.append("HF_TOKEN is not read from a Secret")
    for key in ("startupProbe", "readinessProbe"):
        if not _probe_ok(c, key):
            out.append(f"{key} does not GET /health")
    claims = {v["name"] for v in pod["spec"].get("volumes") or [] if v.get("persistentVolumeClaim")}
    if not any(
        m.get("mountPath") == CACHE_PATH and m.get("name") in claims for m in c.get("volumeMounts") or []
    ):
        out.append(f"no PersistentVolumeClaim mounted at {CACHE_PATH}")
    labels = (pod.get("metadata") or {}).get("labels") or {}
    match = (spec.get("selector") or {}).get("matchLabels") or {}
    if not match or any(labels.get(k) != v for k, v in match.items()):
        out.append("spec.selector.matchLabels does not match the pod template's labels")
    return out


def _apply(doc: dict, fault: str, rng: random.Random) -> None:
    c = _container(doc)
    pod = doc["spec"]["template"]["spec"]
    if fault == "latest_tag":
        c["image"] = c["image"].split(":")[0] + rng.choice([":latest", ""])
    elif fault == "gpu_not_in_limits":
        gpus = c["resources"]["limits"].pop("nvidia.com/gpu")
        c["resources"].setdefault("requests", {})["nvidia.com/gpu"] = gpus
    elif fault == "token_literal":
        c["env"] = [e for e in c.get("env", []) if e["name"] != "HF_TOKEN"]
        c["env"].append(
            {"name": "HF_TOKEN", "value": "hf_" + "".join(rng.choice("abcdef0123456789") for _ in range(20))}
        )
    elif fault == "misspelt_probe":
        key, bad = rng.choice(
            [
                ("readinessProbe", "readinesProbe"),
                ("startupProbe", "startUpProbe"),
                ("livenessProbe", "livenesProbe"),
            ]
        )
        c[bad] = c.pop(key)
    elif fault == "port_as_string":
        c["ports"][0]["containerPort"] = str(c["ports"][0]["containerPort"])
    elif fault == "no_model_cache":
        cache = [m["name"] for m in c["volumeMounts"] if m["mountPath"] == CACHE_PATH]
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] not in cache]
        pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in cache]
    elif fault == "selector_mismatch":
        doc["spec"]["selector"]["matchLabels"] = {
            "app": doc["metadata"]["name"] + "-" + rng.choice(["v2", "old", "x"])
        }
    else:
        raise ValueError(f"unknown fault {fault!r}; one of {sorted(FAULTS)}")


def varied_deployment(rng: random.Random) -> dict:
    """A correct replica Deployment with its own name, replica count, model and port."""
    doc = replica_deployment()
    name = (
        rng.choice(["chat", "support", "search", "summarise", "agents"])
        + "-"
        + rng.choice(["a", "b", "prod", "eu"])
    )
    port = rng.choice([8000, 8080, 9000])
    doc["metadata"] = {"name": name, "labels": {"app": name}}
    doc["spec"]["replicas"] = rng.randint(1, 6)
    doc["spec"]["selector"] = {"matchLabels": {"app": name}}
    doc["spec"]["template"]["metadata"] = {"labels": {"app": name}}
    c = _container(doc)
    model = rng.choice(
        [
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "Qwen/Qwen2.5-7B-Instruct",
            "meta-llama/Llama-3.1-8B-Instruct",
            "mistralai/Mistral-7B-Instruct-v0.3",
        ]
    )
    c["args"] = [
        "--model",
        model,
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--enable-prefix-caching",
        "--max-model-len",
        str(rng.choice([4096, 8192, 16384])),
    ]
    c["ports"] = [{"name": "http", "containerPort": port}]
    c["image"] = "vllm/vllm-openai:" + rng.choice(["v0.31.1", "v0.32.0"])
    return doc


def break_deployment(rng: random.Random, max_faults: int = 3) -> tuple[dict, set[str]]:
    """A varied correct Deployment with 1..max_faults distinct faults of FAULTS applied."""
    doc = varied_deployment(rng)
    faults = set(rng.sample(sorted(FAULTS), rng.randint(1, max_faults)))
    for f in sorted(faults):
        _apply(doc, f, rng)
    return doc, faults


def kept_settings(original: dict, fixed: dict) -> list[str]:
    """What a fix changed that it should have kept: name, replicas, model arguments."""
    out = []
    if fixed.get("metadata", {}).get("name") != original["metadata"]["name"]:
        out.append("metadata.name changed")
    if fixed.get("spec", {}).get("replicas") != original["spec"]["replicas"]:
        out.append("spec.replicas changed")
    try:
        if _container(fixed).get("args") != _container(original).get("args"):
            out.append("the container's args changed")
    except (KeyError, IndexError, TypeError):
        out.append("no container")
    return out


def validate_replica_files(directory: str | Path = REPLICAS_DIR) -> dict[str, list[str]]:
    """{file: problems} for lab 10's manifests: schema for every resource, behaviour for Deployments of vLLM."""
    out = {}
    for p in sorted(Path(directory).glob("*.yaml")):
        problems = validate_file(p)
        for d in load_documents(p):
            if d["kind"] == "Deployment" and "vllm-openai" in _container(d).get("image", ""):
                problems += deployment_problems(d)
        out[p.name] = problems
    return out


__all__ = [
    "CACHE_PATH",
    "FAULTS",
    "REPLICAS_DIR",
    "REPLICA_FILE",
    "break_deployment",
    "deployment_problems",
    "kept_settings",
    "replica_deployment",
    "validate_replica_files",
    "varied_deployment",
]
