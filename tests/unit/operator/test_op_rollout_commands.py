"""Driving a rollout by hand and what it leaves behind: the promote/abort/rollback commands (annotation and
kubectl plugin) and the typed history entries, old statuses included -- the reconciler against the
in-memory apiserver, a fake clock and a fake Prometheus (tests/unit/operator/md_canary.py)."""

from __future__ import annotations

import json

from md_canary import World, canary_md
from modeldeploy.analysis import ERROR_RATE
from modeldeploy.rollout_types import COMMAND_ANNOTATION


def command(w: World, **cmd) -> None:
    w.annotate(COMMAND_ANNOTATION, json.dumps(cmd))


# ---------------------------------------------------------------------------------------------- commands


def test_promote_moves_one_step_and_is_idempotent():
    w = World()
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    command(w, action="promote", revision=new, step=0)
    w.reconcile()
    assert w.status["step"] == 1
    assert COMMAND_ANNOTATION not in (w.raw["metadata"].get("annotations") or {})
    command(w, action="promote", revision=new, step=0)  # the same command again (e.g. replayed)
    w.reconcile()
    assert w.status["step"] == 1


def test_promote_full_skips_the_remaining_steps():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    command(w, action="promote", revision=new, full=True)
    w.reconcile()
    st = w.status
    assert st["stableRevision"] == new and st["previousRevision"] == old
    assert "by hand" in st["history"][-1]["reason"]


def test_abort_rolls_back_and_marks_the_revision_aborted():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    command(w, action="abort", revision=new)
    w.reconcile()
    st = w.status
    assert st["stableRevision"] == old and st["history"][-1]["outcome"] == "Aborted"
    assert w.pods(new) == [] and st["phase"] == "Degraded"


def test_manual_rollback_fails_back_to_the_warm_previous():
    w = World(canary_md(bakeTime="0s"))
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(35)
    assert w.status["stableRevision"] == new
    command(w, action="rollback", revision=new)
    w.reconcile()
    st = w.status
    assert st["stableRevision"] == old and st["history"][-1]["outcome"] == "FailedBack"
    assert "manual" in st["history"][-1]["reason"] and w.pods_in_traffic(old) == 2
    # without a warm revision a rollback is refused with a warning, nothing changes
    command(w, action="rollback", revision=old)
    w.reconcile()
    assert w.status["stableRevision"] == old and "RollbackImpossible" in w.event_reasons()


def test_a_stale_command_is_dropped():
    w = World()
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    command(w, action="abort", revision="someotherrev")
    w.reconcile()
    assert w.status["canaryRevision"] == new
    assert COMMAND_ANNOTATION not in (w.raw["metadata"].get("annotations") or {})


# ---------------------------------------------------------------------------------------------- plugin


def plugin(w: World, *argv: str) -> int:
    from modeldeploy import cli

    args = cli.build_parser().parse_args([*argv, "-n", "default"])
    return int(args.func(w.fake, args))


def test_plugin_commands_drive_the_rollout(capsys):
    w = World()
    old = w.deploy_first()
    assert plugin(w, "promote", "minilm") == 1  # no canary
    assert plugin(w, "rollback", "minilm") == 1  # nothing warm
    new = w.new_version("2")
    w.reconcile()
    assert plugin(w, "pause", "minilm") == 0
    assert w.raw["spec"]["rollout"]["paused"] is True
    w.reconcile()
    assert w.status["phase"] == "Paused"
    assert plugin(w, "promote", "minilm") == 0
    w.reconcile()
    assert w.status["step"] == 1
    assert plugin(w, "resume", "minilm") == 0
    assert plugin(w, "promote", "minilm", "--full") == 0
    w.reconcile()
    assert w.status["stableRevision"] == new and w.status["previousRevision"] == old
    assert plugin(w, "rollback", "minilm") == 0
    w.reconcile()
    assert w.status["stableRevision"] == old and w.status["history"][-1]["outcome"] == "FailedBack"
    v3 = w.new_version("3")
    w.reconcile()
    assert plugin(w, "abort", "minilm") == 0
    w.reconcile()
    assert w.status["history"][-1]["revision"] == v3 and w.status["history"][-1]["outcome"] == "Aborted"
    assert plugin(w, "status", "minilm") == 0
    out = capsys.readouterr().out
    assert "Aborted" in out and "FailedBack" in out


# ---------------------------------------------------------------------------------------------- history


def strip_kinds(w: World) -> None:
    """The status as an older operator wrote it: history entries without ``kind``."""
    for h in w.status["history"]:
        h.pop("kind")


def test_every_history_entry_says_what_it_means_in_a_typed_kind():
    w = World()
    w.deploy_first()
    v2 = w.new_version("2")
    w.reconcile()
    w.run_for(35)  # promoted
    v3 = w.new_version("3")
    w.reconcile()
    w.new_version("4")  # supersedes v3
    w.reconcile()
    command(w, action="abort")
    w.reconcile()
    hist = w.status["history"]
    assert [(h["outcome"], h["kind"]) for h in hist] == [
        ("Deployed", "Deployed"),
        ("Promoted", "Promoted"),
        ("Superseded", "Superseded"),
        ("Aborted", "Aborted"),
    ]
    assert hist[1]["revision"] == v2 and hist[2]["revision"] == v3


def test_a_status_written_before_history_kinds_bakes_and_fails_back_the_same():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(35)
    assert w.status["stableRevision"] == new and w.status["previousRevision"] == old
    strip_kinds(w)
    w.rec = w.new_operator()  # the new operator reads what the old one wrote
    w.prom.values[new] = {ERROR_RATE: 0.3}
    w.run_for(10)
    st = w.status
    assert st["stableRevision"] == old
    assert [(h["outcome"], h["kind"]) for h in st["history"]] == [
        ("Deployed", "Deployed"),
        ("Promoted", "Promoted"),
        ("FailedBack", "FailedBack"),
    ]


def test_a_status_written_before_history_kinds_keeps_a_failed_revision_out():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {ERROR_RATE: 0.2}
    w.reconcile()
    w.run_for(10)
    assert w.status["history"][-1]["outcome"] == "RolledBack"
    strip_kinds(w)
    w.rec = w.new_operator()
    w.fake.writes.clear()
    w.run_for(30)
    st = w.status
    assert st["stableRevision"] == old and "canaryRevision" not in st
    assert w.cond("Degraded")["reason"] == "RolledBack" and w.pods(new) == []
    # the legacy history reads as the new one: nothing to rewrite
    assert not [wr for wr in w.fake.writes if wr[1] == "ModelDeployment/status"]
