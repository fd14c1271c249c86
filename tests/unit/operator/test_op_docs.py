"""Claims of docs/operator.md and docs/capacity.md that a test can check, checked against the code."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from modeldeploy.api_base import URI_PATTERN
from modeldeploy.api_status import Phase

REPO = Path(__file__).resolve().parents[3]
OPERATOR_MD = (REPO / "docs" / "operator.md").read_text()


def test_the_count_of_bad_manifests_is_the_number_of_files() -> None:
    files = sorted((REPO / "tests" / "integration" / "operator" / "invalid").glob("*.yaml"))
    counts = {int(n) for n in re.findall(r"(\d+) bad manifests", OPERATOR_MD)}
    assert counts == {len(files)}, (counts, len(files))


def test_the_phases_listed_are_the_apis() -> None:
    (listed,) = re.findall(r"`phase` \(([A-Za-z, ]+)\)", OPERATOR_MD)
    assert [p.strip() for p in listed.split(",")] == list(typing.get_args(Phase))


def test_the_uri_schemes_listed_are_the_apis() -> None:
    (row,) = [line for line in OPERATOR_MD.splitlines() if line.startswith("| `model.uri` is")]
    listed = set(re.findall(r"`([a-z0-9()]+)://`", row))
    assert URI_PATTERN.startswith("^(") and URI_PATTERN.endswith(")://.+$"), URI_PATTERN
    schemes = set(URI_PATTERN[2 : -len(")://.+$")].split("|"))
    assert {s.replace("(s)", "s?") for s in listed} == schemes


def test_the_analysis_prometheus_field_is_spelled_as_the_api_spells_it() -> None:
    for doc in ("operator.md", "capacity.md", "troubleshooting.md"):
        text = (REPO / "docs" / doc).read_text()
        assert "analysis.prometheusUrl" not in text, doc
    assert "analysis.prometheusUrl" not in (REPO / "crds" / "modeldeployment.yaml").read_text()


def test_every_operator_flag_is_in_the_settings_table(capsys: pytest.CaptureFixture[str]) -> None:
    from modeldeploy.settings import load_settings

    with pytest.raises(SystemExit):
        load_settings(["--help"], {})
    flags = set(re.findall(r"(--[a-z][a-z-]+)", capsys.readouterr().out)) - {"--help"}
    table = "\n".join(line for line in OPERATOR_MD.splitlines() if line.startswith("| `-"))
    documented = set(re.findall(r"(--[a-z][a-z-]+)", table))
    assert flags - documented == set(), "flags missing from docs/operator.md's settings table"
    assert documented - flags == set(), "the settings table names flags the operator does not have"


def test_each_settings_row_names_the_variable_of_its_flag() -> None:
    from modeldeploy.settings import Settings, env_name, flag_name

    rows = {}
    for line in OPERATOR_MD.splitlines():
        if line.startswith("| `-"):
            flag_cell, env_cell = line.split("|")[1:3]
            rows[re.findall(r"(--[a-z][a-z-]+)", flag_cell)[0]] = set(
                re.findall(r"MODELDEPLOY_[A-Z_]+", env_cell)
            )
    for setting in Settings.model_fields:
        assert rows[flag_name(setting)] == {env_name(setting)}, setting


def test_the_package_docstring_names_every_module() -> None:
    import modeldeploy

    modules = {p.stem for p in Path(modeldeploy.__file__).parent.glob("*.py")} - {"__init__", "__main__"}
    named = set(re.findall(r":mod:`\.([a-z_]+)`", modeldeploy.__doc__ or ""))
    assert modules - named == set(), "modules missing from modeldeploy's package docstring"
    assert named - modules == set()


def test_the_readme_example_is_a_modeldeployment_the_models_accept():
    import yaml
    from modeldeploy.api import ModelDeployment

    text = (REPO / "README.md").read_text()
    block = text[text.index("```yaml") + len("```yaml") : text.index("```", text.index("```yaml") + 7)]
    doc = yaml.safe_load(block)
    doc.setdefault("metadata", {}).setdefault("namespace", "default")
    md = ModelDeployment.model_validate(doc)
    ro = md.spec.rollout
    assert ro.analysis.judge is not None and ro.gates is not None and ro.notifications
