"""The job's rendezvous store: a c10d TCPStore server in its own small pod.

torchrun's c10d backend keeps the rendezvous state in a TCPStore. By default the agent whose
host matches the endpoint starts that store in-process, so the job dies with that worker. The
operator instead points every agent at this process (``is_host=false``), which does nothing
but serve the store; it holds no training state, so a crash costs only a re-rendezvous.

Run: ``python -m torchkube.elastic.store --port 29400``.
"""

import argparse
import logging
import signal
import threading
from datetime import timedelta

log = logging.getLogger("torchkube.store")


def serve(port: int, stop: threading.Event) -> None:
    """Serve until ``stop`` is set. Importing torch here keeps ``--help`` instant."""
    from torch.distributed import TCPStore

    store = TCPStore(
        "0.0.0.0",
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(hours=24),
        multi_tenant=True,
        use_libuv=True,
    )
    log.info("rendezvous store listening on port %d", store.port)
    stop.wait()
    log.info("rendezvous store stopping")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=29400, help="TCP port to serve on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(args.port, stop)


if __name__ == "__main__":
    main()
