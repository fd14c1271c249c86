"""Pure comparison of a live object with the desired one: does it need a (server-side) apply?

The live object holds everything the apiserver defaulted and other managers added; the desired one only
what we own. So the question is "is desired a subset of live?", with two refinements:

* the hash annotation :data:`builders.ANNOTATION_APPLIED` changes whenever what we want changes
  (including a field we stop setting, which a subset test cannot see);
* quantities compare by value (``0.5`` and ``500m`` are the same CPU; the apiserver may rewrite them).

Paths the apiserver is known to rewrite (found by comparing an apply's answer with what was applied)
can be passed as ``ignore`` so that they do not cause an apply on every reconcile.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from .builders import ANNOTATION_APPLIED

Path = tuple[str | int, ...]


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity's value (``kubernetes.utils.parse_quantity``); None when it is not one."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return parse_quantity(value)
    except (ValueError, TypeError):
        return None


def _is_quantity_path(path: Path) -> bool:
    return any(p in ("requests", "limits") for p in path if isinstance(p, str))


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def mismatches(desired: Any, live: Any, path: Path = ()) -> list[Path]:
    """Paths where ``desired`` is not contained in ``live``."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return [] if _empty(desired) and live is None else [path]
        out: list[Path] = []
        for key, value in desired.items():
            if key not in live:
                if not _empty(value):
                    out.append((*path, key))
                continue
            out.extend(mismatches(value, live[key], (*path, key)))
        return out
    if isinstance(desired, list):
        if live is None and not desired:
            return []
        if not isinstance(live, list) or len(live) != len(desired):
            return [path]
        out = []
        for i, (d, lv) in enumerate(zip(desired, live, strict=True)):
            out.extend(mismatches(d, lv, (*path, i)))
        return out
    if desired == live:
        return []
    if _is_quantity_path(path):
        a, b = quantity(desired), quantity(live)
        if a is not None and a == b:
            return []
    return [path]


def needs_apply(
    desired: dict[str, Any], live: dict[str, Any] | None, ignore: frozenset[Path] = frozenset()
) -> bool:
    """True when the live object is missing, was built from a different desired object, or drifted."""
    if live is None:
        return True
    want = desired.get("metadata", {}).get("annotations", {}).get(ANNOTATION_APPLIED)
    have = (live.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_APPLIED)
    if want != have:
        return True
    return any(p not in ignore for p in mismatches(desired, live))
