"""Log learners into a running hub, start their servers and report what each got (a trial, as root).

    <hub venv>/bin/python docker/hub/smoke.py http://127.0.0.1:8000 PASSWORD alice bob

For each learner: the login, the spawn time, the server's uid, its cgroups and their limits, and
whether the other learners can list its home. Prints one JSON object; exit 1 when a check fails.
Needs the hub started with HUB_AUTH=shared (the password is HUB_SHARED_PASSWORD).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time

import requests


def login(base: str, user: str, password: str) -> requests.Session:
    s = requests.Session()
    s.get(f"{base}/hub/login", timeout=10)
    r = s.post(
        f"{base}/hub/login",
        data={"username": user, "password": password, "_xsrf": s.cookies.get("_xsrf", "")},
        allow_redirects=False,
        timeout=10,
    )
    if r.status_code != 302:
        raise RuntimeError(f"login of {user}: HTTP {r.status_code}")
    return s


def spawn(base: str, s: requests.Session, user: str, timeout: float = 60) -> float:
    t0 = time.monotonic()
    s.get(f"{base}/hub/spawn/{user}", timeout=timeout)
    while time.monotonic() - t0 < timeout:
        # the page (not the API) runs the hub's OAuth hand-shake that gives the server's cookie
        r = s.get(f"{base}/user/{user}/lab", timeout=10)
        if r.status_code == 200 and r.url.startswith(f"{base}/user/{user}/"):
            return time.monotonic() - t0
        time.sleep(0.25)
    raise RuntimeError(f"the server of {user} did not answer in {timeout:.0f} s")


def server_pid(user: str) -> int:
    uid = pwd.getpwnam(user).pw_uid
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            if b"jupyterhub-singleuser" in cmd and os.stat(f"/proc/{pid}").st_uid == uid:
                return int(pid)
        except OSError:
            continue
    raise RuntimeError(f"no jupyterhub-singleuser process of {user}")


def cgroups_of(pid: int) -> dict[str, str]:
    groups = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, names, path = line.strip().split(":", 2)
            for n in names.split(","):
                if n in ("memory", "cpu", "pids"):
                    groups[n] = path
    limits = {}
    for name, file in (
        ("memory", "memory.limit_in_bytes"),
        ("cpu", "cpu.cfs_quota_us"),
        ("pids", "pids.max"),
    ):
        try:
            with open(f"/sys/fs/cgroup/{name}{groups.get(name, '/')}/{file}") as f:
                limits[name] = f.read().strip()
        except OSError:
            limits[name] = "?"
    return {"groups": groups, "limits": limits}


def main(base: str, password: str, users: list[str]) -> int:
    report: dict = {"learners": {}}
    ok = True
    for user in users:
        s = login(base, user, password)
        seconds = spawn(base, s, user)
        pid = server_pid(user)
        report["learners"][user] = {
            "spawn_s": round(seconds, 2),
            "server_uid": os.stat(f"/proc/{pid}").st_uid,
            "user_uid": pwd.getpwnam(user).pw_uid,
            **cgroups_of(pid),
        }
        ok &= report["learners"][user]["server_uid"] == report["learners"][user]["user_uid"]
    for user in users:
        home = pwd.getpwnam(user).pw_dir
        for other in users:
            if other != user:
                r = subprocess.run(["runuser", "-u", other, "--", "ls", home], capture_output=True)
                report["learners"][user][f"home_listable_by_{other}"] = r.returncode == 0
                ok &= r.returncode != 0
    report["ok"] = ok
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3:]))
