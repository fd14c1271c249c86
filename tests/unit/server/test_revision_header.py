"""Every response names the revision that answered (``x-modeldeploy-revision``, from MODELDEPLOY_REVISION,
which the operator sets on the server container): clients behind a Service or a gateway can tell."""

from __future__ import annotations

import httpx
import pytest
from modelserver.app import ModelServerApp
from modelserver.config import load_settings
from modelserver.loader import create_model
from modelserver.service import ModelService


async def _answers(monkeypatch: pytest.MonkeyPatch, revision: str | None) -> list[httpx.Response]:
    if revision is None:
        monkeypatch.delenv("MODELDEPLOY_REVISION", raising=False)
    else:
        monkeypatch.setenv("MODELDEPLOY_REVISION", revision)
    settings = load_settings(["--model-name", "echo", "--model-uri", "noop://?fail_text=BAD"], environ={})
    service = ModelService(settings, create_model(settings))
    await service.start()
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}
    bad = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["BAD"]}]}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=ModelServerApp(service)), base_url="http://t"
    ) as c:
        out = [
            await c.post("/v2/models/echo/infer", json=body),  # 200
            await c.post("/v2/models/echo/infer", json=bad),  # the model fails: 5xx
            await c.post("/v2/models/nope/infer", json=body),  # 404
            await c.get("/v2/health/ready"),
        ]
    await service.drain()
    return out


async def test_every_answer_carries_the_revision(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = await _answers(monkeypatch, "7f3a9c2d1e")
    codes = [r.status_code for r in answers]
    assert codes[0] == 200 and codes[1] >= 500 and codes[2] == 404 and codes[3] == 200, codes
    assert [r.headers.get("x-modeldeploy-revision") for r in answers] == ["7f3a9c2d1e"] * 4


async def test_no_revision_no_header(monkeypatch: pytest.MonkeyPatch) -> None:
    for revision in (None, "", "bad value\n"):
        answers = await _answers(monkeypatch, revision)
        assert answers[0].status_code == 200
        assert all("x-modeldeploy-revision" not in r.headers for r in answers), revision
