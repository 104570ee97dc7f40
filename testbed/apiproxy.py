"""The ``kubernetes`` Service's ClusterIP, reachable from pods on real nodes.

In-cluster clients (the operator as a pod) dial ``KUBERNETES_SERVICE_HOST:443``, the first
address of the Service range. A real cluster's kube-proxy turns that into the apiserver; here
there is none (its iptables chains are global to the machine, and two test clusters side by
side would rewrite each other's), so each real-node cluster gets a Service range inside its own
/16, this machine holds the ClusterIP on the cluster's DNS bridge, and this forwarder passes each
TCP connection on to the apiserver on loopback. TLS goes through untouched: the apiserver's
certificate names the ClusterIP, as kubeadm's does.

``python -m testbed.apiproxy LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT`` (run by
:class:`testbed.realnodes.RealNodes` as a :class:`testbed.process.Process`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction until EOF, then half-close, so a watch's long stream ends cleanly."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _serve(
    target: tuple[str, int], client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
) -> None:
    try:
        upstream_r, upstream_w = await asyncio.open_connection(*target)
    except OSError:
        client_w.close()
        return
    await asyncio.gather(_pipe(client_r, upstream_w), _pipe(upstream_r, client_w))
    for writer in (client_w, upstream_w):
        with contextlib.suppress(OSError):
            writer.close()


async def forward(listen: tuple[str, int], target: tuple[str, int]) -> None:
    """Accept on ``listen`` and connect each client to ``target`` until cancelled."""
    server = await asyncio.start_server(
        lambda r, w: _serve(target, r, w), listen[0], listen[1], reuse_address=True
    )
    print(f"forwarding {listen[0]}:{listen[1]} -> {target[0]}:{target[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    listen_host, listen_port, target_host, target_port = argv
    asyncio.run(forward((listen_host, int(listen_port)), (target_host, int(target_port))))


if __name__ == "__main__":
    main(sys.argv[1:])
