"""The ModelDeployment API's names, patterns and durations, and the base of its pydantic models (the
CEL rules and defaults they carry into the CRD); :mod:`modeldeploy.api` is the API itself."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "modeldeploy.io"


VERSION = "v1alpha1"


API_VERSION = f"{GROUP}/{VERSION}"


KIND = "ModelDeployment"


PLURAL = "modeldeployments"


SINGULAR = "modeldeployment"


SHORT_NAMES = ["md"]


CATEGORIES = ["modeldeploy"]


DEFAULT_IMAGE = "modeldeploy/modelserver:dev"


def default_image() -> str:
    """The image of ModelDeployments that set none: ``$MODELDEPLOY_DEFAULT_IMAGE`` or DEFAULT_IMAGE."""
    return os.environ.get("MODELDEPLOY_DEFAULT_IMAGE") or DEFAULT_IMAGE


#: a ModelDeployment's name becomes part of ``<name>-<revision>`` Service names (DNS-1035, 63 chars)
MAX_NAME_LENGTH = 52


#: the Gateway API's duration format (GEP-2257): 1 to 4 parts of 1 to 5 digits and a unit h, m, s or ms
#: (no fractions, no sign, no spaces; parts add up: "1h30m", "1m500ms"); the CRD validates the same
DURATION_PATTERN = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"


_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"


QUANTITY_PATTERN = rf"^{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUMBER}))?$"


NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$"


_DNS_PREFIX = r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"


LABEL_KEY_PATTERN = rf"^{_DNS_PREFIX}[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


CONDITION_TYPE_PATTERN = rf"^{_DNS_PREFIX}(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"


LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


URI_PATTERN = r"^(file|https?|noop|s3|pvc)://.+$"


#: ``s3://bucket`` or ``s3://bucket/prefix-or-key`` (S3 bucket naming rules)
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"


#: ``pvc://claim`` or ``pvc://claim/path/in/the/volume`` (a claim name is a DNS-1123 subdomain)
PVC_URI_PATTERN = r"^pvc://[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?(/.*)?$"


_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h)")


_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def url_origin(url: str) -> str:
    """A URL's scheme, host and port: what logs, status and events show of a webhook or gate URL (its
    path and query are often its secret, and credentials are never shown)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def parse_duration(value: str) -> float:
    """Seconds in a Gateway API duration (GEP-2257, :data:`DURATION_PATTERN`): ``"1m30s"`` -> 90.0."""
    if not re.fullmatch(DURATION_PATTERN, value):
        raise ValueError(f"not a duration (GEP-2257, e.g. 30s, 1m, 1h30m, 500ms): {value!r}")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value))


def cel_rule(
    rule: str, message: str, field_path: str | None = None, reason: str | None = None
) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


def cel_validations(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    def to_api(self) -> dict[str, Any]:
        """The wire form (camelCase), without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def default_of(model: type[ApiModel]) -> dict[str, Any]:
    """The schema default of a nested object: the whole object with its defaults (the apiserver checks
    a default against the CEL rules as it is, without filling in nested defaults first)."""
    return {"default": model().to_api()}


Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)]


Quantity = Annotated[
    int | str,
    Field(
        json_schema_extra={
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]


def check_quantity(value: int | str | None) -> int | str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a quantity is a number or a string such as 500m or 2Gi")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a quantity must not be negative")
        return value
    if not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"not a quantity (e.g. 500m, 2, 4Gi): {value!r}")
    return value
