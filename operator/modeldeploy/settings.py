"""The operator's settings (pydantic-settings, as the serving image's ``modelserver.config``): command-line
flags and ``MODELDEPLOY_*`` environment variables, validated by one model.

Precedence, highest first: command-line flag > environment variable > default. Every setting ``foo_bar`` is
the flag ``--foo-bar`` and the variable ``MODELDEPLOY_FOO_BAR``, except two whose variables keep their older
names: ``namespace`` is ``MODELDEPLOY_NAMESPACES`` (a comma list; the flag ``-n`` repeats) and ``verbose``
is ``MODELDEPLOY_DEBUG``; ``bind_host`` falls back to ``POD_IP``. An empty variable counts as unset.

Booleans are read by pydantic: ``1``/``0``, ``true``/``false``, ``yes``/``no``, ``on``/``off`` (any case);
anything else is refused. A flag given on the command line replaces its variable (``-n`` too: the flags'
namespaces, not the variable's plus the flags').

``priority`` is kopf's peering priority, with kopf's meaning for every integer: a replica pauses while it
sees a live peer of a higher or equal priority. Unset, it is drawn at random from 1..2^30, so that of two
replicas started alike exactly one acts. ``0`` is kopf's own default priority, below every drawn one: a
replica given 0 acts only when no other replica is alive (and two replicas given the same priority pause
each other).

The variables the serving pods' templates are built from (``MODELDEPLOY_DEFAULT_IMAGE``,
``MODELDEPLOY_FETCH_IMAGE``, ``MODELDEPLOY_NODE_CACHE_*``, ``MODELDEPLOY_MODEL_VOLUME_SIZE_LIMIT``,
``MODELDEPLOY_CLUSTER_DOMAIN``) are not settings of this model: the builders read them where they are used.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    CliImplicitFlag,
    CliSettingsSource,
    CliToggleFlag,
    EnvSettingsSource,
    NoDecode,
    SettingsConfigDict,
)

from .api_base import check_http_url
from .resync import DEFAULT_PERIOD

ENV_PREFIX = "MODELDEPLOY_"
#: settings whose environment variable is not ENV_PREFIX + the setting's name
ENV_NAMES = {"namespace": "MODELDEPLOY_NAMESPACES", "verbose": "MODELDEPLOY_DEBUG"}


class SettingsError(ValueError):
    """A setting is invalid; the message names the flag or the variable that gave it."""


def random_priority() -> int:
    return random.randint(1, 2**30)


def _comma_list(value: Any) -> Any:
    """``"a,b"`` (the variable, or the repeated flag as pydantic-settings joins it) -> ``["a", "b"]``."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


CommaList = Annotated[list[str], NoDecode, BeforeValidator(_comma_list)]
Namespaces = CommaList


def _notification_url(value: Any) -> Any:
    """The operator-wide webhook, held to the rule a ModelDeployment's own webhooks are (one the
    notifier's client can POST to), so a bad one stops the start with its flag named."""
    return value if value is None else check_http_url(str(value), "--notification-url")


class Settings(BaseSettings):
    """The ModelDeploy operator. Every flag is also the environment variable MODELDEPLOY_<NAME> (except
    --namespace: MODELDEPLOY_NAMESPACES, a comma list; --verbose: MODELDEPLOY_DEBUG); a flag wins over its
    variable. Booleans: 1/0, true/false, yes/no, on/off."""

    # Built by load_settings(), which stacks the flags over the environment (each variable under its own
    # name, see _Environment); constructed directly it reads pydantic-settings' default sources.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        cli_prog_name="python -m modeldeploy",
        cli_kebab_case=True,
        cli_exit_on_error=True,
        cli_hide_none_type=True,
        cli_shortcuts={"namespace": "n", "verbose": "v"},
    )

    namespace: Namespaces = Field(
        default_factory=list,
        description="watch only these namespaces (repeatable, or a comma list); default: cluster-wide",
    )
    standalone: CliToggleFlag[bool] = Field(False, description="no peering (only for a single replica)")
    priority: int = Field(
        default_factory=random_priority,
        description="kopf's peering priority: a replica pauses while a live peer has a higher or equal one; "
        "default: random in 1..2^30, so that exactly one replica is active; 0 is kopf's default, below "
        "every random one",
    )
    peering_name: str = Field("modeldeploy", min_length=1, description="the (Cluster)KopfPeering object")
    peering_lifetime: int = Field(30, ge=1, description="seconds a peer's keep-alive counts")
    workers: int = Field(8, ge=1, description="reconciles run at once")
    bind_host: str = Field(
        "127.0.0.1", description="address of the metrics and health endpoints (env also POD_IP)"
    )
    metrics_port: int = Field(8480, ge=0, le=65535, description="/metrics")
    health_port: int = Field(8481, ge=0, le=65535, description="/healthz, kopf's liveness endpoint (0: none)")
    prometheus_url: str = Field(
        "http://127.0.0.1:9090", description="where spec.rollout.analysis.prometheusURL is unset"
    )
    create_peering: CliImplicitFlag[bool] = Field(
        True, description="create the peering object when it is missing"
    )
    watch_httproutes: CliImplicitFlag[bool] = Field(
        True,
        description="watch the HTTPRoutes of gatewayAPI mode so that an edited or deleted one is repaired "
        "at once, and the EndpointSlices of its revision Services so that a canary gets its weight once the "
        "gateway can know an endpoint of it (needs list/watch on httproutes and endpointslices)",
    )
    resync_period: float = Field(
        DEFAULT_PERIOD,
        ge=0,
        description="seconds between two LISTs of the children that repair what the watches missed (a "
        "child deleted during a watch outage); 0 turns them off",
    )
    stuck_after: float = Field(
        300.0,
        gt=0,
        description="liveness fails when one reconcile has run this many seconds (it waits on nothing but "
        "the apiserver, each call bounded by 35 s)",
    )
    prometheus_ca_file: str | None = Field(
        None, description="PEM bundle to verify https Prometheus URLs against (default: the system's)"
    )
    prometheus_insecure_skip_verify: CliToggleFlag[bool] = Field(
        False, description="do not verify the TLS certificate of --prometheus-url (only when asked)"
    )
    prometheus_bearer_token_file: str | None = Field(
        None,
        description="a file (a mounted Secret) whose content is sent as a bearer token to --prometheus-url "
        "only, never to a ModelDeployment's own prometheusURL",
    )
    notification_url: Annotated[str | None, BeforeValidator(_notification_url)] = Field(
        None,
        description="a webhook told of every ModelDeployment's rollout events (the cluster-wide default; "
        "each ModelDeployment may add its own, spec.rollout.notifications)",
    )
    notification_format: Literal["json", "slack", "cloudevents"] = Field(
        "json", description="the format of --notification-url's bodies"
    )
    notification_signing_key_file: str | None = Field(
        None,
        description="a file (a mounted Secret) whose bytes sign every notification, under a key derived "
        "per namespace (kubectl modeldeploy notification-key)",
    )
    notification_allowed_hosts: CommaList = Field(
        default_factory=list,
        description="host patterns (fnmatch, a comma list) a webhook may name; default: any host",
    )
    verbose: CliToggleFlag[bool] = Field(False, description="debug logging")

    def __init__(self, **values: Any) -> None:  # typed for load_settings' _build_sources
        super().__init__(**values)


def env_name(setting: str) -> str:
    """The environment variable of ``setting``."""
    return ENV_NAMES.get(setting, ENV_PREFIX + setting.upper())


def flag_name(setting: str) -> str:
    return "--" + setting.replace("_", "-")


class _Environment(EnvSettingsSource):
    """The settings' variables in ``environ``, each under its own name (:func:`env_name`), empty ones left
    out; ``POD_IP`` where ``MODELDEPLOY_BIND_HOST`` is unset."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(Settings, env_ignore_empty=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        names = {env_name(s): s for s in Settings.model_fields}
        found = {(ENV_PREFIX + names[k]).lower(): v for k, v in self._environ.items() if k in names and v}
        pod_ip = self._environ.get("POD_IP")
        if pod_ip:
            found.setdefault(f"{ENV_PREFIX}bind_host".lower(), pod_ip)
        return found


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Flags (``argv`` without the program name; the process's own when None) over the variables of
    ``environ`` (the process environment when None) over the defaults. Raises :class:`SettingsError`."""
    flags: CliSettingsSource[Settings] = CliSettingsSource(
        Settings, cli_parse_args=list(argv) if argv is not None else True
    )
    env = _Environment(os.environ if environ is None else environ)
    from_flags = set(flags())
    try:
        return Settings(_build_sources=((flags, env), {}))
    except ValidationError as e:
        raise SettingsError(_describe(e, from_flags)) from None


def _describe(e: ValidationError, from_flags: set[str]) -> str:
    """One line per error, naming the flag or the variable the bad value came from."""
    out = []
    for err in e.errors(include_url=False):
        setting = str(err["loc"][0]) if err["loc"] else ""
        where = flag_name(setting) if setting in from_flags else env_name(setting)
        out.append(f"{where}: {err['msg']} (got {err['input']!r})")
    return "; ".join(out)
