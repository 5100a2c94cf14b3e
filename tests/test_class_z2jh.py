"""docker/hub/z2jh-values.yaml, the class on Kubernetes, checked offline by docker/hub/z2jh.py: the
shipped file passes, and each way of breaking it is named (a typo the chart would ignore, a secret,
an unpinned image, a missing limit, the exchange not mounted, a GPU profile asking for the wrong thing)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "docker" / "hub"))
import z2jh  # noqa: E402

GOOD = yaml.safe_load(z2jh.VALUES.read_text())


def test_the_shipped_values_pass_and_the_command_says_so():
    assert z2jh.problems(GOOD) == []
    run = subprocess.run([sys.executable, str(REPO / "docker/hub/z2jh.py")], capture_output=True, text=True)
    assert run.returncode == 0 and "no problems" in run.stdout


def _broken(edit) -> list[str]:
    values = copy.deepcopy(GOOD)
    edit(values)
    return z2jh.problems(values)


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            lambda v: v["singleuser"].__setitem__("memroy", v["singleuser"].pop("memory")),
            "did you mean memory",
        ),
        (lambda v: v["singleuser"]["cpu"].pop("limit"), "singleuser.cpu: set both"),
        (lambda v: v["singleuser"]["memory"].__setitem__("limit", "2G"), "below guarantee"),
        (lambda v: v["singleuser"]["memory"].__setitem__("limit", "lots"), "not a memory quantity"),
        (lambda v: v["singleuser"]["image"].__setitem__("tag", "latest"), "pin the image"),
        (
            lambda v: v["hub"]["config"]["GenericOAuthenticator"].__setitem__("client_secret", "s3cr3t"),
            "client_secret: a secret",
        ),
        (
            lambda v: v["hub"]["config"]["JupyterHub"].__setitem__("authenticator_class", "dummy"),
            "a real login",
        ),
        (lambda v: v["hub"]["config"]["JupyterHub"].__setitem__("admin_access", True), "admin_access"),
        (lambda v: v["proxy"]["https"].__setitem__("enabled", False), "enable TLS"),
        (lambda v: v["singleuser"]["storage"].pop("extraVolumeMounts"), "mount nbgrader's exchange"),
        (lambda v: v["singleuser"]["storage"].pop("extraVolumes"), "not in extraVolumes"),
        (lambda v: v["singleuser"]["networkPolicy"].__setitem__("enabled", False), "networkPolicy"),
        (
            lambda v: v["singleuser"]["profileList"][1]["kubespawner_override"].__setitem__(
                "extra_resource_limits", {"nvidia.com/gpu": 1}
            ),
            "as a string",
        ),
        (
            lambda v: v["singleuser"]["profileList"][1]["kubespawner_override"].__setitem__(
                "extra_resource_limits", {"amd.com/gpu": "1"}
            ),
            "is not nvidia.com/gpu",
        ),
        (
            lambda v: v["singleuser"]["profileList"][1]["kubespawner_override"].__setitem__(
                "image", "course"
            ),
            "pin the image",
        ),
        (lambda v: v["singleuser"]["profileList"][1].__setitem__("default", True), "exactly one profile"),
        (lambda v: v["cull"].__setitem__("enabled", False), "culled"),
    ],
)
def test_each_broken_setting_is_named(edit, said):
    found = _broken(edit)
    assert any(said in p for p in found), found


def test_the_exchange_path_is_the_one_hub_sh_and_nbgrader_use():
    assert f"HUB_EXCHANGE:-{z2jh.EXCHANGE}" in (REPO / "docker/hub/hub.sh").read_text()


def test_memory_quantities():
    assert (
        z2jh.quantity("4G") == 4e9 and z2jh.quantity("512Mi") == 512 * 2**20 and z2jh.quantity(1024) == 1024
    )
    with pytest.raises(ValueError):
        z2jh.quantity("4 gigs")
