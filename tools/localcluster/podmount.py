"""Put a container's volumes in place inside its private mount namespace, then exec the container.

Run by the node agent as ``unshare --mount --propagation private python -m localcluster.podmount
--scratch DIR [--keep PATH]... [--bind SOURCE MOUNTPATH ro|rw]... -- COMMAND...`` (see
:func:`localcluster.volumes.wrap_command`); ``COMMAND`` is ``ip netns exec <ns> <argv>``, whose own
mount namespace inherits these mounts.

For each mount: ``mount --bind SOURCE MOUNTPATH`` (and ``remount,bind,ro`` for ``ro``). ``SOURCE`` is a
directory or a file (a ``subPath`` to a file, the container's termination-message file). A missing
``MOUNTPATH`` is created without touching the host: the nearest existing parent directory ``P`` gets an
overlay in this namespace only (lower ``P``, upper and work dirs on a tmpfs mounted at ``DIR``), the
missing directory (or empty file) is made in the overlay, and the mounts that were below ``P`` are
bind-mounted back from a recursive copy taken before. All of it vanishes with the namespace, i.e. when
the container's processes are gone; on the host ``DIR`` is an empty directory under the pod's state
directory.

A mount over an existing directory hides what was there, as in a container. Each ``--keep`` path below
such a ``MOUNTPATH`` (the agent passes the repository, the Python environment and the cluster's state
directory) is bound back on top of it at the same path (opened before the mount, bound from
``/proc/self/fd``), so a process-run pod still finds its interpreter, its code, its kubeconfig and its
volumes when e.g. an ``emptyDir`` is mounted at ``/tmp`` and the cluster lives below ``/tmp``. The mount
points for these are directories made inside the volume.

Nothing but the standard library: this runs before every start of a container.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

MS_BIND = 4096
MS_REC = 16384


class MountError(RuntimeError):
    pass


def _mount(*args: str) -> None:
    res = subprocess.run(["mount", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise MountError(f"mount {' '.join(args)}: {res.stderr.strip() or res.returncode}")


def _bind_fd(fd: int, target: str) -> None:
    """``mount --rbind`` of what ``fd`` (an O_PATH descriptor) refers to, whatever now covers its path."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    src = f"/proc/self/fd/{fd}".encode()
    if libc.mount(src, target.encode(), None, MS_BIND | MS_REC, None) != 0:
        err = ctypes.get_errno()
        raise MountError(f"bind back {target}: {os.strerror(err)}")


def unescape_mountinfo(field: str) -> str:
    """Mount points in ``/proc/self/mountinfo`` escape space, tab, newline and backslash as ``\\ooo``."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points(mountinfo: str) -> list[str]:
    return [unescape_mountinfo(line.split()[4]) for line in mountinfo.splitlines() if line.strip()]


def _under(path: str, parent: str) -> bool:
    return path != parent and (parent == "/" or path.startswith(parent.rstrip("/") + "/"))


def top_submounts(points: list[str], parent: str, exclude: str) -> list[str]:
    """Mount points strictly below ``parent`` not below another of them (nor at/below ``exclude``)."""
    below = sorted({p for p in points if _under(p, parent) and p != exclude and not _under(p, exclude)})
    return [p for p in below if not any(_under(p, q) for q in below)]


def nearest_existing(path: str) -> str:
    p = os.path.normpath(path)
    while not os.path.lexists(p):
        p = os.path.dirname(p)
    return p


class Mounter:
    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.overlays: list[str] = []  # directories overlaid here
        self.bound: list[str] = []  # mount paths bound here
        self._tmpfs = False

    def _writable_here(self, directory: str) -> bool:
        """Inside an overlay or a bind made here: a directory created there stays in this namespace."""
        return any(directory == d or _under(directory, d) for d in self.overlays + self.bound)

    def _overlay(self, parent: str) -> None:
        if parent == "/":
            raise MountError("will not overlay / (mountPath needs an existing parent directory below /)")
        if not self._tmpfs:
            self.scratch.mkdir(parents=True, exist_ok=True)
            _mount("-t", "tmpfs", "-o", "mode=0700", "tmpfs", str(self.scratch))
            self._tmpfs = True
        base = self.scratch / str(len(self.overlays))
        upper, work, orig = base / "upper", base / "work", base / "orig"
        for d in (upper, work, orig):
            d.mkdir(parents=True)
        subs = top_submounts(
            mount_points(Path("/proc/self/mountinfo").read_text()), parent, str(self.scratch)
        )
        if subs:
            _mount("--rbind", parent, str(orig))
        _mount("-t", "overlay", "overlay", "-o", f"lowerdir={parent},upperdir={upper},workdir={work}", parent)
        for sub in subs:
            _mount("--rbind", str(orig / os.path.relpath(sub, parent)), sub)
        self.overlays.append(parent)

    def bind(self, source: str, target: str, read_only: bool, keep: list[str] | None = None) -> None:
        target = os.path.normpath(target)
        if not os.path.exists(source):
            raise MountError(f"volume source {source} is missing")
        is_dir = os.path.isdir(source)
        created = False
        if not os.path.lexists(target):
            parent = nearest_existing(target)
            if not self._writable_here(parent):
                self._overlay(parent)
            if is_dir:
                os.makedirs(target)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "a"):
                    pass
            created = True
        elif is_dir != os.path.isdir(target):
            kind = "a directory" if is_dir else "a file"
            raise MountError(f"mountPath {target} exists and is not {kind} like its source {source}")
        covered = [] if created or not is_dir else covered_keeps(keep or [], target)
        fds = [os.open(k, os.O_PATH) for k in covered]
        try:
            _mount("--bind", source, target)
            for k, fd in zip(covered, fds, strict=True):
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.makedirs(k, exist_ok=True)
                elif not os.path.lexists(k):
                    with open(k, "a"):
                        pass
                _bind_fd(fd, k)
        finally:
            for fd in fds:
                os.close(fd)
        if read_only:
            _mount("-o", "remount,bind,ro", target)
        self.bound.append(target)


def covered_keeps(keep: list[str], target: str) -> list[str]:
    """The outermost ``keep`` paths strictly below ``target``: a mount there would hide them."""
    below = sorted({os.path.normpath(k) for k in keep if _under(os.path.normpath(k), target)})
    return [k for k in below if not any(_under(k, q) for q in below)]


def parse(argv: list[str]) -> tuple[Path, list[tuple[str, str, bool]], list[str], list[str]]:
    scratch: Path | None = None
    binds: list[tuple[str, str, bool]] = []
    keep: list[str] = []
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--scratch" and i + 1 < len(argv):
            scratch, i = Path(argv[i + 1]), i + 2
        elif argv[i] == "--keep" and i + 1 < len(argv):
            keep.append(argv[i + 1])
            i += 2
        elif argv[i] == "--bind" and i + 3 < len(argv) and argv[i + 3] in ("ro", "rw"):
            binds.append((argv[i + 1], argv[i + 2], argv[i + 3] == "ro"))
            i += 4
        else:
            raise SystemExit(f"podmount: bad argument {argv[i]!r}")
    command = argv[i + 1 :]
    if scratch is None or not command:
        raise SystemExit(
            "usage: podmount --scratch DIR [--keep PATH]... [--bind SRC DST ro|rw]... -- COMMAND..."
        )
    return scratch, binds, command, keep


def main(argv: list[str] | None = None) -> int:
    scratch, binds, command, keep = parse(sys.argv[1:] if argv is None else argv)
    mounter = Mounter(scratch)
    try:
        # Parents first, so a mountPath inside another volume lands in that volume's bind.
        for source, target, ro in sorted(binds, key=lambda b: os.path.normpath(b[1]).count("/")):
            mounter.bind(source, target, ro, keep)
    except (MountError, OSError) as exc:
        print(f"podmount: {exc}", file=sys.stderr, flush=True)
        return 125
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
