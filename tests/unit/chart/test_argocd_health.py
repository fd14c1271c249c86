"""charts/modeldeploy/argocd/health.lua, run as Argo CD runs it: Lua 5.1 (Argo CD embeds gopher-lua, a
Lua 5.1), a global ``obj`` holding the live object, no io/os, and the script's return value
``{status=..., message=...}`` is the health. Judged on statuses the e2e and integration tests produced
(recorded_statuses.py) and on variants of them that say what one rule is for."""

from __future__ import annotations

import copy
from typing import Any

import lupa.lua51 as lua51
import pytest
from chart_render import CHART
from recorded_statuses import CASES, fixture_names, recorded

SCRIPT = CHART / "argocd" / "health.lua"
ARGOCD_HEALTH = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}


def argocd_health(obj: dict[str, Any], script: str | None = None) -> dict[str, str]:
    """The script's verdict on ``obj``, in a fresh Lua 5.1 state with Argo CD's libraries only."""
    lua = lua51.LuaRuntime(register_eval=False, register_builtins=False, unpack_returned_tuples=False)
    g = lua.globals()
    for name in ("io", "os", "debug", "dofile", "loadfile", "require", "package", "python"):
        g[name] = None
    g.obj = lua.table_from(obj, recursive=True)
    out = lua.execute(script if script is not None else SCRIPT.read_text())
    assert lua51.lua_type(out) == "table", f"the script returned {out!r}, not a table"
    verdict = dict(out.items())
    assert set(verdict) == {"status", "message"}, verdict
    assert verdict["status"] in ARGOCD_HEALTH
    return verdict


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_status_gets_its_argocd_health(name: str) -> None:
    want = CASES[name]
    got = argocd_health(recorded(name))
    assert got["status"] == want.argocd, got["message"]
    for text in want.says:
        assert text in got["message"], f"{text!r} not in {got['message']!r}"


def test_every_fixture_is_judged_and_every_health_is_covered() -> None:
    assert sorted(CASES) == fixture_names()
    assert {c.argocd for c in CASES.values()} == {"Healthy", "Progressing", "Degraded", "Suspended"}


# ---------------------------------------------------------------------------------------------- rules


def lagging(name: str) -> dict[str, Any]:
    """A recorded object whose spec has moved on one generation past what its status describes."""
    obj = copy.deepcopy(recorded(name))
    obj["metadata"]["generation"] = obj["status"]["observedGeneration"] + 1
    return obj


def test_a_healthy_status_of_an_older_generation_is_progressing_never_healthy() -> None:
    obj = lagging(healthy())
    got = argocd_health(obj)
    assert got["status"] == "Progressing"
    gen = obj["metadata"]["generation"]
    assert f"observe generation {gen} (status is of generation {gen - 1})" in got["message"]


def test_a_degraded_condition_written_for_the_current_generation_is_degraded_though_status_lags() -> None:
    """A reconcile that fails (ReconcileError) or a status the operator cannot read (InvalidStatus)
    writes Degraded for the generation it saw and leaves observedGeneration where it was."""
    obj = lagging(healthy())
    gen = obj["metadata"]["generation"]
    for c in obj["status"]["conditions"]:
        if c["type"] == "Degraded":
            c.update(status="True", reason="InvalidStatus", message="status.step: bad")
            c["observedGeneration"] = gen
    assert argocd_health(obj) == {"status": "Degraded", "message": "InvalidStatus: status.step: bad"}


def test_only_status_decides_not_conditions_a_mode_never_sets() -> None:
    """kserve#3973: a script that waits for a condition some deployments never get (here ModelAvailable,
    written for models from storage only, and FallbackActive, with spec.fallback only) never says
    Healthy for them."""
    obj = recorded(healthy())
    types = {c["type"] for c in obj["status"]["conditions"]}
    assert not types & {"ModelAvailable", "FallbackActive"}
    assert argocd_health(obj)["status"] == "Healthy"


def test_without_a_phase_the_conditions_decide() -> None:
    """An operator newer than the script may write a phase it does not know: the conditions still tell."""
    for name, want in CASES.items():
        obj = copy.deepcopy(recorded(name))
        if "status" not in obj or obj["metadata"]["generation"] != obj["status"].get("observedGeneration"):
            continue
        obj["status"]["phase"] = "SomethingNew"
        assert argocd_health(obj)["status"] == want.argocd, name


def healthy() -> str:
    return next(n for n, c in sorted(CASES.items()) if c.argocd == "Healthy")
