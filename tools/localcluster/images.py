"""Which container images the process node agent runs as local processes, and how.

An image of this repository maps to the command its Dockerfile's ENTRYPOINT runs, with the local
virtualenv's Python standing in for the image's ``python``. A test image (``modeldeploy/testapp``) is a
tiny HTTP server used to test the cluster machinery itself.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

from .config import AGENT_IMAGE_PATTERN


@dataclass(frozen=True)
class ImageEntry:
    repository: str  # e.g. "modeldeploy/modelserver"
    entrypoint: tuple[str, ...]  # the image's ENTRYPOINT, with "python" meaning the local interpreter
    host_env: str | None  # env var through which the process is told to bind to the pod IP


IMAGES: tuple[ImageEntry, ...] = (
    ImageEntry("modeldeploy/modelserver", ("python", "-m", "modelserver"), "MODELSERVER_HOST"),
    ImageEntry("modeldeploy/operator", ("python", "-m", "modeldeploy"), "MODELDEPLOY_BIND_HOST"),
    ImageEntry("modeldeploy/testapp", ("python", "-m", "localcluster.testapp"), "TESTAPP_HOST"),
)

_AGENT_IMAGE_RE = re.compile(AGENT_IMAGE_PATTERN)


def repository_of(image: str) -> str:
    """``docker.io/modeldeploy/modelserver:dev`` -> ``modeldeploy/modelserver``."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: name.rfind(":")]
    if name.startswith("docker.io/"):
        name = name[len("docker.io/") :]
    return name


def entry_for(image: str) -> ImageEntry | None:
    repo = repository_of(image)
    return next((e for e in IMAGES if e.repository == repo), None)


def is_agent_pod(pod: dict[str, Any]) -> bool:
    """True when any container's image is one the agent runs (the same rule kwok's stages exclude)."""
    return any(_AGENT_IMAGE_RE.search(c.get("image", "")) for c in pod["spec"].get("containers", []))


def _localise(argv: list[str]) -> list[str]:
    if argv and argv[0] in ("python", "python3", "/usr/bin/python3", "/usr/local/bin/python"):
        return [sys.executable, *argv[1:]]
    return argv


def command_for(container: dict[str, Any]) -> list[str] | None:
    """The local argv for a container, following Kubernetes' command/args over ENTRYPOINT/CMD rules."""
    entry = entry_for(container.get("image", ""))
    if entry is None:
        return None
    command = container.get("command") or list(entry.entrypoint)
    args = container.get("args") or []
    return _localise([*command, *args])
