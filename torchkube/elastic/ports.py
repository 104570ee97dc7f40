"""An agent's own port, held while it lives, and probes of other agents' ports.

A process that is gone while its machine is up — a pod deleted or evicted, a SIGKILL, the
OOM killer — leaves its listening port to the kernel, which refuses every connection to it
at once. A probe of that port tells such a loss in one round trip, where the missing beats
of a counter (:mod:`torchkube.elastic.liveness`) take half a second. A refusal is trusted
only from an agent whose port answered once (``liveness.Watch`` keeps which did): a
network that rejects connections (a firewall's REJECT rule sends the same refusal) must not
make a live agent look dead. A machine that answers nothing (a lost node) gives no evidence;
the beats' silence still decides there.
"""

import contextlib
import enum
import errno
import ipaddress
import selectors
import socket
import threading
import time
from collections.abc import Mapping
from typing import TypeVar

PROBE_SECONDS = 0.1
"""How long probes wait for their answers, all of them together."""

K = TypeVar("K")


class Probe(enum.Enum):
    ANSWERED = "answered"
    """The port accepted: a process holds it."""
    REFUSED = "refused"
    """Nobody holds the port (or a network in between rejects the connection)."""
    NO_ANSWER = "no answer"
    """Nothing came back in time, or the probe could not be sent: no evidence."""


class AgentPort:
    """A listening port of this process, answered (accepted and closed) by a thread of its
    own until :meth:`close`. Best effort: a host where no port can be opened has none
    (:attr:`number` None), and its agent is judged by its beats alone."""

    def __init__(self) -> None:
        self._closed = threading.Event()
        self._socket = _listen()
        self.number = None if self._socket is None else int(self._socket.getsockname()[1])
        if self._socket is not None:
            threading.Thread(target=self._answer, name="torchkube-port", daemon=True).start()

    def close(self) -> None:
        """From now on the kernel refuses every connection to the port."""
        self._closed.set()
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept
            self._socket.close()

    def _answer(self) -> None:
        assert self._socket is not None
        while not self._closed.is_set():
            try:
                connection, _ = self._socket.accept()
            except OSError as error:  # closed, or short of file descriptors for a moment
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.01)
                continue
            connection.close()


def _listen() -> socket.socket | None:
    """A port on every address, IPv6 ones too where the host has them (a probe of an IPv6 pod
    address must not be refused by an IPv4-only socket); None where none can be opened."""
    if socket.has_dualstack_ipv6():
        with contextlib.suppress(OSError):
            return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    try:
        return socket.create_server(("", 0))
    except OSError:
        return None


def probeable(host: str) -> bool:
    """Whether ``host`` is an address to probe: an IP literal (a name would need a lookup,
    which has no deadline, and may resolve elsewhere than the agent's machine)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def probe(targets: Mapping[K, tuple[str, int]], timeout: float = PROBE_SECONDS) -> dict[K, Probe]:
    """Each target's answer to a connection, all of them tried at once and waited for
    together for at most ``timeout``."""
    results = {key: Probe.NO_ANSWER for key in targets}
    pending: dict[socket.socket, K] = {}
    with selectors.DefaultSelector() as selector:
        try:
            for key, (host, port) in targets.items():
                try:
                    address = ipaddress.ip_address(host)
                    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
                    sock = socket.socket(family, socket.SOCK_STREAM)
                except (ValueError, OSError):  # not an address; short of descriptors
                    continue
                pending[sock] = key
                sock.setblocking(False)
                code = sock.connect_ex((host, port))
                if code == errno.ECONNREFUSED:
                    results[key] = Probe.REFUSED
                elif code in (0, errno.EINPROGRESS):
                    selector.register(sock, selectors.EVENT_WRITE)
            deadline = time.monotonic() + timeout
            while selector.get_map():
                # a prober descheduled past its deadline still reads what completed meanwhile
                left = max(0.0, deadline - time.monotonic())
                for ready, _ in selector.select(left):
                    done = ready.fileobj
                    assert isinstance(done, socket.socket)
                    selector.unregister(done)
                    code = done.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code == 0:
                        results[pending[done]] = Probe.ANSWERED
                    elif code == errno.ECONNREFUSED:
                        results[pending[done]] = Probe.REFUSED
                if left == 0:
                    break
        finally:
            for sock in pending:
                sock.close()
    return results
