"""A real node's network: a bridge and a CNI network of its own per node, on a /16 of this
machine no route overlaps; pods on different nodes reach each other through the host."""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import subprocess
from typing import Any

from testbed.errors import ClusterError
from testbed.host import run


def addresses_in_use() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    out = run(["ip", "-4", "-o", "route", "show", "table", "all"], "ip route")
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for line in out.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("local", "broadcast", "unreachable", "multicast"):
            word = line.split()[1]
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(word if word != "default" else "0.0.0.0/32"))
    return nets


def pick_supernet(tries: int = 64) -> ipaddress.IPv4Network:
    """A free 10.x.0.0/16 for this cluster's pods: no route on the machine overlaps it."""
    used = addresses_in_use()
    for _ in range(tries):
        candidate = ipaddress.IPv4Network(f"10.{100 + secrets.randbelow(150)}.0.0/16")
        if not any(candidate.overlaps(net) for net in used if net.prefixlen > 0):
            return candidate
    raise ClusterError("real nodes", "no free 10.x.0.0/16 for pod networks")


def create_bridge(name: str, address: str) -> None:
    """A bridge with a MAC address of its own, derived from its IPv4 ``address`` (unique on
    this machine): without one, Linux gives a bridge the lowest of its ports' addresses and
    changes it as pods are plugged in and out, and every other pod's cached gateway address
    goes dead until its ARP entry expires — tens of seconds in which the host cannot reach it.
    """
    octets = ipaddress.IPv4Interface(address).ip.packed
    mac = "02:fe:" + ":".join(f"{octet:02x}" for octet in octets)  # locally administered
    run(["ip", "link", "add", "name", name, "address", mac, "type", "bridge"], f"bridge {name}")
    add_address(name, address)
    run(["ip", "link", "set", name, "up"], f"bridge {name}")


def add_address(link: str, address: str) -> None:
    run(["ip", "addr", "add", address, "dev", link], f"address {address} on {link}")


def delete_link(name: str) -> None:
    subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)


def ports_of(bridge: str) -> list[str]:
    """The links attached to ``bridge`` (the host ends of its pods' veth pairs)."""
    out = subprocess.run(
        ["ip", "-o", "link", "show", "master", bridge], capture_output=True, text=True, check=False
    ).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def unplug_pods(bridge: str) -> list[str]:
    """Take every pod off ``bridge``, as a reboot does, and return the ports deleted: the host
    end of each veth pair goes (the pair with it, even when its namespace outlived the
    deletion of its name), and the bridge forgets the addresses it learnt. Suspected cause of
    a pod started after a node's restart being unreachable (connections timed out): a pod
    from before the power loss still on the bridge with the same address (the node's IPAM
    state goes with the power loss)."""
    ports = ports_of(bridge)
    for port in ports:
        delete_link(port)
    subprocess.run(["ip", "neigh", "flush", "dev", bridge], capture_output=True, check=False)
    return ports


def delete_netns_in(subnet: ipaddress.IPv4Network) -> None:
    """Delete the named network namespaces whose pod address is in ``subnet``."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith("cni-"):
            continue
        addrs = subprocess.run(
            ["ip", "-n", name, "-4", "-o", "addr"], capture_output=True, text=True, check=False
        ).stdout
        for word in addrs.split():
            if "/" in word:
                with contextlib.suppress(ValueError):
                    if ipaddress.ip_interface(word).ip in subnet:
                        subprocess.run(["ip", "netns", "delete", name], check=False)
                        break


def cni_conflist(
    name: str, bridge: str, subnet: ipaddress.IPv4Network, gateway: str, ipam_dir: str
) -> dict[str, Any]:
    """``bridge`` + ``host-local`` on the node's /24 + ``portmap``; each node its own network
    name (host-local keeps its leases per name)."""
    return {
        "cniVersion": "0.4.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(subnet), "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": ipam_dir,
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
