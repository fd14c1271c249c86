"""``kubectl-modeldeploy``: the kubectl plugin (``kubectl modeldeploy ...`` when on PATH).

    kubectl modeldeploy status NAME [-n NS] [--watch] [--output text|json]
    kubectl modeldeploy promote NAME [--full]   # next step now (in the shadow stage: skip it), or
                                                # straight to 100 % and promoted
    kubectl modeldeploy abort NAME              # roll the canary back now
    kubectl modeldeploy rollback NAME           # fail back to the warm previous revision
    kubectl modeldeploy pause NAME | resume NAME
    kubectl modeldeploy dashboard [-n NS] [--port 8090]  # a live web page on 127.0.0.1 (dashboard.py)
    kubectl modeldeploy notification-key --key-file F -n NS  # a team's webhook signing key (notify.py)

How they are carried out (they survive operator restarts, both are stored in the object):

* ``pause``/``resume`` patch ``spec.rollout.paused`` (a spec field, as declarative as the rest);
* ``promote``/``abort``/``rollback`` write the ``modeldeploy.io/command`` annotation, a JSON object
  naming the state it was issued against (``{"action": "promote", "revision": <canary>, "step": <step>}``,
  ``{"action": "abort", "revision": <canary>}``, ``{"action": "rollback", "revision": <stable>}``). The
  operator acts only if the state still matches, then removes the annotation; a command that no longer
  matches (the rollout moved on) is dropped, so a command is never applied twice.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from . import dashboard, notify
from .kube import MODELDEPLOYMENT, Kube, KubeError
from .rollout_types import COMMAND_ANNOTATION


def _age(ts: str | None, now: datetime) -> str:
    if not ts:
        return "-"
    try:
        t = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return ts
    s = int((now - t).total_seconds())
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _table(rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[("-" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def render_status(md: dict[str, Any], now: datetime | None = None) -> str:
    """A human view of a ModelDeployment's status (pure, for tests and --watch)."""
    now = now or datetime.now(UTC)
    meta, spec, st = md["metadata"], md.get("spec", {}), md.get("status") or {}
    model = spec.get("model", {})
    lines = [
        f"ModelDeployment {meta.get('namespace', 'default')}/{meta['name']}  "
        f"model {model.get('name')}:{model.get('version')}  phase {st.get('phase', '-')}  "
        f"ready {st.get('ready', '-')}",
        f"  revision {st.get('revision', '-')}  stable {st.get('stableRevision', '-')}  "
        f"canary {st.get('canaryRevision') or '-'}  weight {st.get('canaryWeight', '-')}"
        f" (achieved {st.get('achievedCanaryWeight', '-')})  "
        f"step {_step(spec, st)}  previous {st.get('previousRevision') or '-'}"
        + (f" (warm until {st['previousExpiresAt']})" if st.get("previousExpiresAt") else ""),
    ]
    if st.get("shadow"):
        lines.append(_shadow_line(spec, st["shadow"], now))
    if st.get("gate"):
        lines.append(_gate_line(st["gate"], now))
    pending = (meta.get("annotations") or {}).get(COMMAND_ANNOTATION)
    if pending:
        lines.append(f"  pending command: {pending}")
    if st.get("observedGeneration") != meta.get("generation"):
        lines.append(
            f"  (status is for generation {st.get('observedGeneration')}, spec is {meta.get('generation')})"
        )
    revs = st.get("revisions") or []
    lines += _section(
        ("REVISION", "ROLE", "VERSION", "DESIRED", "PODS", "READY", "IN-TRAFFIC", "UNSCHEDULABLE"),
        [
            (
                r.get("revision"),
                r.get("role"),
                r.get("modelVersion"),
                r.get("replicas"),
                r.get("currentReplicas"),
                r.get("readyReplicas"),
                r.get("inTrafficReplicas"),
                r.get("unschedulableReplicas"),
            )
            for r in revs
        ],
    )
    lines += [f"  ! {r['revision']}: {r['schedulingMessage']}" for r in revs if r.get("schedulingMessage")]
    lines += _section(
        ("CONDITION", "STATUS", "REASON", "SINCE", "MESSAGE"),
        [
            (
                c.get("type"),
                c.get("status"),
                c.get("reason"),
                _age(c.get("lastTransitionTime"), now),
                c.get("message"),
            )
            for c in st.get("conditions") or []
        ],
    )
    measurements = (st.get("analysis") or {}).get("measurements") or []
    lines += measurement_table(measurements, now)
    lines += judge_chart(measurements, now)
    lines += _section(
        ("REVISION", "OUTCOME", "AGE", "REASON"),
        [
            (h.get("revision"), h.get("outcome"), _age(h.get("time"), now), h.get("reason"))
            for h in st.get("history") or []
        ],
    )
    return "\n".join(lines) + "\n"


def measurement_table(measurements: list[dict[str, Any]], now: datetime) -> list[str]:
    """Each measurement with the window it was taken for, its value, threshold and verdict (pure)."""
    return _section(
        ("WINDOW", "METRIC", "REVISION", "VALUE", "THRESHOLD", "VERDICT", "AGE"),
        [
            (
                m.get("window") or "-",
                m.get("metric"),
                m.get("revision"),
                m.get("value"),
                m.get("threshold"),
                f"{m.get('verdict')}{' (dry run)' if m.get('dryRun') else ''}",
                _age(m.get("time"), now),
            )
            for m in measurements
        ],
    )


BAR = 24  # characters of the longest bar in a judge chart


def judge_chart(measurements: list[dict[str, Any]], now: datetime) -> list[str]:
    """The statistical judge's windows as a text chart (pure): per judged metric, per window, the
    canary's and the stable's median sample as bars on one scale, the increase with its interval, the
    p-value and the verdict."""
    judged: dict[str, list[dict[str, Any]]] = {}
    for m in measurements:
        if m.get("judge"):
            judged.setdefault(str(m.get("metric")), []).append(m)
    lines: list[str] = []
    for metric, ms in judged.items():
        values = [
            v for m in ms for v in (m["judge"].get("canary"), m["judge"].get("stable")) if v is not None
        ]
        top = max(values, default=0.0) or 1.0
        relative = "latency" in metric or "ttft" in metric
        limit = ms[-1].get("threshold")
        lines += [
            "",
            f"  {metric}: canary vs stable, median of each window's samples; allowed "
            f"{_increase(limit, relative)}",
        ]
        for m in ms:
            j = m["judge"]
            lines.append(
                f"    {_age(m.get('time'), now):>5}  canary {_bar(j.get('canary'), top)}"
                f"  stable {_bar(j.get('stable'), top)}  {_increase(m.get('value'), relative)}"
                f" [{_increase(j.get('low'), relative)}, {_increase(j.get('high'), relative)}]"
                f" p={_g(j.get('pValue'))} n={j.get('canarySamples')}/{j.get('stableSamples')}"
                f"  {m.get('verdict')}{' (dry run)' if m.get('dryRun') else ''}"
            )
    return lines


def _bar(value: float | None, top: float) -> str:
    if value is None:
        return "-".ljust(BAR) + "      -"
    length = max(1, round(BAR * value / top)) if value > 0 else 0
    return ("█" * length).ljust(BAR) + f" {value:6.4g}"


def _increase(x: float | None, relative: bool) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.1f}%" if relative else f"{x:+.4g}"


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.2g}"


def _section(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[str]:
    """A blank line and an indented table, or nothing without rows."""
    if not rows:
        return []
    return ["", *("  " + line for line in _table([header, *rows]))]


def _shadow_line(spec: dict[str, Any], sh: dict[str, Any], now: datetime) -> str:
    shadow_spec = (spec.get("rollout") or {}).get("shadow") or {}
    if not sh.get("startedAt"):
        return (
            f"  shadow: waiting for warm pods and for the stable servers to copy "
            f"({sh.get('copyingPods') or 0} copying) since {_age(sh.get('waitingSince'), now)}"
        )
    agreement = sh.get("agreement")
    so_far = (
        f"agreement {agreement:.4f} over {sh.get('samples') or 0} compared requests"
        if agreement is not None
        else f"{sh.get('samples') or 0} compared requests"
    )
    return (
        f"  shadow: {so_far} (minAgreement {shadow_spec.get('minAgreement', 0.99)}, "
        f"minSamples {shadow_spec.get('minSamples', 200)}); started {_age(sh['startedAt'], now)} ago "
        f"of {shadow_spec.get('duration', '?')}"
    )


def _gate_line(g: dict[str, Any], now: datetime) -> str:
    what = f"gate {g.get('gate')} ({g.get('host')}) of revision {g.get('revision')}"
    if g.get("openedAt"):
        return f"  {what}: open since {_age(g['openedAt'], now)}"
    since = _age(g.get("waitingSince"), now)
    return f"  {what}: waiting for 200 since {since}; last answer: {g.get('message')}"


def _step(spec: dict[str, Any], st: dict[str, Any]) -> str:
    step = st.get("step")
    if step is None:
        return "-"
    steps = (spec.get("rollout") or {}).get("steps") or [5, 25, 50, 100]
    paused = " paused" if (spec.get("rollout") or {}).get("paused") else ""
    return f"{step + 1}/{len(steps)}{paused}"


def command_for(action: str, md: dict[str, Any], full: bool = False) -> dict[str, Any]:
    """The command annotation for ``action`` against the current state (pure); ValueError if it makes
    no sense now."""
    st = md.get("status") or {}
    canary, stable = st.get("canaryRevision"), st.get("stableRevision")
    if action == "promote":
        current = st.get("revision")
        if not canary and full and current and current != stable:
            # the stable revision is gone and the current one failed (StableMissing): put it in anyway
            return {"action": "promote", "revision": current, "full": True}
        if not canary:
            raise ValueError("no canary in progress")
        if st.get("shadow") and not full:  # the shadow stage: skip it (the steps begin)
            return {"action": "promote", "revision": canary, "stage": "shadow"}
        return {"action": "promote", "revision": canary, "step": st.get("step", 0), "full": full}
    if action == "abort":
        if not canary:
            raise ValueError("no canary in progress")
        return {"action": "abort", "revision": canary}
    if action == "rollback":
        if canary:
            return {"action": "abort", "revision": canary}
        if not st.get("previousRevision"):
            raise ValueError("no warm previous revision to roll back to")
        return {"action": "rollback", "revision": stable}
    if action == "resume":  # an analysis paused by errorLimit is judged again
        return {"action": "resume", "revision": canary or stable}
    raise ValueError(f"unknown action {action}")


def _command(kube: Kube, args: argparse.Namespace) -> int:
    md = kube.get(MODELDEPLOYMENT, args.namespace, args.name)
    if md is None:
        print(f"modeldeployment {args.namespace}/{args.name} not found", file=sys.stderr)
        return 1
    try:
        cmd = command_for(args.command, md, full=getattr(args, "full", False))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    cmd["issuedAt"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    patch = {
        "metadata": {
            "resourceVersion": md["metadata"]["resourceVersion"],
            "annotations": {COMMAND_ANNOTATION: json.dumps(cmd, sort_keys=True)},
        }
    }
    kube.merge_patch(MODELDEPLOYMENT, args.namespace, args.name, patch)
    print(f"modeldeployment {args.namespace}/{args.name}: {cmd['action']} requested ({json.dumps(cmd)})")
    return 0


def _pause(kube: Kube, args: argparse.Namespace) -> int:
    """pause/resume patch ``spec.rollout.paused``; resume also clears an analysis paused by errorLimit
    (a command, handled once)."""
    paused = args.command == "pause"
    patch: dict[str, Any] = {"spec": {"rollout": {"paused": paused}}}
    if not paused:
        md = kube.get(MODELDEPLOYMENT, args.namespace, args.name)
        if md is None:
            print(f"modeldeployment {args.namespace}/{args.name} not found", file=sys.stderr)
            return 1
        cmd = command_for("resume", md)
        cmd["issuedAt"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch["metadata"] = {"annotations": {COMMAND_ANNOTATION: json.dumps(cmd, sort_keys=True)}}
    kube.merge_patch(MODELDEPLOYMENT, args.namespace, args.name, patch)
    print(f"modeldeployment {args.namespace}/{args.name}: {'paused' if paused else 'resumed'}")
    return 0


def _status(kube: Kube, args: argparse.Namespace) -> int:
    while True:
        md = kube.get(MODELDEPLOYMENT, args.namespace, args.name)
        if md is None:
            print(f"modeldeployment {args.namespace}/{args.name} not found", file=sys.stderr)
            return 1
        if args.output == "json":
            print(json.dumps(md.get("status") or {}, indent=2, sort_keys=True))
        else:
            if args.watch:
                sys.stdout.write("\x1b[2J\x1b[H")
            sys.stdout.write(render_status(md))
        sys.stdout.flush()
        if not args.watch:
            return 0
        time.sleep(args.interval)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl modeldeploy", description="Inspect and steer ModelDeployments.")
    sub = p.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="show revisions, weights, conditions, measurements and history")
    st.add_argument("name")
    st.add_argument("-n", "--namespace", default="default")
    st.add_argument("-w", "--watch", action="store_true", help="refresh until interrupted")
    st.add_argument("--interval", type=float, default=2.0)
    st.add_argument("-o", "--output", choices=("text", "json"), default="text")
    st.set_defaults(func=_status)
    for name, help_ in (
        ("promote", "move the canary to the next step now (--full: promote it now)"),
        ("abort", "roll the canary back now"),
        ("rollback", "fail back to the warm previous revision (or abort a canary)"),
    ):
        c = sub.add_parser(name, help=help_)
        c.add_argument("name")
        c.add_argument("-n", "--namespace", default="default")
        if name == "promote":
            c.add_argument("--full", action="store_true", help="skip the remaining steps")
        c.set_defaults(func=_command)
    for name in ("pause", "resume"):
        c = sub.add_parser(name, help=f"{name} the rollout (spec.rollout.paused)")
        c.add_argument("name")
        c.add_argument("-n", "--namespace", default="default")
        c.set_defaults(func=_pause)
    dashboard.add_parser(sub)
    notify.add_key_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "no_cluster", False):
        return int(args.func(None, args))
    kube = Kube.from_environment(pool_size=2)
    try:
        return int(args.func(kube, args))
    except KeyboardInterrupt:
        return 130
    except KubeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
