"""Which pods the process node agent runs, and with what command."""

from __future__ import annotations

import sys

import pytest
from localcluster import images


@pytest.mark.parametrize(
    ("image", "repo"),
    [
        ("modeldeploy/modelserver:dev", "modeldeploy/modelserver"),
        ("docker.io/modeldeploy/modelserver:1.2", "modeldeploy/modelserver"),
        ("modeldeploy/operator@sha256:abc", "modeldeploy/operator"),
        ("registry:5000/team/app:v1", "registry:5000/team/app"),
        ("nginx", "nginx"),
    ],
)
def test_repository_of_strips_tag_digest_and_docker_hub_prefix(image: str, repo: str) -> None:
    assert images.repository_of(image) == repo


def test_entrypoint_uses_local_python_and_appends_args() -> None:
    argv = images.command_for(
        {"name": "c", "image": "modeldeploy/modelserver:dev", "args": ["--port", "9000"]}
    )
    assert argv == [sys.executable, "-m", "modelserver", "--port", "9000"]


def test_container_command_overrides_entrypoint() -> None:
    c = {"name": "c", "image": "modeldeploy/testapp:dev", "command": ["python3", "-m", "x"], "args": ["a"]}
    assert images.command_for(c) == [sys.executable, "-m", "x", "a"]


def test_foreign_images_are_not_run() -> None:
    assert images.command_for({"name": "c", "image": "nginx:1.27"}) is None
    pod = {"spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}
    assert not images.is_agent_pod(pod)
    pod["spec"]["containers"].append({"name": "m", "image": "modeldeploy/modelserver:dev"})
    assert images.is_agent_pod(pod)
