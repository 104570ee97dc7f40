"""The job's torchft Lighthouse, for ``failurePolicy.recovery: live``: a process of its own.

Before every step each replica group (a pod) asks the Lighthouse for a quorum; it answers with
the groups alive, which of them are behind and whom they copy the state from. A group whose
heartbeats stop for ``--heartbeat-timeout-ms`` is left out of the next quorum: that, not a
restart, is how the survivors go on without a lost pod. It holds no training state, so its
own loss costs the groups only their next quorum: they wait for it to come back, and a group
that the new Lighthouse answers alone before the others' heartbeats are in asks again
(``torchkube.trainer.live.QuorumMembers``).

Run: ``python -m torchkube.elastic.lighthouse --port 29510``.
"""

import argparse
import logging
import signal
import threading

from torchkube.api.contract import LIVE_COLLECTIVE_SECONDS

log = logging.getLogger("torchkube.lighthouse")

HEARTBEAT_TIMEOUT_MS = 2000
"""A group silent this long is gone (torchft's default is 5 s). Heartbeats come every 100 ms
from a thread of their own, so a long step never looks like a loss; this is most of what a
lost pod costs the survivors' next step."""
JOIN_TIMEOUT_MS = 2 * LIVE_COLLECTIVE_SECONDS * 1000
"""How long a quorum waits for groups that heartbeat but have not asked yet: a group held in a
collective with a lost peer asks once the collective gives up, up to ``LIVE_COLLECTIVE_SECONDS``
after the others began to wait, so twice that (torchft's own default) leaves it room; a writer
saving a checkpoint asks once it is written. Groups that all asked are answered at once, so a
step's quorum never waits for it; a quorum formed without such a group — of groups all behind
it — would take the job back to its checkpoint beside it."""
QUORUM_TICK_MS = 10
"""How often the Lighthouse looks at a quorum no request completes, which is how a lost
group's heartbeat timeout becomes the survivors' next quorum: torchft's 100 ms adds up to
that much to their longest step. A quorum every group asked for is answered at once."""


def serve(
    port: int, stop: threading.Event, heartbeat_timeout_ms: int, join_timeout_ms: int
) -> None:
    """Serve until ``stop`` is set. Importing torchft here keeps ``--help`` instant."""
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(
        bind=f"0.0.0.0:{port}",  # IPv4, as the store: a pod may have no IPv6
        min_replicas=1,  # one group alive is enough to go on
        join_timeout_ms=join_timeout_ms,
        quorum_tick_ms=QUORUM_TICK_MS,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
    )
    log.info("torchft lighthouse listening at %s", server.address())
    stop.wait()
    log.info("torchft lighthouse stopping")
    server.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=29510, help="TCP port to serve on")
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=HEARTBEAT_TIMEOUT_MS)
    parser.add_argument("--join-timeout-ms", type=int, default=JOIN_TIMEOUT_MS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(args.port, stop, args.heartbeat_timeout_ms, args.join_timeout_ms)


if __name__ == "__main__":
    main()
