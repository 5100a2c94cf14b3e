# JupyterHub for a class on one machine: `make hub` (docker/hub/hub.sh) starts it with this file.
#
# Learners are real unix users (LocalProcessSpawner: each server runs as its own uid, in its own
# home, mode 700); the hub binds to 127.0.0.1; each server joins its own cgroup v1 group
# (memory/CPU/processes, docker/hub/cgroups.py) where the machine allows it, and the hub's log says
# so where it does not. nbgrader's exchange is configured in docker/hub/nbgrader_config.py.
#
# Settings come from the environment hub.sh passes (defaults in brackets):
#   HUB_VENV [/opt/llm-serving-hub/venv]   the hub's own venv, world-readable, from Debian's python3.11
#   HUB_STATE [/srv/llm-serving-hub]       the hub's database and cookie secret (mode 700)
#   HUB_PORT [8000]  HUB_IP [127.0.0.1]
#   HUB_USERS                              learners' user names, space-separated
#   HUB_ADMINS [instructor]                instructors (nbgrader's formgrader, admin page)
#   HUB_MEM_LIMIT [4G]  HUB_CPU_LIMIT [1]  HUB_PIDS_LIMIT [1024]   per learner server
#   HUB_AUTH [pam]                         pam (the users' unix passwords) or shared (a trial only:
#                                          HUB_SHARED_PASSWORD for learners, HUB_ADMIN_PASSWORD for admins)
#
# PRODUCTION AUTHENTICATION AND TLS: the one place to change is the block marked AUTH below.
#   OAuth (GitHub, Google, a school's OIDC): pip install oauthenticator into HUB_VENV, then
#       c.JupyterHub.authenticator_class = "generic-oauth"   (with its client id/secret/URLs)
#   LDAP: pip install jupyterhub-ldapauthenticator; c.JupyterHub.authenticator_class = "ldapauthenticator"
#   Native sign-up: pip install jupyterhub-nativeauthenticator; authenticator_class = "native"
#   In each case keep LocalProcessSpawner's real users: create a unix user per learner (hub.sh
#   users) or set c.LocalAuthenticator.create_system_users = True.
#   TLS: put a reverse proxy (nginx, Caddy) with the school's certificate in front of
#   127.0.0.1:HUB_PORT, or set c.JupyterHub.ssl_cert / ssl_key and HUB_IP=0.0.0.0.

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cgroups  # noqa: E402  (docker/hub/cgroups.py, beside this file)
from jupyterhub.spawner import LocalProcessSpawner  # noqa: E402

c = get_config()  # noqa: F821  (JupyterHub's config loader defines it)

VENV = os.environ.get("HUB_VENV", "/opt/llm-serving-hub/venv")
STATE = Path(os.environ.get("HUB_STATE", "/srv/llm-serving-hub"))
USERS = set(os.environ.get("HUB_USERS", "").split())
ADMINS = set(os.environ.get("HUB_ADMINS", "instructor").split())


class CgroupSpawner(LocalProcessSpawner):
    """LocalProcessSpawner whose server (and everything it starts) runs in the user's own cgroups."""

    _procs: list = []

    async def start(self):
        limits = cgroups.Limits(
            memory_bytes=cgroups.parse_bytes(self.mem_limit),
            cpus=float(self.cpu_limit or 0),
            pids=int(os.environ.get("HUB_PIDS_LIMIT", "1024")),
        )
        why = cgroups.problem()
        if why:
            self.log.warning(
                "%s: no cgroup limits for %s's server: %s", type(self).__name__, self.user.name, why
            )
            self._procs = []
        else:
            self._procs = cgroups.prepare(self.user.name, limits)
            self.log.info("%s's server runs in its own cgroups: %s", self.user.name, limits)
        return await super().start()

    def make_preexec_fn(self, name):
        drop = super().make_preexec_fn(name)
        procs = list(self._procs)

        def preexec():
            cgroups.join(procs)  # still root here: join before the uid is dropped
            drop()

        return preexec

    async def stop(self, now=False):
        await super().stop(now=now)
        cgroups.remove(self.user.name)


c.JupyterHub.ip = os.environ.get("HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(os.environ.get("HUB_PORT", "8000"))
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
c.ConfigurableHTTPProxy.command = [f"{VENV}/bin/configurable-http-proxy"]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")

c.JupyterHub.spawner_class = CgroupSpawner
c.Spawner.cmd = [f"{VENV}/bin/jupyterhub-singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 60
c.Spawner.http_timeout = 60
c.Spawner.mem_limit = os.environ.get("HUB_MEM_LIMIT", "4G")
c.Spawner.cpu_limit = float(os.environ.get("HUB_CPU_LIMIT", "1"))
# the venv first on PATH, else nbgrader's lab extension does not find `alembic`
c.Spawner.environment = {
    "PATH": f"{VENV}/bin:/usr/local/bin:/usr/bin:/bin",
    "JUPYTER_CONFIG_PATH": str(HERE / "jupyter"),
}

# --- AUTH: the one place for production authentication (see the header) ---
if os.environ.get("HUB_AUTH", "pam") == "shared":
    c.JupyterHub.authenticator_class = "shared-password"
    c.SharedPasswordAuthenticator.user_password = os.environ["HUB_SHARED_PASSWORD"]  # 8+ characters
    c.SharedPasswordAuthenticator.admin_password = os.environ["HUB_ADMIN_PASSWORD"]  # another, 32+ characters
else:
    c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = USERS | ADMINS
c.Authenticator.admin_users = ADMINS
