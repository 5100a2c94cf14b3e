"""Offline validation of the course's Kubernetes manifests (docker/k8s/), without a cluster.

- built-in kinds (Deployment, Service, HorizontalPodAutoscaler) with `kubernetes-validate --strict`
  (the Kubernetes OpenAPI schemas, 1.37 by default): a misspelt field is an error;
- KEDA's ScaledObject (a CRD, unknown to those schemas) against the JSON schema the course keeps in
  docker/k8s/schemas/keda-scaledobject.schema.json;
- the Prometheus queries in them name vLLM metrics; `vllm_metric_names` pulls the names out so a
  test can check them against a real server's /metrics page.

    problems = validate_file("docker/k8s/vllm-deployment.yaml")     # [] when valid
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path


def _find_k8s_dir() -> Path:
    """docker/k8s of the course repository, also when lab_utils runs from a copy (the grader's kernel)."""
    candidates = [Path(__file__).resolve().parents[2]]
    if os.environ.get("LAB_REPO"):
        candidates.insert(0, Path(os.environ["LAB_REPO"]))
    candidates += [Path.cwd(), *Path.cwd().parents]
    try:  # the editable install records where the repository is
        from importlib.metadata import distribution

        url = json.loads(distribution("llm-serving-lab").read_text("direct_url.json") or "{}").get("url", "")
        if url.startswith("file://"):
            candidates.append(Path(url[len("file://") :]))
    except Exception:
        pass
    for root in candidates:
        if (root / "docker" / "k8s" / "schemas").is_dir():
            return root / "docker" / "k8s"
    return candidates[0] / "docker" / "k8s"


K8S_DIR = _find_k8s_dir()
REPO = K8S_DIR.parent.parent
KEDA_SCHEMA = K8S_DIR / "schemas" / "keda-scaledobject.schema.json"
K8S_VERSION = "1.37.0"


def load_documents(path: str | Path) -> list[dict]:
    """Every YAML document in a file (empty ones dropped)."""
    import yaml

    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def scaledobject_behaviour(doc: dict) -> list[str]:
    """Fields that validate but do nothing: KEDA's cooldownPeriod only governs scaling to zero."""
    spec = doc.get("spec") or {}
    if "cooldownPeriod" in spec and int(spec.get("minReplicaCount", 0)) > 0:
        return [
            "ScaledObject: spec/cooldownPeriod: only used when scaling to zero, and minReplicaCount is "
            f"{spec['minReplicaCount']}; slow scale-down goes in "
            "advanced.horizontalPodAutoscalerConfig.behavior.scaleDown"
        ]
    return []


def validate_resource(doc: dict) -> list[str]:
    """Problems with one resource; [] when it validates."""
    kind = doc.get("kind")
    if kind == "ScaledObject":
        import jsonschema

        schema = json.loads(KEDA_SCHEMA.read_text())
        validator = jsonschema.Draft202012Validator(schema)
        problems = [
            f"ScaledObject: {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
        ]
        return problems + scaledobject_behaviour(doc)
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(map(str, exc.path)) if getattr(exc, "path", None) else "(root)"
        return [f"{kind}: {where}: {exc.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        return [f"{kind}: no schema to validate against: {exc}"]
    return []


def validate_file(path: str | Path) -> list[str]:
    """Problems with every resource in a YAML file; [] when all validate."""
    problems = []
    for doc in load_documents(path):
        problems += validate_resource(doc)
    return problems


def validate_all(directory: str | Path = K8S_DIR) -> dict[str, list[str]]:
    """{file name: problems} for every manifest in a folder."""
    return {p.name: validate_file(p) for p in sorted(Path(directory).glob("*.yaml"))}


def prometheus_triggers(directory: str | Path = K8S_DIR) -> list[dict]:
    """Every KEDA `prometheus` trigger in the folder's ScaledObjects: file, query and threshold.

    KEDA asks the HPA for ceil(query value / threshold) replicas (an AverageValue target), within
    minReplicaCount and maxReplicaCount, which come along as `min` and `max`.
    """
    out = []
    for p in sorted(Path(directory).glob("*.yaml")):
        for doc in load_documents(p):
            if doc.get("kind") != "ScaledObject":
                continue
            spec = doc.get("spec") or {}
            for trig in spec.get("triggers") or []:
                meta = trig.get("metadata") or {}
                if trig.get("type") == "prometheus" and "query" in meta:
                    out.append(
                        {
                            "file": p.name,
                            "query": str(meta["query"]),
                            "threshold": float(meta["threshold"]),
                            "min": int(spec.get("minReplicaCount", 0)),
                            "max": int(spec.get("maxReplicaCount", 100)),
                        }
                    )
    return out


_DISCOVERY_LABEL = re.compile(r'\s*\b(namespace|pod|service)\s*=~?\s*"[^"]*"\s*,?')


def without_discovery_labels(query: str) -> str:
    """The query with its namespace/pod/service matchers dropped: in a cluster Prometheus adds those
    labels from Kubernetes service discovery; a Prometheus scraping 127.0.0.1 has none of them, so
    the query as written would match no series."""
    q = _DISCOVERY_LABEL.sub("", query)
    q = re.sub(r",\s*}", "}", q)
    return re.sub(r"\{\s*\}", "", q)


_METRIC = re.compile(r"\bvllm[:_][a-z_]+")


def vllm_metric_names(directory: str | Path = K8S_DIR) -> dict[str, set[str]]:
    """{file: vLLM metric names named in it} (Prometheus queries, HPA custom metrics)."""
    out: dict[str, set[str]] = {}
    for p in sorted(Path(directory).glob("*.yaml")):
        text = "\n".join(line.split("#", 1)[0] for line in p.read_text().splitlines())
        names = set(_METRIC.findall(text))
        if names:
            out[p.name] = names
    return out


__all__ = [
    "K8S_DIR",
    "KEDA_SCHEMA",
    "load_documents",
    "prometheus_triggers",
    "scaledobject_behaviour",
    "validate_all",
    "validate_file",
    "validate_resource",
    "vllm_metric_names",
    "without_discovery_labels",
]
