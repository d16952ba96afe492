"""The lab's stand-in for a public registry such as nvcr.io (issue [24]): this machine
reaches no public registry, so a lab with a container image lists `nvcr.io` among the
site's public registries (tacc_image_upstreams) with this as its upstream, and
`tacc-lab public-registry start` runs it on the head node:

- a real registry (Debian's docker-registry, CNCF Distribution) on PORT, with Docker's
  token authentication like nvcr.io's: its token server (registry_token_server.py) on
  TOKEN_PORT gives tokens to the account USER only, whose password the lab keeps in its
  state directory and gives the cluster's cache as its upstream account;
- one image in it, IMAGE_PATH:TAG: the lab's seeded image with a label (LABEL) of its
  own, so its digest differs from the seeded copy's.

The cluster's cache of it (roles/image_registry, docker-registry-cache@CACHE_PORT on the
head node) asks it for its token realm when it starts, and starts again every few
seconds until it answers, so `start` may come after site.yml, which installs
docker-registry. `stop` stops it: what the cache fetched must then be served without it.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
from pathlib import Path

from tacc_lab.config import LabConfig
from tacc_lab.errors import LabError
from tacc_lab.files import ensure_secret, write_private
from tacc_lab.nodes import NodePaths, ssh_command_argv
from tacc_lab.state import NodeRecord

REGISTRY = "nvcr.io"  # the name tasks write; the nodes' pulls of it go to the cache
PORT = 5080
TOKEN_PORT = 5081
CACHE_PORT = 5010
USER = "lab"
IMAGE_PATH = "tacc-lab/debian"
ISSUER = "tacc-lab-token"
LABEL = "org.opencontainers.image.vendor=tacc-lab-public-registry"
SERVICE = "tacc-lab-public-registry"
UNIT = "tacc-lab-public-registry"
TOKEN_UNIT = "tacc-lab-public-registry-token"  # noqa: S105 (a unit's name)
NODE_DIR = "/var/lib/tacc-lab-public-registry"  # on the head node, root's only
TOKEN_SERVER = Path(__file__).with_name("registry_token_server.py")
# Debian's packages the stand-in needs on the head node: openssl (the token server's
# key and signatures) and umoci (to label its image).
TOKEN_PACKAGES = ("openssl", "umoci")


def password(cfg: LabConfig) -> str:
    """The upstream account's password: made once, kept in the lab's state (0600)."""
    return ensure_secret(cfg.state_dir / "secrets" / "public-registry-password")


def upstream_vars(head_address: str) -> dict:
    """Inventory variables (group all): the site's public registries, this one alone."""
    return {
        "tacc_image_upstreams": [
            {
                "registry": REGISTRY,
                "url": f"http://{head_address}:{PORT}",
                "insecure": True,  # plain HTTP on the lab's bridge
                "port": CACHE_PORT,
            }
        ]
    }


def account_vars(secret: str) -> dict:
    """Host variables of the registry host: the cache's upstream account."""
    account = {"username": USER, "password": secret}
    return {"image_registry_upstream_credentials": {REGISTRY: account}}


def registry_config(address: str) -> str:
    """The stand-in registry's configuration (YAML): token auth, deletes off."""
    config = {
        "version": 0.1,
        "log": {"fields": {"service": UNIT}},
        "storage": {
            "filesystem": {"rootdirectory": f"{NODE_DIR}/data"},
            "delete": {"enabled": False},
        },
        "http": {"addr": f"{address}:{PORT}"},
        "auth": {
            "token": {
                "realm": f"http://{address}:{TOKEN_PORT}/token",
                "service": SERVICE,
                "issuer": ISSUER,
                "rootcertbundle": f"{NODE_DIR}/token/cert.pem",
            }
        },
    }
    return json.dumps(config, indent=2) + "\n"


def auth_file(address: str, secret: str) -> str:
    """skopeo's auth file for pushing the image in (containers-auth.json(5))."""
    token = base64.b64encode(f"{USER}:{secret}".encode()).decode()
    return json.dumps({"auths": {f"{address}:{PORT}": {"auth": token}}}) + "\n"


def start_script(address: str, seeded: str, tag: str) -> str:
    """What runs on the head node as root: the token server's packages and key, both
    units (transient: gone at the node's next boot), and the image pushed in."""
    quoted = shlex.quote
    token_argv = shlex.join(
        [
            "python3",
            f"{NODE_DIR}/registry_token_server.py",
            "serve",
            f"{NODE_DIR}/token",
            address,
            str(TOKEN_PORT),
            ISSUER,
            SERVICE,
            f"{NODE_DIR}/users.json",
        ]
    )
    registry_url = f"http://{address}:{PORT}/v2/"
    token_url = f"http://{address}:{TOKEN_PORT}/token"
    source = f"docker://{seeded}"
    target = f"docker://{address}:{PORT}/{IMAGE_PATH}:{tag}"
    return f"""set -eu
missing=""
for package in {" ".join(TOKEN_PACKAGES)}; do
  dpkg-query -W -f '${{Status}}' "$package" 2>/dev/null | grep -q 'ok installed' \
    || missing="$missing $package"
done
if [ -n "$missing" ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
python3 {NODE_DIR}/registry_token_server.py init {NODE_DIR}/token
for unit in {TOKEN_UNIT} {UNIT}; do
  systemctl stop "$unit" 2>/dev/null || true
  systemctl reset-failed "$unit" 2>/dev/null || true
done
systemd-run --quiet --unit {TOKEN_UNIT} {token_argv}
systemd-run --quiet --unit {UNIT} docker-registry serve {NODE_DIR}/config.yml
answers() {{
  python3 -c 'import sys, urllib.request, urllib.error
opener = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
try: opener.open(sys.argv[1], timeout=2)
except urllib.error.HTTPError: pass' "$1" 2>/dev/null
}}
for url in {quoted(registry_url)} {quoted(token_url)}; do
  for i in $(seq 100); do answers "$url" && break; sleep 0.2; done
  if ! answers "$url"; then
    journalctl -q --no-pager -n 20 -u {TOKEN_UNIT} -u {UNIT} >&2
    echo "nothing answers at $url" >&2
    exit 1
  fi
done
# The seeded image with a label of its own: another digest than the cluster registry's
# copy, so a job of it pulls it anew (through the cache) even where that one is cached.
rm -rf {NODE_DIR}/layout
skopeo copy --quiet --src-tls-verify=false {quoted(source)} oci:{NODE_DIR}/layout:seeded
umoci config --image {NODE_DIR}/layout:seeded --tag public --config.label {LABEL}
skopeo copy --quiet --dest-tls-verify=false --dest-authfile {NODE_DIR}/auth.json \\
  oci:{NODE_DIR}/layout:public {quoted(target)}
echo "{REGISTRY}/{IMAGE_PATH}:{tag} served from {address}:{PORT}"
"""


def node_run(cfg: LabConfig, node: NodeRecord, script: str) -> str:
    """`script` as root on `node` (sh), its output; LabError on failure."""
    argv = ssh_command_argv(cfg, node.address, ["sh", "-c", shlex.quote(script)], tty=False)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
        raise LabError(f"the public registry on {node.name}: {said}")
    return proc.stdout.strip()


def start(cfg: LabConfig, head: NodeRecord, seeded: str) -> str:
    """Run the stand-in on `head`, holding the lab's seeded image `seeded` (host:port/
    path:tag in the cluster registry) as REGISTRY/IMAGE_PATH:TAG; what it says."""
    tag = seeded.rpartition(":")[2]
    folder = NodePaths(cfg, head.name).rootfs / NODE_DIR.lstrip("/")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    secret = password(cfg)
    (folder / "config.yml").write_text(registry_config(head.address))
    (folder / "registry_token_server.py").write_text(TOKEN_SERVER.read_text())
    write_private(folder / "users.json", json.dumps({USER: secret}) + "\n")
    write_private(folder / "auth.json", auth_file(head.address, secret))
    return node_run(cfg, head, start_script(head.address, seeded, tag))


def stop(cfg: LabConfig, head: NodeRecord) -> None:
    """Stop the stand-in (what the cluster's cache fetched stays in the cache)."""
    node_run(cfg, head, f"systemctl stop {TOKEN_UNIT} {UNIT} 2>/dev/null || true")
