"""What hot spares, fast replacements and the hang watchdog need from torchrun's agent.

**Spares stand by in torch's own redundancy list.** An agent that arrives when a round already
has ``--nnodes`` max participants is kept in the rendezvous state's redundancy list: it sends
keep-alives, is not counted as a node waiting to join (so it never restarts the round of the
others), and has no join timeout. When a participant goes (its pod deleted, its node lost),
the round has room again: the spare moves to the wait list, the survivors restart into the
next round and the spare is in it — its pod already scheduled, its image pulled, Python and
torch imported. The operator runs ``replicas.spares`` such pods beyond ``replicas.max``.

Around it, this module adds:

* **A full round never restarts for an agent that cannot get in.** An agent that arrives while
  a round re-forms (its pod replaced a deleted one) lands in torch's *wait list*; once the
  round is full again it stays there, counted as waiting, so the participants restart to let
  it in, the first of them to leave the old round lands in the wait list in turn, and the
  round would restart every few seconds for good.
  Here a wait-listed agent of a full, complete round moves to the redundancy list (it is a
  spare), and such an agent is not counted as waiting.

* **A spare released at the end is not a failure.** When training ends, the finishing agent
  closes the rendezvous; a spare still standing by gets torch's graceful exit, which torchrun
  2.15 turns into an ``AttributeError``. An agent that never joined a round raises
  :class:`StandbyReleased` instead, and the launcher exits 0 with ``STANDBY_RELEASED``.
* **Only the end of training closes the rendezvous.** torchrun closes it after any error
  that is not a signal: a join timeout, workers out of restarts. A closed rendezvous is
  closed for good, so every agent that came later (the operator's replacement for this very
  pod) would be released as if training were over, and the job would empty for good. Here an agent
  whose run did not succeed leaves the rendezvous instead (:func:`leave`), and
  :func:`timed_out` says how a join timeout ended (``ExitCode.JOIN_TIMEOUT``).
* **A stopped agent leaves at once.** An agent stopped by a signal (pod deletion, preemption, a
  hang) does not close the rendezvous (that would end the job), so the others would wait for
  its keep-alive to expire (``keep_alive_interval × keep_alive_max_attempt``) before a round
  without it could form. :func:`leave` takes it out of the participants right away.
* **A lost agent costs a fraction of a second, not a keep-alive expiry and a last call**
  (:mod:`torchkube.elastic.lost_agents`).
* **A round forms as soon as its agents are there.** torch's waiting agents read the shared
  state once a second (a fixed poll, and a one-second cache of the state), so each hand-over of
  a re-forming round — the survivor back in, the spare off its list, the round complete, the
  survivor seeing it — would wait up to a second, seconds of a recovery in all. The poll and
  the cache are
  :func:`poll_seconds` here: 0.1 s for a small job, torch's second from 256 agents on, so the
  store sees at most about 256 reads a second from waiting agents whatever the size.
* **A round re-forms without torch's overheads.** torch delays each agent's join by a random
  0–0.3 s while the rendezvous is in its round 0, to spread a job's first arrivals; it is still
  round 0 when the job's first loss sends the survivors back, so the first recovery of every
  job waited for it, where torch's own later rounds wait nothing. Here a handler whose agent
  joined a round before skips it (a new handler — a replacement, a spare, every agent after
  a lost store — arrives with others and keeps it). And each step of torch's rendezvous
  names an event after its caller with ``inspect.stack()`` (twice), which reads the source
  line of every frame, for events torch drops unless a handler is configured:
  :func:`_method_name` reads the same name from the frame.
* **A failed worker is reported at once.** torch's log formatter imports ``torch._dynamo``
  (the compiler stack: sympy, fx, inductor) before it formats a record's exception, and a warm
  worker's failure is logged with its exception: the surviving agent would import it before
  it restarts the round, on every recovery. :func:`report_failures_lightly` renders the
  traceback into the message itself, with the standard formatter.
* **A lone agent trains on without its store.** Under live recovery each pod is a torchrun
  world of its own (``--nnodes=1``, a rendezvous id of its own): nobody can join its round,
  so torch's question to the store after every check of healthy workers — how many agents
  wait to join? — has one answer, 0, and asking it made the store's loss (its pod deleted,
  evicted, its node lost) stop the workers of every pod at once: each replica group
  restarted from the checkpoint. Such an agent (:func:`lone`) answers it without the store;
  it needs the store again only to restart its workers, and the launcher waits for the
  store then. Nor does it send keep-alives, which nobody reads: without the store each
  failed with a trace every ``keep_alive_interval``, and a new store, which does not hold
  the rendezvous, failed them for the rest of the run. Not in restart mode, even at one
  node: a spare may share the rendezvous, and a participant that trained on while the spare
  re-joined through a new store would train beside it.
* **A worker's end wakes its agent.** torchrun's agent sleeps ``--monitor-interval`` between
  looks at its workers, so a failed worker waited for the next look — half an interval on
  average, on the critical path of every recovery. Here torch's loop sleeps nothing and each
  look waits up to the interval for a worker process to end
  (:func:`until_a_worker_ends`); the interval still paces the look's other question, how
  many agents wait to join, and a round that succeeds (a warm worker that returns waits for
  the agent to read its result before it ends).
* **Every in-place restart is told.** When a worker fails, torchrun restarts the pod's
  workers in place (``--max-restarts``) and nothing outside the pod knows: a crash loop
  would stay invisible to ``maxRestarts``. :func:`on_failure_restart` registers what is called
  at each such restart (not at a restart for a membership change), with the failures.
* **Ranks follow the slots** (:mod:`torchkube.elastic.ranks`): torch ranks a round's agents by
  address, here by their pod's replica index, which Kueue's topology-aware scheduling assigns
  in topology order.
* **The watchdog judges only the workers torchrun runs now.** :func:`healthy_workers` is the
  agent's worker pids while it holds them healthy: a worker of an ended round (dying, or its
  heartbeat file not yet replaced) is never taken for a hung one.
"""

import logging
import multiprocessing.connection
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchkube.api.contract import Env
from torchkube.elastic import lost_agents
from torchkube.elastic.say import say

LEAVE_SECONDS = 5.0
TORCH_POLL_SECONDS = 1
"""torch's poll of a waiting agent (its only ``_delay`` of a fixed whole second)."""
TORCH_FIRST_ROUND_SKEW = (0, 0.3)
"""torch's random delay of an agent's join while the rendezvous is in round 0."""
FASTEST_POLL_SECONDS = 0.1
READS_PER_SECOND = 256


class StandbyReleased(Exception):
    """The job's rendezvous closed while this agent stood by, never having trained."""


@dataclass(frozen=True)
class JoinTimedOut:
    """A join that timed out: how many agents the round had (this one included) of the
    ``--nnodes`` minimum it needed, after how long."""

    agents: int
    minimum: int
    seconds: float


class _Tracked:
    standing_by: float | None = None
    """Since when this agent stands by in the redundancy list (monotonic), if it does."""
    handler: Any = None
    """The agent's rendezvous handler (the launcher runs one agent at a time)."""
    agent: Any = None
    """The agent, once it started workers."""
    poll: float | None = None
    """How often this agent reads the rendezvous state while it waits (None: torch's)."""
    joined = False
    """Whether this launcher's agent ever got into a round."""
    rejoining = False
    """Whether the join under way is the current handler's agent's second or later."""
    succeeded = False
    """Whether the agent's last run ended with every worker done (training is over)."""
    timed_out: JoinTimedOut | None = None
    """The last join timeout of this launcher's agent, if any."""
    failure_restarts = 0
    """In-place restarts of the workers after a failure, over all of the launcher's agents."""
    failures: Any = None
    """The failures of the workers' last check (``RunResult.failures``)."""
    restarted: Callable[[int, Any], None] | None = None
    monitor_interval: float | None = None
    """torchrun's ``--monitor-interval`` while the agent runs: the longest wait before it
    looks at its workers (and asks how many agents wait to join)."""


def track() -> None:
    """Wrap torch's c10d rendezvous handler once per process (see the module docstring)."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError,
        RendezvousGracefulExitError,
        RendezvousTimeoutError,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        _DistributedRendezvousOpExecutor,
    )

    handler_class: Any = DynamicRendezvousHandler
    if getattr(handler_class, "_torchkube_tracked", False):
        return
    original = handler_class.next_rendezvous

    def next_rendezvous(self: Any) -> Any:
        _Tracked.handler = self
        _Tracked.poll = poll_seconds(self._settings.max_nodes)
        _Tracked.rejoining = getattr(self, "_torchkube_joined", False)
        self._state_holder._cache_duration = _Tracked.poll
        lost_agents.beat_for(self, lone(self._settings.max_nodes))
        try:
            info = original(self)
        except (RendezvousGracefulExitError, RendezvousClosedError) as error:
            if not _Tracked.joined:
                raise StandbyReleased(str(error)) from error
            raise
        except RendezvousTimeoutError:
            _Tracked.timed_out = _join_timed_out(self)
            raise
        finally:
            _Tracked.rejoining = False  # torch's other random delays stay as they are
        _Tracked.joined = self._torchkube_joined = True
        lost_agents.remember_round(self)
        if _Tracked.standing_by is not None:
            waited = time.monotonic() - _Tracked.standing_by
            _Tracked.standing_by = None
            round_ = self._state_holder.state.round
            say(f"the spare joins round {round_} after standing by for {waited:.0f}s")
        return info

    handler_class.next_rendezvous = next_rendezvous
    handler_class._torchkube_tracked = True
    keep_alive = handler_class._keep_alive

    def keep_alive_unless_lone(self: Any) -> None:
        if not lone(self._settings.max_nodes):  # see the module docstring
            keep_alive(self)

    handler_class._keep_alive = keep_alive_unless_lone
    _close_only_at_the_end(handler_class)
    _spare_when_full(handler_class)
    lost_agents.judge_when_joining()
    _poll_sooner()
    from torchkube.elastic import ranks

    ranks.follow_slots()

    executor_class: Any = _DistributedRendezvousOpExecutor
    add_to_redundancy_list = executor_class._add_to_redundancy_list

    def _add_to_redundancy_list(self: Any) -> None:
        if _Tracked.standing_by is None:
            _Tracked.standing_by = time.monotonic()
            round_, workers = self._state.round, self._settings.max_nodes
            say(f"standing by as a spare: round {round_} already has its {workers} workers")
        add_to_redundancy_list(self)

    executor_class._add_to_redundancy_list = _add_to_redundancy_list

    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    agent_class: Any = LocalElasticAgent
    start_workers = agent_class._start_workers

    def _start_workers(self: Any, worker_group: Any) -> Any:
        _Tracked.agent = self
        return start_workers(self, worker_group)

    agent_class._start_workers = _start_workers
    invoke_run = agent_class._invoke_run

    def _invoke_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        spec = self._worker_group.spec
        _Tracked.monitor_interval = spec.monitor_interval
        spec.monitor_interval = 0  # torch's loop sleeps nothing: each look waits instead
        try:
            return invoke_run(self, *args, **kwargs)
        finally:
            spec.monitor_interval, _Tracked.monitor_interval = _Tracked.monitor_interval, None

    agent_class._invoke_run = _invoke_run
    monitor, restart = agent_class._monitor_workers, agent_class._restart_workers

    def _monitor_workers(self: Any, worker_group: Any) -> Any:
        if _Tracked.monitor_interval:
            until_a_worker_ends(self._pcontext, _Tracked.monitor_interval)
        result = monitor(self, worker_group)
        _Tracked.failures = result.failures
        return result

    def _restart_workers(self: Any, worker_group: Any) -> Any:
        from torch.distributed.elastic.agent.server.api import WorkerState

        if worker_group.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            _Tracked.failure_restarts += 1
            if _Tracked.restarted is not None:
                _Tracked.restarted(_Tracked.failure_restarts, _Tracked.failures)
        return restart(self, worker_group)

    agent_class._monitor_workers = _monitor_workers
    agent_class._restart_workers = _restart_workers
    run = agent_class.run

    def run_and_remember(self: Any, *args: Any, **kwargs: Any) -> Any:
        _Tracked.succeeded = False
        result = run(self, *args, **kwargs)
        _Tracked.succeeded = not result.is_failed()
        return result

    agent_class.run = run_and_remember


def until_a_worker_ends(pcontext: Any, seconds: float) -> None:
    """Wait ``seconds``, or less: until one of ``pcontext``'s running workers ends (see the
    module docstring). Warm workers are waited on through their multiprocessing sentinels,
    torchrun's fresh interpreters through a pidfd each. With nothing to wait on — no worker
    running, or no pidfd to be had — it sleeps the whole interval, as torch did: returning
    at once there would spin."""
    processes = getattr(pcontext, "_pc", None)
    if processes is not None and processes.sentinels:  # a MultiprocessContext
        multiprocessing.connection.wait(list(processes.sentinels), timeout=seconds)
        return
    pidfds = _pidfds(pcontext)
    if not pidfds:
        time.sleep(seconds)
        return
    try:
        multiprocessing.connection.wait(pidfds, timeout=seconds)
    finally:
        for fd in pidfds:
            os.close(fd)


def _pidfds(pcontext: Any) -> list[int]:
    """A pidfd for each running worker of a SubprocessContext; none at all where one cannot
    be had (a kernel before Linux 5.3, a sandbox that refuses it, a worker already gone)."""
    handlers = getattr(pcontext, "subprocess_handlers", None)
    running = getattr(pcontext, "_running_local_ranks", None)
    pidfd_open = getattr(os, "pidfd_open", None)
    if not handlers or not running or pidfd_open is None:
        return []
    pidfds: list[int] = []
    try:
        for rank in running:
            pidfds.append(pidfd_open(handlers[rank].proc.pid))
    except OSError:
        for fd in pidfds:
            os.close(fd)
        return []
    return pidfds


def _join_timed_out(handler: Any) -> JoinTimedOut:
    state, settings = handler._state_holder.state, handler._settings
    seen = {*state.participants, *state.wait_list, handler._this_node}
    return JoinTimedOut(len(seen), settings.min_nodes, settings.timeout.join.total_seconds())


def on_failure_restart(call: Callable[[int, Any], None]) -> None:
    """Have ``call(count, failures)`` run at each in-place restart after a failure: the
    launcher's count so far and torch's ``{local_rank: ProcessFailure}``."""
    _Tracked.restarted = call


def timed_out() -> JoinTimedOut | None:
    """How the agent's last join timed out, if it did."""
    return _Tracked.timed_out


def _close_only_at_the_end(handler_class: Any) -> None:
    """See the module docstring: torchrun's ``shutdown`` closes the rendezvous only once the
    agent's workers all succeeded; after anything else the agent just leaves it."""
    shutdown = handler_class.shutdown

    def shutdown_unless_failed(self: Any) -> bool:
        if _Tracked.succeeded:
            return bool(shutdown(self))
        return leave()

    handler_class.shutdown = shutdown_unless_failed


def round_is_full(state: Any, max_nodes: int) -> bool:
    """A complete round with ``max_nodes`` participants: nobody else can get in."""
    return bool(state.complete) and len(state.participants) >= max_nodes


def _spare_when_full(handler_class: Any) -> None:
    """See the module docstring: wait-listed agents of a full round become spares."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _Action,
        _RendezvousJoinOp,
    )

    join_class: Any = _RendezvousJoinOp
    join = join_class.__call__

    def join_call(self: Any, ctx: Any, deadline: float) -> Any:
        state = ctx.state
        if (
            not state.closed
            and ctx.node in state.wait_list
            and ctx.node not in state.participants
            and round_is_full(state, ctx.settings.max_nodes)
        ):
            return _Action.REMOVE_FROM_WAIT_LIST  # then, the round being full: redundancy
        return join(self, ctx, deadline)

    join_class.__call__ = join_call
    waiting = handler_class.num_nodes_waiting

    def num_nodes_waiting(self: Any) -> int:
        if lone(self._settings.max_nodes):
            return 0  # see the module docstring: a world of one agent, nobody can wait
        count: int = waiting(self)
        if count and round_is_full(self._state_holder.state, self._settings.max_nodes):
            return 0
        return count

    handler_class.num_nodes_waiting = num_nodes_waiting


def lone(max_nodes: int) -> bool:
    """Whether this agent's rendezvous (of at most ``max_nodes`` agents) is its own alone,
    which nobody can wait to join: under live recovery each pod is a torchrun world of one
    agent, under a rendezvous id of its own (``torchkube.api.worker_launch.torchrun_args``)."""
    return max_nodes <= 1 and os.environ.get(Env.RECOVERY) == "live"


def poll_seconds(max_nodes: int) -> float:
    """How often an agent of a round of ``max_nodes`` reads the rendezvous state while it
    waits: ``READS_PER_SECOND`` reads a second from the round's agents at most, never less
    often than torch does."""
    return min(float(TORCH_POLL_SECONDS), max(FASTEST_POLL_SECONDS, max_nodes / READS_PER_SECOND))


def _poll_sooner() -> None:
    """See the module docstring: torch's one-second poll becomes :func:`poll_seconds`, its
    first-round skew is for an agent's first join only, and its event names come cheap."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous, utils

    def delay(seconds: float | tuple[float, float]) -> None:
        if seconds == TORCH_FIRST_ROUND_SKEW and _Tracked.rejoining:
            return
        if seconds == TORCH_POLL_SECONDS and _Tracked.poll is not None:
            seconds = _Tracked.poll
        utils._delay(seconds)

    dynamic_rendezvous._delay = delay
    dynamic_rendezvous.get_method_name = _method_name


def _method_name(depth: int = 2) -> str:
    """torch's ``get_method_name``: the name of the function ``depth`` frames up from this
    one, read from the frame instead of ``inspect.stack()`` (see the module docstring)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # the stack is shorter
        return "no_method_name"


class _TracebackInMessage(logging.Filter):
    """The record's exception as text in its message, so no formatter looks at ``exc_info``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            try:
                traceback = logging.Formatter().formatException(record.exc_info)
                record.msg, record.args = f"{record.getMessage()}\n{traceback}", None
                record.exc_info, record.exc_text = None, None
            except Exception:  # logging does not guard filters: torch's caller would get it
                pass  # and torch's formatter does it instead, slowly
        return True


def report_failures_lightly() -> None:
    """See the module docstring: on every handler torch logs through."""
    for name in ("torch", "torch.distributed"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _TracebackInMessage) for f in handler.filters):
                handler.addFilter(_TracebackInMessage())


def healthy_workers() -> set[int]:
    """The pids of the workers torchrun runs and holds healthy now (empty between rounds)."""
    from torch.distributed.elastic.agent.server.api import WorkerState

    agent = _Tracked.agent
    if agent is None or agent._worker_group.state != WorkerState.HEALTHY:
        return set()
    pcontext = agent._pcontext
    return set(pcontext.pids().values()) if pcontext is not None else set()


def finish_stopping_workers() -> None:
    """Stop the workers of the current agent and wait for them, up to its shutdown timeout
    (SIGKILL after). A signal that comes while torchrun waits for workers it is stopping
    (after a lost store) ends torchrun's wait, not the workers' stop; the launcher, a pod's
    first process, must not exit before them: the pod's end would kill them mid-way through
    their emergency checkpoint. A worker already stopping takes the repeated SIGTERM as the
    same request."""
    agent = _Tracked.agent
    pcontext = agent._pcontext if agent is not None else None
    if agent is not None and pcontext is not None:
        pcontext.close(signal.SIGTERM, agent._shutdown_timeout)


def leave() -> bool:
    """Take this agent out of the current round's participants now (best effort); True when
    it was done. Call it only once the agent has stopped its workers."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

    handler = _Tracked.handler
    if handler is None:
        return False
    lost_agents.stop_beating()
    try:
        handler._stop_heartbeats()
        handler._op_executor.run(_RendezvousExitOp(), time.monotonic() + LEAVE_SECONDS)
    except Exception as error:  # the store is away: the keep-alive expiry does it instead
        say(f"could not leave the rendezvous ({error}); the others wait for its keep-alive")
        return False
    return True
