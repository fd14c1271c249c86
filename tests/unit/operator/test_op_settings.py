"""The operator's settings (modeldeploy.settings): flags over MODELDEPLOY_* variables over defaults, read
and refused one way (docs/operator.md, "Running it")."""

from __future__ import annotations

import pytest
from modeldeploy import operator
from modeldeploy.settings import SettingsError, load_settings


def test_defaults_with_no_flags_and_an_empty_environment() -> None:
    s = load_settings([], {})
    assert s.namespace == [] and not s.standalone and s.create_peering and s.watch_httproutes
    assert (s.peering_name, s.peering_lifetime, s.workers) == ("modeldeploy", 30, 8)
    assert (s.bind_host, s.metrics_port, s.health_port) == ("127.0.0.1", 8480, 8481)
    assert s.prometheus_url == "http://127.0.0.1:9090"
    assert (s.resync_period, s.stuck_after) == (300.0, 300.0)
    assert s.prometheus_ca_file is None and s.prometheus_bearer_token_file is None
    assert not s.prometheus_insecure_skip_verify and not s.verbose


EVERY_VARIABLE = {
    "MODELDEPLOY_NAMESPACES": "team-a, team-b",
    "MODELDEPLOY_STANDALONE": "1",
    "MODELDEPLOY_PRIORITY": "42",
    "MODELDEPLOY_PEERING_NAME": "md-peering",
    "MODELDEPLOY_PEERING_LIFETIME": "12",
    "MODELDEPLOY_WORKERS": "3",
    "MODELDEPLOY_BIND_HOST": "10.0.0.5",
    "MODELDEPLOY_METRICS_PORT": "9100",
    "MODELDEPLOY_HEALTH_PORT": "0",
    "MODELDEPLOY_PROMETHEUS_URL": "https://prom.example",
    "MODELDEPLOY_CREATE_PEERING": "false",
    "MODELDEPLOY_WATCH_HTTPROUTES": "0",
    "MODELDEPLOY_RESYNC_PERIOD": "0",
    "MODELDEPLOY_STUCK_AFTER": "60.5",
    "MODELDEPLOY_PROMETHEUS_CA_FILE": "/ca.pem",
    "MODELDEPLOY_PROMETHEUS_INSECURE_SKIP_VERIFY": "true",
    "MODELDEPLOY_PROMETHEUS_BEARER_TOKEN_FILE": "/token",
    "MODELDEPLOY_NOTIFICATION_URL": "https://hooks.example/rollouts",
    "MODELDEPLOY_NOTIFICATION_FORMAT": "cloudevents",
    "MODELDEPLOY_NOTIFICATION_SIGNING_KEY_FILE": "/key",
    "MODELDEPLOY_NOTIFICATION_ALLOWED_HOSTS": "hooks.example, *.slack.com",
    "MODELDEPLOY_DEBUG": "1",
}
READ_FROM_EVERY_VARIABLE = {
    "namespace": ["team-a", "team-b"],
    "standalone": True,
    "priority": 42,
    "peering_name": "md-peering",
    "peering_lifetime": 12,
    "workers": 3,
    "bind_host": "10.0.0.5",
    "metrics_port": 9100,
    "health_port": 0,
    "prometheus_url": "https://prom.example",
    "create_peering": False,
    "watch_httproutes": False,
    "resync_period": 0.0,
    "stuck_after": 60.5,
    "prometheus_ca_file": "/ca.pem",
    "prometheus_insecure_skip_verify": True,
    "prometheus_bearer_token_file": "/token",
    "notification_url": "https://hooks.example/rollouts",
    "notification_format": "cloudevents",
    "notification_signing_key_file": "/key",
    "notification_allowed_hosts": ["hooks.example", "*.slack.com"],
    "verbose": True,
}


def test_every_setting_is_read_from_its_variable() -> None:
    assert load_settings([], EVERY_VARIABLE).model_dump() == READ_FROM_EVERY_VARIABLE


def test_every_setting_is_read_from_its_flag_and_a_flag_wins_over_its_variable() -> None:
    argv = [
        "-n", "x", "--namespace", "y",
        "--no-watch-httproutes", "--create-peering", "--priority", "7", "--workers", "2",
        "--bind-host", "0.0.0.0", "--stuck-after", "9", "--peering-name", "p", "--peering-lifetime", "5",
        "--metrics-port", "1", "--health-port", "2", "--prometheus-url", "http://p", "--resync-period", "3",
        "--prometheus-ca-file", "/c", "--prometheus-bearer-token-file", "/t",
    ]  # fmt: skip
    s = load_settings(argv, {**EVERY_VARIABLE, "MODELDEPLOY_WATCH_HTTPROUTES": "1"})
    assert s.namespace == ["x", "y"]  # the flags' namespaces, not added to the variable's
    assert (s.watch_httproutes, s.create_peering, s.priority, s.workers) == (False, True, 7, 2)
    assert (s.bind_host, s.stuck_after, s.peering_name, s.peering_lifetime) == ("0.0.0.0", 9.0, "p", 5)
    assert (s.metrics_port, s.health_port, s.prometheus_url, s.resync_period) == (1, 2, "http://p", 3.0)
    assert (s.prometheus_ca_file, s.prometheus_bearer_token_file) == ("/c", "/t")
    switches = load_settings(["--standalone", "-v", "--prometheus-insecure-skip-verify"], {})
    assert switches.standalone and switches.verbose and switches.prometheus_insecure_skip_verify
    assert load_settings(["-n", "a,b"], {}).namespace == ["a", "b"]


@pytest.mark.parametrize(
    ("spelling", "value"),
    [(v, True) for v in ("1", "true", "True", "yes", "on")]
    + [(v, False) for v in ("0", "false", "NO", "off")],
)
def test_booleans_are_read_one_way_for_every_variable(spelling: str, value: bool) -> None:
    s = load_settings(
        [],
        {
            "MODELDEPLOY_STANDALONE": spelling,
            "MODELDEPLOY_WATCH_HTTPROUTES": spelling,
            "MODELDEPLOY_DEBUG": spelling,
            "MODELDEPLOY_PROMETHEUS_INSECURE_SKIP_VERIFY": spelling,
        },
    )
    assert [s.standalone, s.watch_httproutes, s.verbose, s.prometheus_insecure_skip_verify] == [value] * 4


@pytest.mark.parametrize(
    ("env", "argv", "named"),
    [
        ({"MODELDEPLOY_STANDALONE": "maybe"}, [], "MODELDEPLOY_STANDALONE: Input should be a valid boolean"),
        ({"MODELDEPLOY_DEBUG": "2"}, [], "MODELDEPLOY_DEBUG: Input should be a valid boolean"),
        ({"MODELDEPLOY_PRIORITY": "high"}, [], "MODELDEPLOY_PRIORITY: Input should be a valid integer"),
        (
            {"MODELDEPLOY_PRIORITY": "1"},
            ["--priority", "high"],
            "--priority: Input should be a valid integer",
        ),
        ({"MODELDEPLOY_WORKERS": "0"}, [], "MODELDEPLOY_WORKERS: Input should be greater than or equal to 1"),
        ({}, ["--metrics-port", "70000"], "--metrics-port: Input should be less than or equal to 65535"),
        ({"MODELDEPLOY_RESYNC_PERIOD": "-1"}, [], "MODELDEPLOY_RESYNC_PERIOD: Input should be greater"),
    ],
)
def test_a_bad_value_is_refused_naming_where_it_came_from(
    env: dict[str, str], argv: list[str], named: str
) -> None:
    with pytest.raises(SettingsError) as e:
        load_settings(argv, env)
    assert str(e.value).startswith(named), str(e.value)


def test_the_operator_stops_at_start_on_a_bad_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MODELDEPLOY_WATCH_HTTPROUTES", "perhaps")
    assert operator.main([]) == 2
    assert "MODELDEPLOY_WATCH_HTTPROUTES" in capsys.readouterr().err


def test_priority_zero_is_kopfs_priority_zero_from_the_flag_and_the_variable() -> None:
    assert load_settings([], {"MODELDEPLOY_PRIORITY": "0"}).priority == 0
    assert load_settings(["--priority", "0"], {}).priority == 0
    assert operator.kopf_settings(load_settings([], {"MODELDEPLOY_PRIORITY": "0"})).peering.priority == 0


def test_an_unset_or_empty_priority_is_drawn_at_random() -> None:
    drawn = [load_settings([], {"MODELDEPLOY_PRIORITY": ""}).priority for _ in range(20)]
    assert all(1 <= p <= 2**30 for p in drawn) and len(set(drawn)) > 1, drawn


def test_empty_variables_count_as_unset_and_pod_ip_stands_in_for_the_bind_host() -> None:
    s = load_settings([], {"MODELDEPLOY_NAMESPACES": "", "MODELDEPLOY_STANDALONE": "", "POD_IP": "10.1.2.3"})
    assert s.namespace == [] and s.standalone is False and s.bind_host == "10.1.2.3"
    both = load_settings([], {"MODELDEPLOY_BIND_HOST": "10.9.9.9", "POD_IP": "10.1.2.3"})
    assert both.bind_host == "10.9.9.9"


def test_variables_that_are_no_setting_are_left_to_whoever_reads_them() -> None:
    """The serving pods' template variables are read by the builders; the old spellings of two settings
    (MODELDEPLOY_NAMESPACE, MODELDEPLOY_VERBOSE) were never variables and are not read."""
    s = load_settings(
        [],
        {
            "MODELDEPLOY_DEFAULT_IMAGE": "img",
            "MODELDEPLOY_NAMESPACE": "team-a",
            "MODELDEPLOY_VERBOSE": "1",
        },
    )
    assert s.namespace == [] and s.verbose is False


@pytest.mark.parametrize("url", ["http://[::1/x", "http://h:99999/", "http://user@h/", "ftp://h/"])
def test_a_notification_url_the_notifier_cannot_post_to_stops_the_start_naming_the_flag(url: str) -> None:
    with pytest.raises(SettingsError, match="--notification-url"):
        load_settings(["--notification-url", url], environ={})
    assert load_settings(["--notification-url", "http://[::1]:8080/x"], environ={}).notification_url
