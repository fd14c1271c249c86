"""PeeringGate.decide is a copy of kopf's peering rule (kopf decides inside its own watch of the peering
object; the operator asks the same question before a timer-driven reconcile). This pins the copy to kopf
1.45's own code: for random peering objects, kopf's process_peering_event pauses this replica exactly when
decide() says it is not the active one."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._core.engines.peering import Identity, process_peering_event
from modeldeploy.controller import PeeringGate


def kopf_says_active(peers: dict[str, Any], identity: str, priority: int) -> bool:
    settings = kopf.OperatorSettings()
    settings.peering.name = "modeldeploy"
    settings.peering.priority = priority
    paused = aiotoggles.Toggle(False)
    no_wait = asyncio.Event()
    no_wait.set()  # kopf would sleep until the blocking peers expire: wake it at once

    async def run() -> None:
        await process_peering_event(
            raw_event={"type": "MODIFIED", "object": {"metadata": {"name": "modeldeploy"}, "status": peers}},
            namespace=None,
            resource=None,  # type: ignore[arg-type]  # used only to clean or touch, both off here
            identity=Identity(identity),
            settings=settings,
            autoclean=False,
            stream_pressure=no_wait,
            conflicts_found=paused,
        )

    asyncio.run(run())
    return paused.is_off()


def random_peers(rng: random.Random, now: dt.datetime) -> dict[str, Any]:
    peers: dict[str, Any] = {}
    for i in range(rng.randrange(0, 4)):
        lifetime = rng.choice([10, 30, 60])
        # clearly alive or clearly dead: never within seconds of the deadline, so the two clocks agree
        age = rng.choice([0, lifetime - 5, lifetime + 5, 3 * lifetime])
        info: dict[str, Any] = {
            "priority": rng.choice([0, 1, 5, 6, 100]),
            "lifetime": lifetime,
            "lastseen": (now - dt.timedelta(seconds=age)).isoformat(),
        }
        if rng.random() < 0.1:
            del info["lifetime"]  # kopf's default (60 s) in both
        if rng.random() < 0.1:
            del info["lastseen"]  # kopf: seen now
        peers[rng.choice(["me", f"peer-{i}"])] = info
    return peers


@pytest.mark.parametrize("seed", range(5))
def test_decide_agrees_with_kopfs_own_peering_rule(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(60):
        now = dt.datetime.now(dt.UTC)
        peers = random_peers(rng, now)
        priority = rng.choice([0, 1, 5, 6, 100])
        assert PeeringGate.decide(peers, "me", priority, now) is kopf_says_active(peers, "me", priority), (
            peers
        )
