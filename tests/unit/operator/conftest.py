from __future__ import annotations

import copy
from typing import Any

import pytest
from md_cases import BASE_MD


@pytest.fixture
def md_body() -> dict[str, Any]:
    return copy.deepcopy(BASE_MD)
