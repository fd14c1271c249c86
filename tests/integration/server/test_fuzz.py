"""Fuzz every operation of the server's own OpenAPI document (schemathesis strategies, a bounded number of
examples per operation): no generated request may produce a 5xx, and every 4xx carries {"error": ...}
(an object with a message on the OpenAI route)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

MAX_EXAMPLES = 40
N_OPERATIONS = 13


def operations(url: str) -> list:
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    return [r.ok() for r in schema.get_all_operations()]


def test_openapi_covers_the_protocol(minilm_server):
    labels = {f"{op.method.upper()} {op.path}" for op in operations(minilm_server.url)}
    for expected in (
        "GET /v2/health/live",
        "GET /v2/health/ready",
        "GET /v2",
        "GET /v2/models/{model_name}",
        "GET /v2/models/{model_name}/ready",
        "POST /v2/models/{model_name}/infer",
        "GET /v2/models/{model_name}/versions/{model_version}",
        "GET /v2/models/{model_name}/versions/{model_version}/ready",
        "POST /v2/models/{model_name}/versions/{model_version}/infer",
        "GET /metrics",
        "GET /v2/models/{model_name}/config",
        "GET /v2/models/{model_name}/stats",
        "POST /v1/embeddings",
    ):
        assert expected in labels
    assert len(labels) == N_OPERATIONS


@pytest.mark.parametrize("index", range(N_OPERATIONS))
def test_no_server_errors(minilm_server, index):
    ops = sorted(operations(minilm_server.url), key=lambda op: (op.path, op.method))
    op = ops[index]
    seen: list[int] = []

    @given(case=op.as_strategy())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def run(case):
        response = case.call(base_url=minilm_server.url, timeout=60)
        seen.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])
        assert response.status_code < 500, response.text[:500]
        if response.status_code >= 400:  # each protocol its own shape: OIP a string, OpenAI an object
            error = response.json().get("error")
            if op.path.startswith("/v1/"):
                assert isinstance(error, dict) and isinstance(error.get("message"), str), response.text[:500]
            else:
                assert isinstance(error, str), response.text[:500]

    run()
    assert seen, f"no examples were generated for {op.method} {op.path}"
