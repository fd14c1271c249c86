"""The object store's configuration: versitygw's address, region and command line, and its root user."""

from __future__ import annotations

import secrets
from pathlib import Path

# The cluster's S3-compatible object store: versitygw (POSIX backend) inside the pod network namespace on
# the anchor address, like Traefik: the host and pods reach the same URL, and no host port is taken.
S3_PORT = 9000
S3_REGION = "us-east-1"
S3_HEALTH_PATH = "/health"


def versitygw_args(bin_dir: Path, *, listen_ip: str, data_dir: Path, access_log: Path) -> list[str]:
    """versitygw serving ``data_dir`` (each top-level directory a bucket, each file below an object) on
    ``listen_ip:S3_PORT``, with an S3 server access log (one line per request) in ``access_log``. The
    root credentials come from the environment (``ROOT_ACCESS_KEY_ID``/``ROOT_SECRET_ACCESS_KEY``), so
    they appear in no command line, log or ``cluster.json``. ``--quiet``: no per-request lines on
    stdout (the access log has them)."""
    return [
        str(bin_dir / "versitygw"),
        f"--port={listen_ip}:{S3_PORT}",
        f"--region={S3_REGION}",
        f"--health={S3_HEALTH_PATH}",
        f"--access-log={access_log}",
        "--quiet",
        "posix",
        str(data_dir),
    ]


def s3_credentials() -> dict[str, str]:
    """A fresh root user for the object store: an AWS-shaped access key id and secret."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    access = "LOCAL" + "".join(secrets.choice(alphabet) for _ in range(15))
    return {"accessKey": access, "secretKey": secrets.token_urlsafe(30)[:40]}
