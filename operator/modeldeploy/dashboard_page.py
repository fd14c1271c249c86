"""The dashboard's page (:mod:`modeldeploy.dashboard`): HTML, plain JavaScript and CSS, served from these
strings (no build step, no package data, nothing fetched at run time).

The script polls ``/api/modeldeployments`` and rebuilds the page from the answer with
``document.createElement``/``createElementNS``: every string that comes from the cluster goes in as a text
node or an attribute value (``append(string)``, ``setAttribute``), never through ``innerHTML``. Charts
are inline SVG. Elements carry ``data-*`` attributes (``data-md``, ``data-field``, ``data-revision``,
``data-outcome``, ``data-verdict``, ``data-metric``) that say what they show, for people and for
tests/e2e/test_dashboard.py.
"""

from __future__ import annotations

PAGE_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ModelDeploy dashboard</title>
<link rel="stylesheet" href="/dashboard.css">
<script src="/dashboard.js" defer></script>
</head>
<body>
<header>
  <h1>ModelDeploy</h1>
  <span id="scope"></span>
  <span id="updated">connecting&hellip;</span>
</header>
<div id="error" hidden></div>
<main id="app"></main>
</body>
</html>
"""

PAGE_JS = r"""
"use strict";
(() => {
  const SVG = "http://www.w3.org/2000/svg";
  let pollMs = 1500;
  let polls = 0;

  // ------------------------------------------------------------------ DOM without HTML parsing
  function fill(e, attrs, kids) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined && v !== false) e.setAttribute(k, String(v));
    }
    for (const k of kids.flat()) {
      if (k === null || k === undefined || k === false) continue;
      e.append(k instanceof Node ? k : String(k));  // a string becomes a text node
    }
    return e;
  }
  const h = (tag, attrs, ...kids) => fill(document.createElement(tag), attrs, kids);
  const s = (tag, attrs, ...kids) => fill(document.createElementNS(SVG, tag), attrs, kids);

  // ------------------------------------------------------------------ formatting
  function num(v) {
    if (v === null || v === undefined) return "-";
    if (typeof v !== "number") return String(v);
    if (v !== 0 && Math.abs(v) < 0.001) return v.toExponential(2);
    return String(Number(v.toPrecision(4)));
  }
  const clock = (t) => (typeof t === "string" && t.length >= 19 ? t.slice(11, 19) : "-");
  function ago(t, now) {
    const d = (Date.parse(now) - Date.parse(t)) / 1000;
    if (!isFinite(d)) return "-";
    if (d < 120) return Math.max(0, Math.round(d)) + "s ago";
    if (d < 7200) return Math.round(d / 60) + "m ago";
    return Math.round(d / 3600) + "h ago";
  }
  const verdict = (v, dry) =>
    h("span", { class: "verdict v-" + v, "data-verdict": v }, v + (dry ? " (dry run)" : ""));
  function measurementText(m) {
    let text = m.metric + " " + num(m.value);
    if (m.threshold !== null && m.threshold !== undefined) text += " (threshold " + num(m.threshold) + ")";
    return text;
  }
  function table(headers, rows, rowAttrs) {
    return h("table", {},
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
      h("tbody", {}, rows.map((r, i) =>
        h("tr", rowAttrs ? rowAttrs(i) : {},
          r.map((c) => h("td", {}, c === null || c === undefined ? "-" : c))))));
  }

  // ------------------------------------------------------------------ traffic
  function traffic(md) {
    const w = md.canaryRevision ? (md.canaryWeight || 0) : 0;
    const bar = s("svg", { class: "traffic", viewBox: "0 0 100 6", preserveAspectRatio: "none" },
      s("rect", { class: "stable", x: 0, y: 0, width: 100 - w, height: 6 }),
      s("rect", { class: "canary", x: 100 - w, y: 0, width: w, height: 6 }));
    let step = "no rollout in progress";
    if (md.step) {
      step = "step " + (md.step.index + 1) + "/" + md.step.count + " at " + num(md.step.weight) + " %" +
        (md.step.paused ? " (paused)" : "");
    }
    const weights = md.canaryRevision ? [" weight ",
      h("span", { "data-field": "weight" }, num(md.canaryWeight)), " % (achieved ",
      h("span", { "data-field": "achieved" }, num(md.achievedCanaryWeight)), " %)"] : [];
    return h("div", { class: "weights" },
      bar,
      h("p", {},
        h("span", { "data-field": "step" }, step), " · ",
        "canary ", h("span", { "data-field": "canary" }, md.canaryRevision || "-"), weights, " · stable ",
        h("span", { "data-field": "stable" }, md.stableRevision || "-"),
        md.previousRevision ? " · previous " + md.previousRevision + " (warm)" : ""));
  }

  // ------------------------------------------------------------------ charts
  function chart(c) {
    const W = 360, H = 150, L = 48, R = 10, T = 10, B = 22;
    const pts = c.points;
    const times = pts.map((p) => Date.parse(p.time));
    let t0 = Math.min(...times), t1 = Math.max(...times);
    if (!(t1 > t0)) { t0 -= 1000; t1 += 1000; }
    const vals = pts.flatMap((p) => [p.canary, p.stable, p.threshold]).filter((v) => typeof v === "number");
    const hi = Math.max(0, ...vals) * 1.15 || 1, lo = Math.min(0, ...vals) * 1.15;
    const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
    const y = (v) => T + (H - T - B) * (1 - (v - lo) / (hi - lo));
    const svg = s("svg",
      { class: "chart", viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": c.metric });
    for (const v of [lo, (lo + hi) / 2, hi]) {
      svg.append(s("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }),
        s("text", { class: "axis", x: L - 4, y: y(v) + 3, "text-anchor": "end" }, num(v)));
    }
    svg.append(s("text", { class: "axis", x: L, y: H - 6 }, clock(pts[0].time)),
      s("text", { class: "axis", x: W - R, y: H - 6, "text-anchor": "end" },
        clock(pts[pts.length - 1].time)));
    for (const key of ["threshold", "stable", "canary"]) {
      const xy = pts.map((p, i) => [times[i], p[key]]).filter(([, v]) => typeof v === "number");
      if (xy.length === 0) continue;
      if (xy.length === 1 && key !== "canary") {  // one window: a level across the chart
        svg.append(s("line", { class: "series " + key, x1: L, x2: W - R, y1: y(xy[0][1]), y2: y(xy[0][1]) }));
      } else {
        const line = xy.map(([t, v]) => x(t) + "," + y(v)).join(" ");
        svg.append(s("polyline", { class: "series " + key, points: line }));
      }
    }
    pts.forEach((p, i) => {
      if (typeof p.canary !== "number") return;
      svg.append(s("circle", { class: "point v-" + p.verdict, cx: x(times[i]), cy: y(p.canary), r: 4,
        "data-verdict": p.verdict },
      s("title", {}, clock(p.time) + " canary " + num(p.canary) + " stable " + num(p.stable) +
        " threshold " + num(p.threshold) + " " + p.verdict + (p.dryRun ? " (dry run)" : ""))));
    });
    const last = pts[pts.length - 1];
    const judge = c.kind === "judge";
    const has = (key) => pts.some((p) => typeof p[key] === "number");
    const legend = h("div", { class: "legend" },
      h("span", { class: "key canary" }, judge ? "canary median" : "canary"),
      has("stable") ? h("span", { class: "key stable" }, judge ? "stable median" : "stable") : null,
      has("threshold") ? h("span", { class: "key threshold" }, judge ? "most allowed" : "threshold") : null,
      h("span", {}, "last: ", verdict(last.verdict, last.dryRun)));
    return h("figure", { class: "chart-box", "data-metric": c.metric, "data-kind": c.kind },
      h("figcaption", {}, c.metric + (c.kind === "judge" ? " (statistical judge)" : "")), svg, legend);
  }

  // ------------------------------------------------------------------ one ModelDeployment
  function analysis(a, now) {
    if (!a.revision) return [];
    const rows = a.windows.slice().reverse();
    return [
      h("h3", {}, "Analysis of revision ", h("code", { "data-field": "analysis-revision" }, a.revision)),
      a.pausedReason ? h("p", { class: "warning" }, "paused: " + a.pausedReason) : null,
      rows.length === 0 ? h("p", { class: "quiet" }, "no window judged yet") :
        table(["WINDOW", "VERDICT", "MEASUREMENTS"], rows.map((w) => [
          clock(w.time) + " (" + ago(w.time, now) + ")",
          verdict(w.verdict, false),
          h("ul", { class: "ms" }, w.measurements.map((m) =>
            h("li", { "data-metric": m.metric, title: m.query || "" },
              measurementText(m), " ", verdict(m.verdict, m.dryRun),
              m.judge ? " n=" + m.judge.canarySamples + "/" + m.judge.stableSamples +
                " p=" + num(m.judge.pValue) : "",
              m.error ? " " + m.error : ""))),
        ]), (i) => ({ class: "window", "data-verdict": rows[i].verdict, "data-time": rows[i].time })),
      h("div", { class: "charts" }, a.charts.map(chart)),
    ];
  }

  function card(md, now) {
    const key = md.namespace + "/" + md.name;
    const lag = md.observedGeneration !== md.generation;
    const history = md.history.slice().reverse();
    return h("section", { class: "md", "data-md": key },
      h("div", { class: "head" },
        h("h2", {}, key),
        h("span", { class: "phase p-" + md.phase, "data-field": "phase" }, md.phase || "-"),
        h("span", { class: "quiet" }, "model " + md.model.name + ":" + md.model.version +
          " · ready " + (md.ready || "-") + " · revision " + (md.revision || "-"))),
      lag ? h("p", { class: "warning" }, "status is for generation " + md.observedGeneration +
        ", spec is " + md.generation) : null,
      traffic(md),
      h("h3", {}, "Revisions"),
      table(["REVISION", "ROLE", "VERSION", "DESIRED", "PODS", "READY", "IN TRAFFIC", "UNSCHEDULABLE"],
        md.revisions.map((r) => [r.revision, r.role, r.modelVersion, r.replicas, r.currentReplicas,
          r.readyReplicas, r.inTrafficReplicas, r.unschedulableReplicas]),
        (i) => ({ class: "revision", "data-revision": md.revisions[i].revision,
          "data-role": md.revisions[i].role })),
      h("h3", {}, "Conditions"),
      table(["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"],
        md.conditions.map((c) => [c.type, c.status, c.reason, ago(c.lastTransitionTime, now), c.message]),
        (i) => ({ "data-condition": md.conditions[i].type, "data-status": md.conditions[i].status })),
      analysis(md.analysis, now),
      h("h3", {}, "History"),
      history.length === 0 ? h("p", { class: "quiet" }, "none") :
        table(["TIME", "REVISION", "OUTCOME", "REASON", "MEASUREMENT"],
          history.map((e) => [clock(e.time) + " (" + ago(e.time, now) + ")", e.revision,
            h("span", { class: "outcome o-" + e.outcome }, e.outcome), e.reason,
            e.measurement ? h("span", {}, measurementText(e.measurement), " ",
              verdict(e.measurement.verdict, e.measurement.dryRun)) : "-"]),
          (i) => ({ class: "history", "data-revision": history[i].revision,
            "data-outcome": history[i].outcome })));
  }

  // ------------------------------------------------------------------ polling
  function render(data) {
    document.getElementById("scope").textContent =
      data.namespace ? "namespace " + data.namespace : "all namespaces";
    document.getElementById("updated").textContent = "updated " + clock(data.time) + " UTC";
    const err = document.getElementById("error");
    err.hidden = !data.error;
    err.textContent = data.error ? "cluster: " + data.error : "";
    const app = document.getElementById("app");
    if (data.items.length === 0 && !data.error) {
      app.replaceChildren(h("p", { class: "quiet" }, "No ModelDeployments here."));
    } else {
      app.replaceChildren(...data.items.map((md) => card(md, data.time)));
    }
    document.body.dataset.updated = data.time;
    document.body.dataset.polls = String(++polls);
  }

  async function poll() {
    try {
      const r = await fetch("/api/modeldeployments", { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const data = await r.json();
      pollMs = data.pollMs || pollMs;
      render(data);
    } catch (e) {
      const err = document.getElementById("error");
      err.hidden = false;
      err.textContent = "dashboard server: " + e.message;
    } finally {
      setTimeout(poll, pollMs);
    }
  }
  poll();
})();
"""

PAGE_CSS = """
:root { --canary: #d9480f; --stable: #1c7ed6; --threshold: #495057; --fail: #e03131; --pass: #2f9e44;
        --hold: #f08c00; font-family: system-ui, sans-serif; font-size: 14px; color: #212529; }
body { margin: 0; background: #f1f3f5; }
header { display: flex; gap: 1.5em; align-items: baseline; padding: .6em 1.2em; background: #212529;
         color: #f8f9fa; }
header h1 { font-size: 1.2em; margin: 0; }
#error { background: #ffe3e3; color: #c92a2a; padding: .5em 1.2em; }
main { padding: .8em 1.2em; }
section.md { background: #fff; border-radius: 6px; padding: .8em 1em; margin-bottom: 1em;
             box-shadow: 0 1px 2px rgba(0,0,0,.08); }
.head { display: flex; gap: 1em; align-items: baseline; flex-wrap: wrap; }
.head h2 { font-size: 1.1em; margin: 0; }
h3 { font-size: .95em; margin: 1em 0 .3em; color: #495057; }
.quiet { color: #868e96; }
.warning { color: #e8590c; }
.phase { padding: .1em .6em; border-radius: 1em; background: #dee2e6; font-weight: 600; }
.p-Healthy { background: #d3f9d8; color: #2b8a3e; }
.p-Progressing, .p-Shadowing { background: #fff3bf; color: #e67700; }
.p-Degraded, .p-Failed { background: #ffe3e3; color: #c92a2a; }
.p-Paused { background: #e7f5ff; color: #1971c2; }
.weights p { margin: .3em 0; }
svg.traffic { width: 100%; max-width: 520px; height: 10px; display: block; border-radius: 3px; }
svg.traffic .stable { fill: var(--stable); }
svg.traffic .canary { fill: var(--canary); }
table { border-collapse: collapse; font-size: .92em; }
th { text-align: left; color: #868e96; font-weight: 500; padding: .15em .8em .15em 0; }
td { padding: .15em .8em .15em 0; vertical-align: top; }
ul.ms { margin: 0; padding: 0; list-style: none; }
.verdict { font-weight: 600; }
.v-Pass { color: var(--pass); }
.v-Fail, .v-Error { color: var(--fail); }
.v-NoData, .v-Inconclusive { color: var(--hold); }
.o-RolledBack, .o-FailedBack, .o-Aborted { color: var(--fail); font-weight: 600; }
.o-Promoted, .o-Deployed { color: var(--pass); font-weight: 600; }
.charts { display: flex; flex-wrap: wrap; gap: .8em; }
figure.chart-box { margin: 0; background: #f8f9fa; border-radius: 4px; padding: .4em; }
figcaption { font-weight: 600; font-size: .9em; }
svg.chart { width: 360px; height: 150px; display: block; }
svg.chart .grid { stroke: #dee2e6; stroke-width: 1; }
svg.chart .axis { font-size: 10px; fill: #868e96; }
svg.chart .series { fill: none; stroke-width: 2; }
svg.chart .series.canary { stroke: var(--canary); }
svg.chart .series.stable { stroke: var(--stable); }
svg.chart .series.threshold { stroke: var(--threshold); stroke-dasharray: 5 3; stroke-width: 1.5; }
svg.chart .point { stroke: #fff; stroke-width: 1.5; fill: var(--canary); }
svg.chart .point.v-Fail, svg.chart .point.v-Error { fill: var(--fail); }
svg.chart .point.v-Pass { fill: var(--pass); }
svg.chart .point.v-NoData, svg.chart .point.v-Inconclusive { fill: var(--hold); }
.legend { display: flex; gap: 1em; font-size: .85em; }
.key::before { content: ""; display: inline-block; width: 14px; height: 3px; margin-right: 4px;
               vertical-align: middle; }
.key.canary::before { background: var(--canary); }
.key.stable::before { background: var(--stable); }
.key.threshold::before { background: var(--threshold); }
"""
