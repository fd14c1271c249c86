"""tools/e2e-kind.sh without Docker: argument handling, the prerequisite checks, and the whole flow against
stub commands that record how they were called (no cluster, no network)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from chart_render import REPO

SCRIPT = REPO / "tools" / "e2e-kind.sh"
TOOLS = ("docker", "kind", "nvidia-ctk", "helm", "kubectl")
# what the script itself needs from the system, besides the tools it checks for
BASICS = ("bash", "env", "grep", "mkdir", "sleep", "cat")


def sandbox_path(tmp_path: Path, stubs: dict[str, str]) -> str:
    """A PATH holding only the basics (symlinked) and the given stub scripts."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name in BASICS:
        real = shutil.which(name)
        assert real, name
        (bindir / name).symlink_to(real)
    for name, body in stubs.items():
        p = bindir / name
        p.write_text("#!/bin/bash\n" + body)
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(bindir)


def run(tmp_path: Path, *args: str, stubs: dict[str, str] | None = None, env: dict[str, str] | None = None):
    path = sandbox_path(tmp_path, stubs or {})
    return subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": path,
            "HOME": str(tmp_path),
            "E2E_KIND_STATE_DIR": str(tmp_path / "state"),
            **(env or {}),
        },
        cwd=tmp_path,
    )


def recorder(name: str, log: Path, out: str = "") -> str:
    """A stub that appends its argv (and the e2e env) to ``log`` and prints ``out``."""
    return (
        f'echo "{name} $* | E2E_KUBECONFIG=${{E2E_KUBECONFIG:-}} KUBECONFIG=${{KUBECONFIG:-}}" >> {log}\n'
        f"{out}\n"
    )


def test_help_exits_zero_with_usage(tmp_path: Path) -> None:
    res = run(tmp_path, "--help")
    assert res.returncode == 0
    assert "usage: tools/e2e-kind.sh" in res.stdout and "--check" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown option: --bogus"),
        (["--name"], "--name needs a value"),
        (["--name", "Not_Valid"], "invalid cluster name"),
    ],
)
def test_bad_arguments_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    res = run(tmp_path, *args)
    assert res.returncode == 2
    assert message in res.stderr


def test_every_missing_prerequisite_is_named(tmp_path: Path) -> None:
    res = run(tmp_path, "--check")
    assert res.returncode == 3
    assert "missing prerequisites: docker kind nvidia-ctk helm kubectl" in res.stderr
    for tool in TOOLS:
        assert f"  {tool}" in res.stderr  # one line with a hint per missing tool
    assert "NVIDIA Container Toolkit" in res.stderr


def test_only_the_missing_ones_are_named(tmp_path: Path) -> None:
    res = run(tmp_path, "--check", stubs={"docker": "exit 0", "kind": "exit 0", "kubectl": "exit 0"})
    assert res.returncode == 3
    assert "missing prerequisites: nvidia-ctk helm" in res.stderr
    assert "  docker" not in res.stderr and "  kind " not in res.stderr


def test_a_docker_without_daemon_is_reported(tmp_path: Path) -> None:
    stubs = {t: "exit 0" for t in TOOLS} | {"docker": '[ "$1" = info ] && exit 1; exit 0'}
    res = run(tmp_path, "--check", stubs=stubs)
    assert res.returncode == 3
    assert "daemon does not answer" in res.stderr


def test_check_passes_with_everything_present(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/bash\nexit 0\n")
    python.chmod(0o755)
    res = run(tmp_path, "--check", stubs={t: "exit 0" for t in TOOLS}, env={"PYTHON": str(python)})
    assert res.returncode == 0, res.stderr
    assert "prerequisites present" in res.stderr


def test_full_flow_against_stubs(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    stubs = {
        "docker": recorder("docker", log),
        "nvidia-ctk": recorder("nvidia-ctk", log),
        "helm": recorder("helm", log),
        "kind": recorder("kind", log, 'if [ "$1" = get ]; then echo other-cluster; fi'),
        # the GPU node, then its allocatable GPUs (the device plugin's work)
        "kubectl": recorder(
            "kubectl",
            log,
            'case "$*" in *metadata.name*) echo md-e2e-worker;; *allocatable*) echo "1 ";; esac',
        ),
        "python": recorder("python", log),
    }
    res = run(
        tmp_path,
        "--name",
        "md-e2e",
        "--",
        "-k",
        "scenario1",
        stubs=stubs,
        env={"PYTHON": str(tmp_path / "bin" / "python"), "GPU_WAIT_S": "5"},
    )
    assert res.returncode == 0, res.stderr
    calls = log.read_text().splitlines()
    kubeconfig = str(tmp_path / "state" / "kubeconfig")

    def index(fragment: str) -> int:
        hits = [i for i, c in enumerate(calls) if fragment in c]
        assert hits, f"no call with {fragment!r} in:\n" + "\n".join(calls)
        return hits[0]

    order = [
        index(
            f"kind create cluster --name md-e2e --config {REPO}/kind-config.yaml --kubeconfig {kubeconfig}"
        ),
        index("docker exec md-e2e-worker bash -c"),
        index("helm upgrade --install nvidia-device-plugin nvdp/nvidia-device-plugin --version 0.17.1"),
        index("status.allocatable.nvidia"),
        index(f"docker build -f {REPO}/operator/Dockerfile -t modeldeploy/operator:dev {REPO}"),
        index(f"docker build -f {REPO}/serving_image/Dockerfile -t modeldeploy/modelserver:dev {REPO}"),
        index("kind load docker-image modeldeploy/operator:dev --name md-e2e"),
        index("kind load docker-image modeldeploy/modelserver:dev --name md-e2e"),
        index(f"kubectl apply -f {REPO}/deploy/prometheus/"),
        index(f"kubectl apply --server-side --force-conflicts -f {REPO}/charts/modeldeploy/crds/"),
        index(f"helm upgrade --install modeldeploy {REPO}/charts/modeldeploy --namespace modeldeploy-system"),
        index("python -m pytest -p no:cacheprovider tests/e2e -k scenario1"),
    ]
    assert order == sorted(order), calls
    # the tests make namespaces of their own: the chart (namespaced by default) runs in cluster mode
    assert "--set rbac.clusterWide=true" in calls[order[-2]]
    suite = calls[order[-1]]
    assert f"E2E_KUBECONFIG={kubeconfig}" in suite
    assert all(f"KUBECONFIG={kubeconfig}" in c for c in calls if c.startswith(("kubectl", "helm")))
    assert not any("kind delete" in c for c in calls)  # kept unless --delete


def test_skip_build_and_delete(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    stubs = {t: recorder(t, log) for t in ("docker", "nvidia-ctk", "helm", "python")}
    stubs["kind"] = recorder("kind", log, '[ "$1" = get ] && echo md-e2e; exit 0')
    stubs["kubectl"] = recorder(
        "kubectl", log, 'case "$*" in *metadata.name*) echo w;; *allocatable*) echo 2;; esac'
    )
    res = run(
        tmp_path,
        "--name=md-e2e",
        "--skip-build",
        "--delete",
        stubs=stubs,
        env={"PYTHON": str(tmp_path / "bin" / "python")},
    )
    assert res.returncode == 0, res.stderr
    calls = log.read_text()
    assert "kind create cluster" not in calls and "kind export kubeconfig --name md-e2e" in calls
    assert "docker build" not in calls and "kind load docker-image modeldeploy/operator:dev" in calls
    assert "kind delete cluster --name md-e2e" in calls


def test_no_gpu_allocatable_fails_with_a_hint(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    stubs = {t: recorder(t, log) for t in ("docker", "nvidia-ctk", "helm", "kind", "python")}
    stubs["kubectl"] = recorder(
        "kubectl", log, 'case "$*" in *metadata.name*) echo w;; *allocatable*) echo " ";; esac'
    )
    res = run(tmp_path, stubs=stubs, env={"PYTHON": str(tmp_path / "bin" / "python"), "GPU_WAIT_S": "0"})
    assert res.returncode != 0
    assert "no nvidia.com/gpu allocatable" in res.stderr
    assert "docker build" not in log.read_text()


def test_kind_config_wires_the_gpu_worker_like_nvkind() -> None:
    cfg = yaml.safe_load((REPO / "kind-config.yaml").read_text())
    assert cfg["kind"] == "Cluster" and cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in cfg["nodes"]]
    assert roles.count("control-plane") == 1
    gpu = [n for n in cfg["nodes"] if (n.get("labels") or {}).get("nvidia.com/gpu.present") == "true"]
    assert len(gpu) == 1 and gpu[0]["role"] == "worker"
    assert {"hostPath": "/dev/null", "containerPath": "/var/run/nvidia-container-devices/all"} in gpu[0][
        "extraMounts"
    ]


def test_script_is_executable() -> None:
    assert os.access(SCRIPT, os.X_OK)
