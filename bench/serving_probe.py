"""The inference server with a probe on its batching core, for bench/serving.py's tail measurements.

    python -m bench.serving_probe PROBE_FILE [--v1] [modelserver arguments ...]

runs ``modelserver.server.main`` -- the very server ``python -m modelserver`` runs, same settings, same code
path (with ``--v1``: but the batching queue of ``adaptive-v1``, bench/batching_v1.py, the baseline that is
no server setting) -- and appends one JSON line to PROBE_FILE per finished batch (``BatchQueue.record``):
``[formed_at, inference_seconds, padded_length, [[queue_wait_s, length], ...]]``. ``formed_at`` is the
server's ``time.monotonic()``, the machine-wide monotonic clock, so the benchmark can cut the lines by the
time of its own load phases. A queue wait is the time from admission (after tokenisation) to the batch's
formation, as ``modelserver_queue_wait_seconds`` measures it; the server exposes no per-item maximum, which
the tail goal (longest wait against longest batch) needs.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(argv: list[str]) -> int:
    from modelserver import batching, service
    from modelserver.server import main as serve

    if not argv:
        print(
            "usage: python -m bench.serving_probe PROBE_FILE [--v1] [modelserver arguments]", file=sys.stderr
        )
        return 2
    if argv[1:2] == ["--v1"]:
        from bench.batching_v1 import V1Queue

        service.BatchQueue = V1Queue  # type: ignore[misc]
        argv = [argv[0], *argv[2:]]
    out = open(argv[0], "a", buffering=1)  # noqa: SIM115 - open for the life of the process
    record = batching.BatchQueue.record

    def probed(self: batching.BatchQueue, batch: batching.Batch, seconds: float) -> None:
        record(self, batch, seconds)
        items: list[Any] = [[round(batch.formed_at - i.arrival, 6), i.length] for i in batch.items]
        out.write(json.dumps([batch.formed_at, round(seconds, 6), batch.padded_length, items]) + "\n")

    batching.BatchQueue.record = probed  # type: ignore[method-assign]
    try:
        return serve(argv[1:])
    finally:
        out.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
