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


_DEC_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"


_H16 = r"[0-9A-Fa-f]{1,4}"


_LS32 = rf"({_H16}:{_H16}|{_DEC_OCTET}(\.{_DEC_OCTET}){{3}})"


def _ipv6_pattern() -> str:
    """RFC 3986's ``IPv6address``, its nine forms in order (no zone: neither yarl nor every apiserver's
    Go takes the same zones, so none is admitted)."""
    forms = [rf"({_H16}:){{6}}{_LS32}", rf"::({_H16}:){{5}}{_LS32}", rf"({_H16})?::({_H16}:){{4}}{_LS32}"]
    tails = [rf"({_H16}:){{3}}{_LS32}", rf"({_H16}:){{2}}{_LS32}", rf"{_H16}:{_LS32}", _LS32, _H16, ""]
    forms += [rf"(({_H16}:){{0,{n}}}{_H16})?::{tail}" for n, tail in enumerate(tails, start=1)]
    return "(" + "|".join(forms) + ")"


#: a port from 1 to 65535, no leading zero (0 is no port one can connect to)
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"


#: a webhook's or a gate's URL: http(s), a host (a DNS name or a bracketed IPv6 address), a port from 1 to
#: 65535 if any, no user info, a path of visible ASCII. The CRD carries it, so that every URL the apiserver
#: admits is one that urllib.parse (host allow-list, logs, status) and yarl (aiohttp, which POSTs) parse:
#: ``http://h:99999/`` and ``http://[::1/x`` passed the looser pattern before and raised in the reconcile.
#: Only explicit ASCII classes, so that Go's RE2 (the apiserver) and Python read it alike.
HTTP_URL_PATTERN = (
    rf"^https?://(\[{_ipv6_pattern()}\]|[A-Za-z0-9_]([-A-Za-z0-9_.]*[A-Za-z0-9_])?\.?)(:{_PORT})?(/[!-~]*)?$"
)


#: the same, as a CEL rule the apiserver evaluates with its URL library: the pattern holds alone, this
#: gives the refusal a message one can read (a pattern's message is the pattern)
HTTP_URL_RULE = (
    "isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != '' && "
    "(url(self).getPort() == '' || (size(url(self).getPort()) <= 5 && int(url(self).getPort()) >= 1 && "
    "int(url(self).getPort()) <= 65535))"
)


_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h)")


_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


#: what :func:`url_origin` shows of a URL it cannot parse
INVALID_URL = "(an invalid URL)"


def url_origin(url: str) -> str:
    """A URL's scheme, host and port: what logs, status and events show of a webhook or gate URL (its
    path and query are often its secret, and credentials are never shown). Never raises: a URL that
    does not parse (one stored before the CRD's rule) is :data:`INVALID_URL`."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return INVALID_URL
    if host and ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host or ''}" + (f":{port}" if port else "")


def url_unparsable(url: str) -> str | None:
    """Why urllib.parse cannot read ``url``'s host and port ("Port out of range 0-65535", "Invalid IPv6
    URL", ...), or None when it can. Never raises."""
    try:
        parts = urlsplit(url)
        _ = parts.hostname, parts.port
    except ValueError as e:
        return str(e)
    return None


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is no URL the operator may POST to (a webhook's, a gate's), or None when it is one:
    :data:`HTTP_URL_PATTERN`, and what urllib.parse makes of it (as :func:`url_origin` and the host
    allow-list read it). Never raises."""
    unparsable = url_unparsable(url)
    if unparsable is not None:
        return unparsable
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port
    if parts.scheme not in ("http", "https"):
        return "the scheme must be http or https"
    if "@" in parts.netloc:
        return "no user info (credentials) in the URL"
    if not host:
        return "no host"
    if port == 0:
        return "port 0"
    if not re.fullmatch(HTTP_URL_PATTERN, url):
        return (
            "not http(s)://host[:port][/path]: a DNS name or a bracketed IPv6 address, a port from 1 to "
            "65535, visible ASCII"
        )
    return None


def check_http_url(url: str, field: str) -> str:
    """``url``, or a ValueError that names ``field`` and says why it is no URL the operator may POST to."""
    problem = http_url_problem(url)
    if problem is not None:
        raise ValueError(f"{field} must be an http(s) URL with a host and a port from 1 to 65535: {problem}")
    return url


def http_url_extra(field: str) -> dict[str, Any]:
    """The CRD side of a webhook's or gate's URL: :data:`HTTP_URL_PATTERN` and :data:`HTTP_URL_RULE`."""
    message = f"{field} must be an http(s) URL with a host, no user info, and a port from 1 to 65535"
    return {"pattern": HTTP_URL_PATTERN, **cel_validations(cel_rule(HTTP_URL_RULE, message))}


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
