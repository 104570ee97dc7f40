"""The real nodes' pod network (testbed/network.py), on this machine's own links (root).

Every pod on a node reaches the host — the API server, Prometheus' scrapes answered — through
its node's bridge, whose MAC address each pod has cached as its gateway's. A bridge with no
address of its own takes the lowest of its ports' and changes it as pods come and go: the
other pods' replies then go to an address nobody answers until their ARP entry expires
(tens of seconds), and the host sees them as dark though they run and are Ready."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

from testbed import network


def _address(link: str) -> str:
    return Path(f"/sys/class/net/{link}/address").read_text().strip()


def test_a_bridge_keeps_its_address_as_pods_come_and_go() -> None:
    suffix = secrets.token_hex(3)
    bridge = f"tkt{suffix}"
    ports = [f"tkp{suffix}{i}" for i in range(2)]
    network.create_bridge(bridge, f"10.254.{secrets.randbelow(250)}.1/32")
    try:
        first = _address(bridge)
        for port, mac in zip(ports, ("02:00:00:00:00:05", "02:00:00:00:00:02"), strict=True):
            subprocess.run(
                [
                    "ip",
                    "link",
                    "add",
                    port,
                    "address",
                    mac,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    f"{port}x",
                ],
                check=True,
            )
            subprocess.run(["ip", "link", "set", port, "master", bridge], check=True)
            assert _address(bridge) == first, f"a pod plugged in changed {bridge}'s address"
        network.delete_link(ports[1])
        assert _address(bridge) == first, f"a pod unplugged changed {bridge}'s address"
    finally:
        for link in (*ports, bridge):
            network.delete_link(link)
