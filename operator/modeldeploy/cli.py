"""``kubectl-modeldeploy``: the kubectl plugin (``kubectl modeldeploy ...`` when on PATH).

    kubectl modeldeploy status NAME [-n NS] [--watch] [--output text|json]

The rollout commands (promote, abort, rollback, pause, resume) come with progressive delivery.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from . import kube as k


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
        f"canary {st.get('canaryRevision') or '-'}  weight {st.get('canaryWeight', '-')}  "
        f"step {st.get('step', '-')}  previous {st.get('previousRevision') or '-'}",
    ]
    if st.get("observedGeneration") != meta.get("generation"):
        lines.append(
            f"  (status is for generation {st.get('observedGeneration')}, spec is {meta.get('generation')})"
        )
    revs = st.get("revisions") or []
    if revs:
        lines.append("")
        lines.extend(
            "  " + line
            for line in _table(
                [("REVISION", "ROLE", "VERSION", "DESIRED", "PODS", "READY", "IN-TRAFFIC", "UNSCHEDULABLE")]
                + [
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
                ]
            )
        )
        for r in revs:
            if r.get("schedulingMessage"):
                lines.append(f"  ! {r['revision']}: {r['schedulingMessage']}")
    conds = st.get("conditions") or []
    if conds:
        lines.append("")
        lines.extend(
            "  " + line
            for line in _table(
                [("CONDITION", "STATUS", "REASON", "SINCE", "MESSAGE")]
                + [
                    (
                        c.get("type"),
                        c.get("status"),
                        c.get("reason"),
                        _age(c.get("lastTransitionTime"), now),
                        c.get("message"),
                    )
                    for c in conds
                ]
            )
        )
    measurements = (st.get("analysis") or {}).get("measurements") or []
    if measurements:
        lines.append("")
        lines.extend(
            "  " + line
            for line in _table(
                [("METRIC", "VALUE", "THRESHOLD", "VERDICT", "AGE")]
                + [
                    (
                        m.get("metric"),
                        m.get("value"),
                        m.get("threshold"),
                        m.get("verdict"),
                        _age(m.get("time"), now),
                    )
                    for m in measurements
                ]
            )
        )
    history = st.get("history") or []
    if history:
        lines.append("")
        lines.extend(
            "  " + line
            for line in _table(
                [("REVISION", "OUTCOME", "AGE", "REASON")]
                + [
                    (h.get("revision"), h.get("outcome"), _age(h.get("time"), now), h.get("reason"))
                    for h in history
                ]
            )
        )
    return "\n".join(lines) + "\n"


def _status(kube: k.Kube, args: argparse.Namespace) -> int:
    while True:
        md = kube.get(k.MODELDEPLOYMENT, args.namespace, args.name)
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
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    kube = k.Kube.from_environment(pool_size=2)
    try:
        return int(args.func(kube, args))
    except KeyboardInterrupt:
        return 130
    except k.KubeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
