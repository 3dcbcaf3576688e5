"""The server's OpenAPI schema, fuzzed with schemathesis: whatever a client sends, never a 5xx."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tests.server_harness import running_server

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def live_schema(tiny_model_path: Path):
    with running_server(tiny_model_path, budget=64, max_tokens=4, sequences=2, max_waiting=8) as (url, _):
        yield schemathesis.openapi.from_url(f"{url}/openapi.json")


schema = schemathesis.pytest.from_fixture("live_schema")


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case) -> None:
    case.call_and_validate(checks=[not_a_server_error])
