"""``kubectl modeldeploy dashboard`` end to end: the plugin's own process (the console script, with the
test cluster's kubeconfig) serves the page on 127.0.0.1, headless Chromium (Debian's ``chromium``,
tests/e2e/headless_chromium.py) shows it, and a real rollout happens underneath: the operator, noop
servers, the real Prometheus and clients through kube-proxy.

What is asserted is what the page shows, read from its DOM while the rollout runs: the canary step (the
revision in the canary role, step 1/3 at 25 %) while the cluster is at that step, a failed analysis
window, then the rollback -- history ``RolledBack`` with the failing measurement, its chart -- within a
few seconds of the status saying so. The page's lag behind the status is measured and printed.

The screenshot of the rolled-back page is written to ``$DASHBOARD_SCREENSHOT`` when set (docs/dashboard.png
was taken so), else under the test's tmp_path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localcluster.testing import Kube, wait_for
from modeldeploy.dashboard import make_server

from .canary_support import LoadGenerator, md_status, noop_md, stable_on
from .headless_chromium import Chromium

NAME = "shown"
GOOD = "noop://?delay_ms=2"
ERRORING = "noop://?delay_ms=2&fail_rate=0.2"
#: two failed windows before the rollback (so the page can show one while the canary still runs), and
#: the statistical judge next to the fixed thresholds (its charts: canary vs stable medians)
ANALYSIS = {"failureLimit": 2, "judge": {"sampleInterval": "2s", "minSamples": 6, "maxIncrease": 0.25}}
#: the page polls every 1.5 s and its server keeps an answer 0.5 s: a change shows within a few seconds
MAX_LAG_S = 6.0

#: what the page shows of one ModelDeployment, read from its DOM (the data-* attributes it carries)
READ_PAGE = """
((key) => {
  const card = [...document.querySelectorAll("section.md")].find((e) => e.dataset.md === key);
  if (!card) return null;
  const f = (n) => { const e = card.querySelector(`[data-field="${n}"]`); return e ? e.textContent : null; };
  const rows = (sel) => [...card.querySelectorAll(sel)];
  return {
    phase: f("phase"), step: f("step"), canary: f("canary"), weight: f("weight"),
    achieved: f("achieved"), stable: f("stable"), analysisRevision: f("analysis-revision"),
    revisions: rows("tr.revision").map((r) =>
      ({ revision: r.dataset.revision, role: r.dataset.role,
         cells: [...r.cells].map((c) => c.textContent) })),
    windows: rows("tr.window").map((r) => ({ verdict: r.dataset.verdict, text: r.textContent })),
    charts: rows("figure[data-metric]").map((e) => ({ metric: e.dataset.metric, kind: e.dataset.kind,
      points: [...e.querySelectorAll("circle.point")].map((c) => c.dataset.verdict) })),
    history: rows("tr.history").map((r) =>
      ({ revision: r.dataset.revision, outcome: r.dataset.outcome, text: r.textContent })),
    error: document.getElementById("error").hidden ? null : document.getElementById("error").textContent,
  };
})(%s)
"""


def deploy(kube: Kube, ns: str, version: str, uri: str) -> None:
    md = noop_md(NAME, version, uri, steps=[25, 50, 100], interval="14s", bakeTime="10s", analysis=ANALYSIS)
    kube.apply(md, ns)


@contextmanager
def dashboard(kube: Kube, *args: str) -> Iterator[str]:
    """``kubectl-modeldeploy dashboard --port 0 ARGS`` as a user runs it; yields its URL."""
    exe = Path(sys.executable).parent / "kubectl-modeldeploy"
    proc = subprocess.Popen(
        [str(exe), "dashboard", "--port", "0", *args],
        env=kube.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        if "http://127.0.0.1:" not in line:
            proc.kill()
            raise AssertionError(f"the dashboard did not start: {line!r} {proc.stderr.read()}")
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def page_of(browser: Chromium, ns: str) -> dict[str, Any] | None:
    value = browser.evaluate(READ_PAGE % json.dumps(f"{ns}/{NAME}"))
    return value if isinstance(value, dict) else None


class Both:
    """Polls the status and the page side by side: when each first showed a state."""

    def __init__(self, kube: Kube, browser: Chromium, ns: str) -> None:
        self.kube, self.browser, self.ns = kube, browser, ns

    def until(
        self,
        in_status: Callable[[dict[str, Any]], bool],
        on_page: Callable[[dict[str, Any]], bool],
        timeout: float,
        what: str,
    ) -> tuple[dict[str, Any], dict[str, Any], float]:
        """Wait until the page shows ``what``; returns the status and the page then, and how long after
        the status first said it the page did (negative: the status had moved on already)."""
        status_at: float | None = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = md_status(self.kube, self.ns, NAME)
            if status_at is None and in_status(st):
                status_at = time.monotonic()
            page = page_of(self.browser, self.ns)
            if page is not None and on_page(page):
                shown = time.monotonic()
                return st, page, shown - (status_at if status_at is not None else shown)
            time.sleep(0.2)
        raise AssertionError(
            f"the page did not show {what} in {timeout:.0f}s; last: {page_of(self.browser, self.ns)}"
        )


def history_of(st: dict[str, Any], revision: str, outcome: str) -> dict[str, Any] | None:
    return next(
        (h for h in st.get("history", []) if h["revision"] == revision and h["outcome"] == outcome), None
    )


def test_the_dashboard_shows_the_canary_step_then_the_rollback_as_they_happen(
    kube: Kube, operator: Any, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    deploy(kube, ns, "1", GOOD)
    v1 = stable_on(kube, ns, "1", name=NAME, timeout=150)
    lags: dict[str, float] = {}
    with dashboard(kube, "-n", ns) as url, Chromium(tmp_path / "chromium") as browser:
        browser.open(url)
        both = Both(kube, browser, ns)
        _, page, _ = both.until(
            lambda st: True,
            lambda p: p["phase"] == "Healthy" and p["stable"] == v1,
            30,
            "v1 healthy",
        )
        assert page["step"] == "no rollout in progress" and page["error"] is None, page
        load = LoadGenerator(kube, ns, NAME, workers=2, pause=0.03).wait_serving().start()
        try:
            deploy(kube, ns, "2", ERRORING)
            v2 = wait_for(
                lambda: (r := md_status(kube, ns, NAME).get("revision")) != v1 and r,
                timeout=30,
                what="v2 in status",
            )

            # 1. the canary step, while the cluster is at it
            st, page, lags["canary_step"] = both.until(
                lambda st: st.get("canaryRevision") == v2 and (st.get("achievedCanaryWeight") or 0) > 0,
                lambda p: (
                    p["canary"] == v2 and p["step"] == "step 1/3 at 25 %" and p["achieved"] not in ("-", "0")
                ),
                90,
                "v2 as the canary at step 1/3",
            )
            assert st.get("canaryRevision") == v2 and history_of(st, v2, "RolledBack") is None, st
            roles = {r["revision"]: r for r in page["revisions"]}
            assert roles[v2]["role"] == "canary" and roles[v1]["role"] == "stable", roles
            assert page["phase"] == "Progressing" and page["weight"] == "25", page
            # one pod per revision (replicas 1): the achieved weight is the pods' share, as in the status
            assert page["achieved"] == str(st["achievedCanaryWeight"]), (page, st)
            browser.screenshot(tmp_path / "canary.png")

            # 2. a failed window of the canary, while it still is the canary (failureLimit 2)
            st, page, lags["failed_window"] = both.until(
                lambda st: any(
                    m.get("verdict") == "Fail" and m.get("revision") == v2
                    for m in (st.get("analysis") or {}).get("measurements", [])
                ),
                lambda p: p["analysisRevision"] == v2 and any(w["verdict"] == "Fail" for w in p["windows"]),
                90,
                "a failed analysis window of v2",
            )
            assert page["canary"] == v2, "the failed window was first shown after the rollback"

            # 3. the rollback
            st, page, lags["rolled_back"] = both.until(
                lambda st: history_of(st, v2, "RolledBack") is not None,
                lambda p: any(h["revision"] == v2 and h["outcome"] == "RolledBack" for h in p["history"]),
                90,
                "v2 RolledBack in the history",
            )
            shot = Path(os.environ.get("DASHBOARD_SCREENSHOT") or tmp_path / "rolled-back.png")
            browser.screenshot(shot)
        finally:
            load.stop()
    print(f"page lag behind the status (s): { {k: round(v, 2) for k, v in lags.items()} }; screenshot {shot}")
    rolled_back = history_of(md_status(kube, ns, NAME), v2, "RolledBack")
    assert rolled_back is not None
    failing = rolled_back["measurement"]
    row = next(h for h in page["history"] if h["revision"] == v2 and h["outcome"] == "RolledBack")
    assert failing["metric"] in row["text"] and "Fail" in row["text"], (row, failing)
    assert page["stable"] == v1 and page["canary"] == "-" and page["step"] == "no rollout in progress", page
    assert page["phase"] == "Degraded", page
    charts = {c["metric"]: c for c in page["charts"]}
    assert "Fail" in charts[failing["metric"]]["points"], charts
    assert charts["judge-error-rate"]["kind"] == "judge", charts
    assert sum(w["verdict"] == "Fail" for w in page["windows"]) == 2, page["windows"]
    # shown as it happened: each state on the page within a few seconds of the status
    assert all(lag <= MAX_LAG_S for lag in lags.values()), lags


def test_strings_from_the_cluster_are_shown_as_text_never_as_markup(tmp_path: Path) -> None:
    """A condition message and a history reason that are HTML reach the page as text: no element is
    made of them, no script of theirs runs (no cluster needed: the dashboard's server over a fixed list)."""
    markup = "<img src=x onerror=\"document.title='pwned'\"><b>bold</b>"
    md = {
        "metadata": {"namespace": "demo", "name": NAME, "generation": 1},
        "spec": {"model": {"name": "echo", "version": "1"}},
        "status": {
            "observedGeneration": 1,
            "phase": "Degraded",
            "stableRevision": "a1",
            "conditions": [
                {
                    "type": "Degraded",
                    "status": "True",
                    "reason": "RolledBack",
                    "message": markup,
                    "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ],
            "history": [
                {"revision": "b2", "outcome": "RolledBack", "time": "2025-01-01T00:00:00Z", "reason": markup}
            ],
        },
    }
    server = make_server(lambda: [md], None, 0)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        with Chromium(tmp_path / "chromium") as browser:
            browser.open(f"http://127.0.0.1:{server.server_port}/")
            wait_for(lambda: page_of(browser, "demo"), timeout=20, what="the page")
            shown = browser.evaluate(
                "({ imgs: document.querySelectorAll('img, b').length, title: document.title,"
                "   text: document.getElementById('app').textContent })"
            )
    finally:
        server.shutdown()
        server.server_close()
    assert shown["imgs"] == 0 and shown["title"] == "ModelDeploy dashboard", shown
    assert shown["text"].count(markup) == 2, shown["text"]
