"""Offline checks of docker/hub/z2jh-values.yaml, the class on Kubernetes (Zero to JupyterHub).

No cluster and no Helm here, so this checks what can be checked from the file, as lab 10 checks
its manifests: every key we set exists in the chart (key names from the Zero to JupyterHub chart
4.4.0's values.yaml, read 2026-12-05: a typo in a Helm value is silently ignored by the chart, so
this is the check that catches it), and the settings keep what the one-machine hub promises:

- learners cannot see each other: network policy on, no admin access to learners' servers;
- limits: CPU and memory guarantees and limits set, limit >= guarantee (the kubelet enforces them);
- a pinned image (a tag, never `latest`), a real login (not the chart's `dummy` authenticator), TLS;
- no secret in the file (client secrets, cookie and proxy tokens go in a second values file);
- nbgrader's exchange mounted at the path docker/hub/nbgrader_config.py's exchange root uses;
- each GPU profile asks for a whole number of `nvidia.com/gpu` and nothing else;
- idle servers culled.

    python docker/hub/z2jh.py [values.yaml]     prints the problems, exits 1 if any
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
VALUES = HERE / "z2jh-values.yaml"
EXCHANGE = "/srv/nbgrader/exchange"  # hub.sh's HUB_EXCHANGE default, nbgrader's Exchange.root
CHART = "Zero to JupyterHub chart 4.4.0"

# The keys the chart's values.yaml defines at each level we set (free-form levels are not listed:
# hub.config is JupyterHub's own configuration, profileList is passed to KubeSpawner).
CHART_KEYS: dict[str, set[str]] = {
    "": {
        "cull", "custom", "debug", "enabled", "fullnameOverride", "global", "httpRoute", "hub",
        "imagePullSecret", "imagePullSecrets", "ingress", "nameOverride", "prePuller", "proxy", "rbac",
        "scheduling", "singleuser",
    },
    "hub": {
        "activeServerLimit", "allowNamedServers", "annotations", "args", "authenticatePrometheus", "baseUrl",
        "command", "concurrentSpawnLimit", "config", "consecutiveFailureLimit", "containerSecurityContext",
        "cookieSecret", "db", "deploymentStrategy", "existingSecret", "extraConfig", "extraContainers",
        "extraEnv", "extraFiles", "extraPodSpec", "extraVolumeMounts", "extraVolumes", "image",
        "initContainers", "labels", "lifecycle", "livenessProbe", "loadRoles", "namedServerLimitPerUser",
        "networkPolicy", "nodeSelector", "pdb", "podSecurityContext", "readinessProbe", "redirectToServer",
        "resources", "revisionHistoryLimit", "service", "serviceAccount", "services", "shutdownOnLogout",
        "templatePaths", "templateVars", "tolerations",
    },
    "proxy": {
        "annotations", "chp", "deploymentStrategy", "https", "labels", "secretSync", "secretToken", "service",
        "traefik",
    },
    "proxy.https": {"enabled", "hosts", "letsencrypt", "manual", "secret", "type"},
    "proxy.https.letsencrypt": {"acmeServer", "contactEmail"},
    "singleuser": {
        "allowPrivilegeEscalation", "cloudMetadata", "cmd", "cpu", "defaultUrl", "events", "extraAnnotations",
        "extraContainers", "extraEnv", "extraFiles", "extraLabels", "extraNodeAffinity", "extraPodAffinity",
        "extraPodAntiAffinity", "extraPodConfig", "extraResource", "extraTolerations", "fsGid", "image",
        "initContainers", "lifecycleHooks", "memory", "networkPolicy", "networkTools", "nodeSelector",
        "podNameTemplate", "profileList", "serviceAccountName", "startTimeout", "storage", "uid",
    },
    "singleuser.image": {"name", "pullPolicy", "pullSecrets", "tag"},
    "singleuser.cpu": {"guarantee", "limit"},
    "singleuser.memory": {"guarantee", "limit"},
    "singleuser.storage": {
        "capacity", "dynamic", "extraLabels", "extraVolumeMounts", "extraVolumes", "homeMountPath", "static",
        "type",
    },
    "singleuser.networkPolicy": {
        "allowedIngressPorts", "egress", "egressAllowRules", "enabled", "ingress", "interNamespaceAccessLabels",
    },
    "scheduling": {"corePods", "podPriority", "userPlaceholder", "userPods", "userScheduler"},
    "scheduling.userScheduler": {
        "annotations", "containerSecurityContext", "enabled", "extraPodSpec", "image", "labels", "logLevel",
        "nodeSelector", "pdb", "pluginConfig", "plugins", "replicas", "resources", "revisionHistoryLimit",
        "serviceAccount", "tolerations",
    },
    "cull": {"adminUsers", "concurrency", "enabled", "every", "maxAge", "removeNamedServers", "timeout", "users"},
}  # fmt: skip
SECRET_KEYS = {"client_secret", "cookieSecret", "secretToken", "password", "bind_user_password", "api_token"}
PROFILE_OVERRIDES = {
    "image",
    "cpu_limit",
    "cpu_guarantee",
    "mem_limit",
    "mem_guarantee",
    "extra_resource_limits",
}
_SI = {
    "": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(value) -> float:
    """Bytes of a Kubernetes/KubeSpawner memory quantity ('4G', '512Mi', 2**30); ValueError if not one."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?)?\s*", str(value))
    if not m:
        raise ValueError(f"{value!r} is not a memory quantity such as 4G or 512Mi")
    return float(m.group(1)) * _SI[m.group(2) or ""]


def _unknown_keys(values: dict) -> list[str]:
    out = []
    for path, known in CHART_KEYS.items():
        node = values
        for part in [p for p in path.split(".") if p]:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        for key in sorted(set(node) - known):
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            out.append(
                f"{(path + '.' if path else '')}{key}: not a key of the {CHART}{hint}; Helm would ignore it"
            )
    return out


def _secrets(node, path: str = "") -> list[str]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            here = f"{path}.{k}" if path else str(k)
            if k in SECRET_KEYS and v not in (None, ""):
                out.append(f"{here}: a secret in the values file; put it in a second file kept out of git")
            out += _secrets(v, here)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _secrets(v, f"{path}[{i}]")
    return out


def _limits(where: str, cpu: dict, mem: dict) -> list[str]:
    out = []
    for name, d in (("cpu", cpu), ("memory", mem)):
        if not isinstance(d, dict) or d.get("limit") in (None, "") or d.get("guarantee") in (None, ""):
            out.append(
                f"{where}.{name}: set both guarantee and limit (the one-machine hub limits every server)"
            )
    if out:
        return out
    try:
        if float(cpu["limit"]) < float(cpu["guarantee"]):
            out.append(f"{where}.cpu: limit {cpu['limit']} is below guarantee {cpu['guarantee']}")
    except (TypeError, ValueError):
        out.append(f"{where}.cpu: guarantee and limit must be numbers of cores")
    try:
        if quantity(mem["limit"]) < quantity(mem["guarantee"]):
            out.append(f"{where}.memory: limit {mem['limit']} is below guarantee {mem['guarantee']}")
    except ValueError as exc:
        out.append(f"{where}.memory: {exc}")
    return out


def _image(where: str, name: str, tag) -> list[str]:
    if not name:
        return [f"{where}: no image name"]
    if tag in (None, "") or str(tag) == "latest":
        return [f"{where}: pin the image to the course release's tag, not {tag or 'no tag'!r}"]
    return []


def _profiles(profiles) -> list[str]:
    out = []
    if not isinstance(profiles, list) or not profiles:
        return ["singleuser.profileList: list the CPU profile and the GPU profile"]
    if sum(1 for p in profiles if isinstance(p, dict) and p.get("default")) != 1:
        out.append("singleuser.profileList: exactly one profile is the default")
    for i, p in enumerate(profiles):
        where = f"singleuser.profileList[{i}]"
        if not isinstance(p, dict) or not p.get("display_name"):
            out.append(f"{where}: a profile needs a display_name")
            continue
        over = p.get("kubespawner_override") or {}
        for key in sorted(set(over) - PROFILE_OVERRIDES):
            out.append(f"{where}.kubespawner_override.{key}: not one of {sorted(PROFILE_OVERRIDES)}")
        if "image" in over:
            ref = str(over["image"])
            name, tag = ref.rsplit(":", 1) if ":" in ref.rsplit("/", 1)[-1] else (ref, None)
            out += _image(f"{where}.kubespawner_override.image", name, tag)
        extra = over.get("extra_resource_limits") or {}
        for res, n in extra.items():
            if res != "nvidia.com/gpu":
                out.append(
                    f"{where}: {res} is not nvidia.com/gpu (MIG slices come as nvidia.com/gpu with "
                    "mig.strategy=single)"
                )
            if not re.fullmatch(r"[1-9][0-9]*", str(n)) or not isinstance(n, str):
                out.append(f'{where}: nvidia.com/gpu must be a whole number of GPUs as a string, like "1"')
    return out


def problems(values: dict) -> list[str]:
    """What is wrong with a Zero to JupyterHub values mapping for this course's class ([] if nothing)."""
    if not isinstance(values, dict):
        return ["the values file is not a mapping"]
    out = _unknown_keys(values) + _secrets(values)
    hub = (values.get("hub") or {}).get("config") or {}
    auth = str((hub.get("JupyterHub") or {}).get("authenticator_class", "dummy"))
    if auth in ("dummy", "null", "jupyterhub.auth.DummyAuthenticator"):
        out.append("hub.config.JupyterHub.authenticator_class: a real login, not the chart's default dummy")
    if (hub.get("JupyterHub") or {}).get("admin_access", False):
        out.append("hub.config.JupyterHub.admin_access: instructors must not open learners' servers")
    https = (values.get("proxy") or {}).get("https") or {}
    if not https.get("enabled") or not https.get("hosts"):
        out.append("proxy.https: enable TLS with the class's host name")
    su = values.get("singleuser") or {}
    image = su.get("image") or {}
    out += _image("singleuser.image", image.get("name"), image.get("tag"))
    out += _limits("singleuser", su.get("cpu"), su.get("memory"))
    if not (su.get("networkPolicy") or {}).get("enabled", True):
        out.append("singleuser.networkPolicy.enabled: keep learners' pods from reaching each other")
    mounts = (su.get("storage") or {}).get("extraVolumeMounts") or []
    vols = {v.get("name") for v in (su.get("storage") or {}).get("extraVolumes") or [] if isinstance(v, dict)}
    ex = [m for m in mounts if isinstance(m, dict) and m.get("mountPath") == EXCHANGE]
    if not ex:
        out.append(f"singleuser.storage.extraVolumeMounts: mount nbgrader's exchange at {EXCHANGE}")
    elif ex[0].get("name") not in vols:
        out.append(
            f"singleuser.storage: the exchange mount names volume {ex[0].get('name')!r}, not in extraVolumes"
        )
    out += _profiles(su.get("profileList"))
    cull = values.get("cull") or {}
    if not cull.get("enabled", True) or not isinstance(cull.get("timeout", 3600), int):
        out.append("cull: keep idle servers culled (enabled, a timeout in seconds)")
    return out


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else VALUES
    found = problems(yaml.safe_load(path.read_text()))
    for p in found:
        print(f"{path}: {p}")
    if not found:
        print(
            f"{path}: no problems ({CHART} keys, limits, image, login, TLS, exchange, GPU profiles, culling)"
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
