"""What a benchmark result measured: the commit, and which tracked files differed from it (a results file
written from a tree with local changes names them, rather than claiming the commit alone)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return out.stdout.rstrip("\n")


def changed_files() -> list[str]:
    """Tracked files that differ from HEAD (untracked ones are not measured by any bench)."""
    return sorted(line[3:] for line in _git("status", "--porcelain", "--untracked-files=no").splitlines())


def commit() -> str:
    """HEAD's short hash, with ``-dirty`` when a tracked file differs from it."""
    return _git("rev-parse", "--short", "HEAD") + ("-dirty" if changed_files() else "")


def provenance() -> dict[str, object]:
    """``{"commit": ..., "changed_files": [...]}`` for a results file."""
    return {"commit": commit(), "changed_files": changed_files()}
