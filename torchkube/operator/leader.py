"""Leader election on a coordination.k8s.io Lease: several replicas, one of them acting.

Every replica watches and caches (kopf runs standalone in each), but only the holder of the
Lease reconciles. This is client-go's scheme: the holder renews the Lease every few seconds;
a replica that has seen the same holder and renew time for longer than the lease duration —
measured on its own clock, so replicas need no synchronised clocks — takes the Lease over
with an optimistic-concurrency update, and a holder that cannot renew within the renew
deadline stops acting before anyone else may start.

The local flag is not trusted alone: a replica paused longer than the lease (a GC pause, a
frozen VM) wakes up still believing it leads. Before it writes anything — a status, a
Workload, a child, a batch of pods — the controller calls :meth:`LeaderElection.fence`, which
reads the Lease and lets the writes through only if this replica still holds it with the
same number of transitions, renewed within the renew deadline on its own clock
(:func:`fence_refusal`): one read per reconcile that writes, and per batch of pod writes.
"""

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchkube.operator import metrics

log = logging.getLogger(__name__)

RELEASE_ATTEMPTS = 3
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def own_namespace(default: str = "default") -> str:
    """The namespace the operator pod runs in (where its Lease lives)."""
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as handle:
            return handle.read().strip() or default
    except OSError:
        return os.environ.get("POD_NAMESPACE", default)


def identity() -> str:
    """Unique per process: the pod name (or host) plus the pid."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"


class LostLeadership(RuntimeError):
    """The Lease went to another replica (or may have) while this one was about to write."""


@dataclass(frozen=True)
class Tenure:
    """This replica's hold on the Lease, as its last successful write left it."""

    transitions: int
    """The Lease's ``leaseTransitions`` after that write: any takeover since raises it."""
    renewed_at: float
    """``time.monotonic()`` just before that write was sent: the Lease is ours at least until
    the renew deadline after it (the others wait a whole lease duration, counted from later)."""


def fence_refusal(
    identity: str,
    tenure: Tenure | None,
    holder: str | None,
    transitions: int | None,
    now: float,
    deadline: float,
) -> str | None:
    """Why this replica must not write now, given the Lease as just read; ``None``: write.

    The holder and transitions say no other replica took the Lease since our last write of
    it; the renewal's age, on our own clock, says nobody may take it before we are done (a
    standby waits a whole lease duration, longer than the renew deadline)."""
    if tenure is None:
        return "this replica never led"
    if not holder:
        return "nobody holds the Lease"
    if holder != identity:
        return f"{holder} holds the Lease"
    if (transitions or 0) != tenure.transitions:
        changed = (transitions or 0) - tenure.transitions
        return f"the Lease changed hands {changed} times since this replica took it"
    age = now - tenure.renewed_at
    if age >= deadline:
        return f"not renewed for {age:.1f} s (deadline {deadline:.1f} s)"
    return None


class LeaderElection:
    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        name: str,
        lease_seconds: float = 15.0,
        renew_deadline_seconds: float = 10.0,
        retry_seconds: float = 2.0,
    ) -> None:
        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name = namespace, name
        self.identity = identity()
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline_seconds
        self.retry_seconds = retry_seconds
        self.leading = asyncio.Event()
        self.on_stopped_leading: list[Callable[[], None]] = []
        """Called on the event loop when this replica stops leading while it runs on."""
        self._tenure: Tenure | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._observed: tuple[str | None, str | None] = (None, None)
        self._observed_at = 0.0
        self._renewed_at = 0.0
        # One Lease call at a time, and none after the release: a renew still in flight when
        # shutdown cancels ``run`` (a thread cannot be cancelled) would otherwise write the
        # Lease between the release's read and write (the release then fails with 409), or
        # read the released Lease and take it again — either way the standby waits a full
        # lease duration for a leader that is gone.
        self._lease_lock = threading.Lock()
        self._released = False

    async def run(self) -> None:
        """Acquire, renew, and step down when renewing fails past the deadline — or at once
        when the Lease shows another holder.

        The deadline is kept even while a renew call hangs: the call is given only the time
        left before it, so a replica cut off from the apiserver stops acting before another
        one may take the Lease over (lease duration > renew deadline)."""
        self._loop = asyncio.get_running_loop()
        metrics.LEADING.set(0)
        while True:
            held: bool | None = None
            budget = self.renew_deadline
            if self.leading.is_set():
                budget = max(0.1, self._renewed_at + self.renew_deadline - time.monotonic())
            try:
                held = await asyncio.wait_for(
                    asyncio.to_thread(self.try_acquire_or_renew), timeout=budget
                )
            except TimeoutError:
                log.warning("leader election: the lease call did not return in %.1fs", budget)
            except Exception as error:  # the apiserver may be briefly unreachable
                log.warning("leader election: %s", error)
            now = time.monotonic()
            if held:
                self._renewed_at = now
                if not self.leading.is_set():
                    log.info(
                        "became the leader (%s/%s as %s)", self.namespace, self.name, self.identity
                    )
                    self.leading.set()
                    metrics.LEADING.set(1)
            elif held is False and self._observed[0] != self.identity:
                # Not a conflict on our own Lease (someone annotated it): another holder.
                self._step_down(f"{self._observed[0]} holds the Lease")
            elif self.leading.is_set() and now - self._renewed_at >= self.renew_deadline:
                self._step_down("could not renew the lease in time")
            await asyncio.sleep(self.retry_seconds)

    def _step_down(self, why: str) -> None:
        """Stop acting (on the event loop): the controller's workers wait, and whatever this
        replica exported as the leader goes (see ``on_stopped_leading``)."""
        if not self.leading.is_set():
            return
        log.warning("lost the leadership: %s", why)
        self.leading.clear()
        metrics.LEADING.set(0)
        for callback in self.on_stopped_leading:
            callback()

    def fence(self) -> None:
        """Raise :class:`LostLeadership` unless this replica may write now (blocking: one
        Lease read). A refusal also steps down at once, instead of at the next renewal."""
        holder, transitions = self._read_holder()
        tenure = None if self._released else self._tenure  # no lock: a renew may hold it
        why = fence_refusal(
            self.identity, tenure, holder, transitions, time.monotonic(), self.renew_deadline
        )
        if why is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._step_down, why)
        raise LostLeadership(why)

    def _read_holder(self) -> tuple[str | None, int | None]:
        """The Lease's holder and transitions as the apiserver has them now."""
        metrics.API_REQUESTS.labels("get", "lease").inc()
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout()
            )
        except ApiException as error:
            if error.status != 404:
                raise
            return None, None
        spec = lease.spec or client.V1LeaseSpec()
        return spec.holder_identity, spec.lease_transitions

    def try_acquire_or_renew(self) -> bool:
        with self._lease_lock:
            return not self._released and self._acquire_or_renew()

    def _acquire_or_renew(self) -> bool:
        now = datetime.now(UTC)
        sent_at = time.monotonic()
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout()
            )
        except ApiException as error:
            if error.status != 404:
                raise
            return self._create(now)
        spec = lease.spec = lease.spec or client.V1LeaseSpec()
        record = (spec.holder_identity, str(spec.renew_time))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        expired = time.monotonic() - self._observed_at > (
            spec.lease_duration_seconds or self.lease_seconds
        )
        if spec.holder_identity not in (self.identity, None, "") and not expired:
            return False
        if spec.holder_identity != self.identity:
            spec.holder_identity = self.identity
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.renew_time = now
        spec.lease_duration_seconds = int(self.lease_seconds)
        try:
            self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=self._timeout()
            )
        except ApiException as error:
            if error.status == 409:  # someone else wrote first
                return False
            raise
        self._tenure = Tenure(spec.lease_transitions or 0, sent_at)
        return True

    def _timeout(self) -> float:
        """Per-request timeout: a hung connection must not outlive the renew deadline."""
        return max(1.0, self.renew_deadline / 2)

    def release(self) -> None:
        """Hand the Lease over at once on shutdown (client-go's ReleaseOnCancel), so a rolling
        update does not wait a full lease duration for the next leader."""
        was_leading = self.leading.is_set()
        self.leading.clear()  # stop acting now, even while a renew call still holds the lock
        self._tenure = None  # and fence every write from now on
        with self._lease_lock:
            self._released = True
            self._tenure = None
            if not was_leading:
                return
            for _ in range(RELEASE_ATTEMPTS):
                lease = self.api.read_namespaced_lease(
                    self.name, self.namespace, _request_timeout=self._timeout()
                )
                if lease.spec is None or lease.spec.holder_identity != self.identity:
                    return
                lease.spec.holder_identity = ""
                lease.spec.lease_duration_seconds = 1
                lease.spec.renew_time = datetime.now(UTC)
                try:
                    self.api.replace_namespaced_lease(
                        self.name, self.namespace, lease, _request_timeout=self._timeout()
                    )
                    return
                except ApiException as error:
                    if error.status != 409:  # 409: written meanwhile; read it again
                        log.warning("could not release the lease: %s", error.reason)
                        return
            log.warning("could not release the lease: it kept changing under the release")

    def _create(self, now: datetime) -> bool:
        sent_at = time.monotonic()
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=int(self.lease_seconds),
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        try:
            self.api.create_namespaced_lease(self.namespace, body, _request_timeout=self._timeout())
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        self._tenure = Tenure(0, sent_at)
        return True
