"""Contracts between the operator and the serving image, each written once per side: these tests hold
the two sides to each other (issue 28)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from modeldeploy.api import ModelDeployment
from modeldeploy.api_rollout import CompareSpec
from modeldeploy.builders import pod_template, shadow_service, spec_revision
from modeldeploy.model_storage import FETCH_REASONS, parse_termination_message
from modeldeploy.rollout_types import Mirror
from modeldeploy.routing import PRIORITY_HEADER as ROUTE_STRIPS
from modelserver.dir_digest import dir_digest_of
from modelserver.fetch_errors import REASONS
from modelserver.gen_app import PRIORITY_HEADER as SERVER_TRUSTS
from modelserver.loader import dir_digest
from modelserver.shadow import MirrorConfig


def test_the_shadow_target_the_operator_writes_is_the_one_the_server_reads() -> None:
    md = ModelDeployment.from_api(
        {
            "metadata": {"name": "minilm", "namespace": "team-a", "uid": "u"},
            "spec": {"model": {"name": "minilm", "version": "1", "uri": "file:///m"}},
        }
    )
    compare = CompareSpec(method="cosine", min_cosine=0.97, rtol=0.01, atol=0.002, min_token_agreement=0.85)
    target = spec_revision(md.spec)
    mirror = Mirror(source="r1", target=target, sample_rate=0.25, timeout_ms=1500.0, compare=compare)
    # the pod's MODELSERVER_SHADOW_SERVICE (from the pod template) and its annotation (from the plan)
    (container,) = pod_template(md, md.spec, "r1")["spec"]["containers"]
    service = {e["name"]: e["value"] for e in container["env"]}["MODELSERVER_SHADOW_SERVICE"]
    url = shadow_service(md, target)
    got = MirrorConfig.parse(mirror.to_annotation(url), service)
    assert got is not None
    assert (got.url, got.revision, got.sample_rate, got.timeout_s) == (
        f"http://minilm-{target}.team-a.svc.cluster.local:8080",
        target,
        0.25,
        1.5,
    )
    c = got.compare
    assert (c.method, c.min_cosine, c.rtol, c.atol, c.min_token_agreement) == (
        "cosine",
        0.97,
        0.01,
        0.002,
        0.85,
    )


def test_the_fetch_failure_reasons_the_operator_knows_are_the_ones_the_fetch_writes() -> None:
    assert set(FETCH_REASONS) == set(REASONS)


@pytest.mark.parametrize("error", sorted(REASONS.values(), key=lambda e: e.reason), ids=lambda e: e.reason)
def test_the_termination_line_the_fetch_writes_is_the_failure_the_operator_reads(error: type) -> None:
    message = "no object under s3://models/minilm/v1:\n  (tried 3 times: 404)"  # a colon, a second line
    failure = parse_termination_message(error(message).line())
    assert (failure.reason, failure.message) == (
        error.reason,
        "no object under s3://models/minilm/v1: (tried 3 times: 404)",
    )


def test_one_directory_digest_for_the_server_and_the_fetch(tmp_path: Path) -> None:
    files = {"config.json": b"{}", "sub/model.safetensors": b"\0" * 100, "a b.txt": "é".encode()}
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    from_files = dir_digest_of({rel: hashlib.sha256(d).hexdigest() for rel, d in files.items()})
    assert dir_digest(tmp_path) == from_files
    lines = sorted(f"{rel}\0{hashlib.sha256(d).hexdigest()}\n" for rel, d in files.items())
    assert from_files == hashlib.sha256("".join(lines).encode()).hexdigest()  # the documented format


def test_the_priority_header_the_gateway_strips_is_the_one_the_generation_server_trusts() -> None:
    assert ROUTE_STRIPS == SERVER_TRUSTS
