"""Shared test data of the operator unit tests (importable by name; conftest modules are not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
INVALID_DIR = REPO / "tests" / "integration" / "operator" / "invalid"

BASE_MD: dict[str, Any] = {
    "apiVersion": "modeldeploy.io/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "minilm", "namespace": "default", "uid": "md-uid-1", "generation": 1},
    "spec": {"model": {"name": "minilm", "version": "1", "uri": "file:///models/minilm"}},
}


#: URLs the apiserver admitted before the CRD's URL rule and urllib.parse (host allow-list, status, logs)
#: or yarl (aiohttp, which POSTs) cannot parse or connect to, or that carry credentials
BAD_URLS = [
    "http://[::1/x",  # an IPv6 literal without its "]": "Invalid IPv6 URL"
    "http://h:99999/",  # "Port out of range 0-65535"
    "http://h:65536/",
    "http://h:0/",  # parses, but no port one connects to
    "http://h:/",  # an empty port
    "http://h:080/",  # a leading zero: one spelling per port
    "http://::1/",  # an IPv6 address without brackets
    "http://[1.2.3.4]/",  # IPv4 in brackets
    "http://[1::2::3]/",  # two "::"
    "http://[fe80::1%25eth0]/",  # a zone: parsed differently by urllib, yarl and Go
    "http://[v1.x]/",  # an IPvFuture literal
    "http://user@hooks.example.com/",  # user info: no credentials in the URL
    "http://u:p@hooks.example.com/x",
    "http:///x",  # no host
    "ftp://hooks.example.com/",
    "http://hooks.example.com/a b",
]

GOOD_URLS = [
    "http://h:1/",
    "http://h:65535/",
    "https://hooks.slack.com/services/T0/B0/x?token=t#f",
    "http://[::1]:8080/x",
    "https://[2001:db8::1]/hook",
    "http://[::ffff:192.0.2.1]/",
    "http://[1:2:3:4:5:6:7::]/",
    "http://192.0.2.1:8443",
    "http://receiver.team-a.svc.cluster.local./hooks",
]


def invalid_manifests() -> list[tuple[str, dict[str, Any], str, str]]:
    """(file name, manifest, expected field, pydantic: refuse|skip) for every bad manifest."""
    out = []
    for path in sorted(INVALID_DIR.glob("*.yaml")):
        text = path.read_text()
        head = dict(
            line[2:].split(": ", 1) for line in text.splitlines() if line.startswith("# ") and ": " in line
        )
        out.append((path.name, yaml.safe_load(text), head["expect-field"], head["pydantic"]))
    return out
