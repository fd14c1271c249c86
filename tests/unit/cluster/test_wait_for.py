"""localcluster.testing.wait_for: it polls through "not there yet" errors, but says what it swallowed --
in the timeout's message (a count per type and the last of each) and, when the predicate came true after
swallowing KeyError/IndexError, in one log line."""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import pytest
from localcluster.testing import WaitTimeout, wait_for


def raising(*outcomes: BaseException | object) -> Callable[[], object]:
    """A predicate that raises or returns each of ``outcomes`` in turn, then the last one forever."""
    queue = list(outcomes)

    def predicate() -> object:
        outcome = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return predicate


def test_the_timeout_counts_what_was_swallowed_per_type_with_the_last_of_each() -> None:
    predicate = raising(
        KeyError("status"),
        KeyError("conditions"),
        IndexError("list index out of range"),
        ConnectionRefusedError(111, "refused"),
        KeyError("phase"),
    )
    with pytest.raises(WaitTimeout) as exc:
        wait_for(predicate, timeout=0.3, interval=0.01, what="the pod Ready")
    message = str(exc.value)
    assert message.startswith("timed out after 0s waiting for 'the pod Ready'; last error: 'phase'")
    # the last outcome (KeyError('phase')) repeats until the deadline: KeyError leads, counted in full
    swallowed = message.split("; swallowed: ", 1)[1]
    parts = swallowed.split(", ")
    assert parts[0].startswith("KeyError x") and parts[0].endswith("(last: KeyError('phase'))")
    assert int(parts[0].split(" x", 1)[1].split(" ", 1)[0]) >= 3
    assert "IndexError x1 (last: IndexError('list index out of range'))" in swallowed
    assert "ConnectionRefusedError x1 (last: ConnectionRefusedError(111, 'refused'))" in swallowed


def test_a_timeout_with_nothing_swallowed_says_only_the_last_error() -> None:
    with pytest.raises(WaitTimeout) as exc:
        wait_for(lambda: False, timeout=0.05, interval=0.01, what="never")
    assert str(exc.value) == "timed out after 0s waiting for 'never'; last error: None"


def test_a_success_after_swallowed_key_errors_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    predicate = raising(KeyError("status"), IndexError("out of range"), KeyError("status"), "ready")
    with caplog.at_level(logging.INFO, logger="localcluster.testing"):
        assert wait_for(predicate, timeout=5, interval=0.001, what="the endpoint") == "ready"
    lines = [r.getMessage() for r in caplog.records if r.name == "localcluster.testing"]
    assert len(lines) == 1, lines
    assert "for 'the endpoint': true after 3 swallowed errors: " in lines[0]
    assert "KeyError x2 (last: KeyError('status'))" in lines[0]
    assert "IndexError x1 (last: IndexError('out of range'))" in lines[0]
    assert caplog.records[0].levelno == logging.WARNING


def test_a_success_after_transient_errors_only_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    predicate = raising(httpx.ConnectError("refused"), ConnectionResetError(104, "reset"), True)
    with caplog.at_level(logging.INFO, logger="localcluster.testing"):
        assert wait_for(predicate, timeout=5, interval=0.001) is True
    assert [r for r in caplog.records if r.name == "localcluster.testing"] == []


def test_a_success_at_once_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="localcluster.testing"):
        assert wait_for(lambda: 42, timeout=1) == 42
    assert caplog.records == []


def test_other_errors_are_not_swallowed() -> None:
    calls = []

    def predicate() -> bool:
        calls.append(1)
        raise TypeError("a bug")

    with pytest.raises(TypeError, match="a bug"):
        wait_for(predicate, timeout=5, interval=0.001)
    assert len(calls) == 1
