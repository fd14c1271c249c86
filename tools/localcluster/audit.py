"""Reading the local apiserver's audit log (``config.AUDIT_POLICY``: every write; every request of a
non-system service account, reads included)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .config import WRITE_VERBS


def completed(path: Path) -> Iterator[dict[str, Any]]:
    """Every completed request in the audit log (a missing log has none)."""
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue  # a line being written
        if ev.get("stage") == "ResponseComplete":
            yield ev


def writes_by_agents(path: Path, user_agents: tuple[str, ...], resources: set[str]) -> list[dict[str, Any]]:
    """Completed writes to ``resources`` whose User-Agent starts with one of ``user_agents``."""
    return [
        ev
        for ev in completed(path)
        if ev.get("verb") in WRITE_VERBS
        and ev.get("userAgent", "").startswith(user_agents)
        and (ev.get("objectRef") or {}).get("resource") in resources
    ]
