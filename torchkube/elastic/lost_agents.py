"""What the rendezvous does about an agent that is gone: half a second, not seconds.

Two of torch's waits stood between a lost agent and the survivors training again:

* **Its keep-alive.** An agent that dies without leaving (its node lost, its pod's processes
  SIGKILLed, the OOM killer) stays a participant of the last round until its keep-alive
  expires (``keep_alive_interval × keep_alive_max_attempt`` after the last one: 6 s with
  torchkube's defaults), and no round can form without it. Here every agent beats on a
  counter of its own (:mod:`torchkube.elastic.liveness`), and an agent waiting for a round
  drops a participant whose counter stood still, as torch's expiry would have done later:
  it marks the keep-alive expired and lets torch's own expiry take it out of the state.
* **The last call.** Once ``min_nodes`` agents are in, torch waits ``last_call_timeout`` for
  more before the round starts. That is right for a job's first round, whose agents arrive
  over seconds, and for a round that grows (the newcomers' pods came one by one). A round
  that re-forms because an agent is gone waits for nobody: every other agent of the last
  round is in already or gone too, a replacement pod is seconds from joining, and one that
  comes later joins as any newcomer does (the survivors restart to let it in). So a round
  whose agents are all of the last round's that still beat, with at least one of them gone,
  starts at once.

An agent judged gone while it was alive (its beats starved for the whole silence) costs one
more round, never a wrong one: it finds itself out of the round, and joins the next.
"""

import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from torchkube.elastic import liveness

EXPIRED = datetime(1970, 1, 1, tzinfo=UTC)
"""A keep-alive so old that torch's own expiry takes the participant out of the state."""


def _say(message: str) -> None:
    print(f"torchkube: {message}", file=sys.stderr, flush=True)


@dataclass
class _Judge:
    """One agent's view of the others: their counters, and the last round it knew."""

    store: Any
    """The agent's client of the store (judging runs on the agent's own thread)."""
    holder: Any
    """The agent's copy of the shared state, which torch's expiry edits."""
    watch: liveness.Watch
    known: frozenset[Any] = frozenset()
    """The last complete round this agent saw: its participants, waiting agents and spares."""
    known_round: int | None = None
    told: set[Any] = field(default_factory=set)
    """The agents this one said it dropped (each is said once)."""


class _Beating:
    beats: liveness.Beats | None = None
    node: Any = None
    """The node the beats stand for (the launcher runs one agent at a time)."""
    judges: dict[Any, _Judge] = {}
    """Each node's judge: a test may run several handlers in one process."""


def beat_for(handler: Any, lone: bool) -> None:
    """Beat for ``handler``'s node from now on, and judge the others at the same pace; not
    for a lone agent (a rendezvous of its own, which nobody waits on)."""
    node, settings = handler._this_node, handler._settings
    if _Beating.node == node:
        return
    stop_beating()
    _Beating.node = node
    if lone:
        return
    beat = liveness.beat_seconds(settings.max_nodes, settings.keep_alive_interval.total_seconds())
    key = liveness.beat_key(settings.run_id, node)
    _Beating.beats = liveness.Beats(liveness.connect_beside(handler._store), key, beat)
    _Beating.beats.start()
    watch = liveness.Watch(liveness.silence_seconds(beat))
    _Beating.judges[node] = _Judge(handler._store, handler._state_holder, watch)


def stop_beating() -> None:
    """This launcher's agent leaves (or a new one takes over): its counter stands still."""
    if _Beating.beats is not None:
        _Beating.beats.stop()
    _Beating.beats = None


def remember_round(handler: Any) -> None:
    """Note the round ``handler``'s agent just joined, to know later who left it."""
    judge = _Beating.judges.get(handler._this_node)
    if judge is not None:
        _remember(judge, handler._state_holder.state)


def _remember(judge: _Judge, state: Any) -> None:
    judge.known = frozenset({*state.participants, *state.wait_list, *state.redundancy_list})
    judge.known_round = state.round


def judge_when_joining() -> None:
    """Have every waiting agent drop silent participants, then write the state (a keep-alive
    of its own: torch's one action that only writes), and start a round re-formed after a
    loss at once (see the module docstring)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _Action,
        _RendezvousJoinOp,
    )

    join_class: Any = _RendezvousJoinOp
    join = join_class.__call__

    def join_call(self: Any, ctx: Any, deadline: float) -> Any:
        judge = _Beating.judges.get(ctx.node)
        if judge is None or ctx.state.closed:
            return join(self, ctx, deadline)
        if ctx.state.complete:
            _remember(judge, ctx.state)
        if _dropped_silent(judge, ctx):
            return _Action.KEEP_ALIVE
        if _starts_at_once(judge, ctx):
            return _Action.MARK_RENDEZVOUS_COMPLETE
        return join(self, ctx, deadline)

    join_class.__call__ = join_call


def _dropped_silent(judge: _Judge, ctx: Any) -> bool:
    """Whether this agent took silent participants out of its copy of the state."""
    state, settings = ctx.state, ctx.settings
    others = liveness.keys_of(settings.run_id, (n for n in state.participants if n != ctx.node))
    silent = judge.watch.dead(judge.store, list(others), time.monotonic())
    if not silent:
        return False
    for key in silent:
        node = others[key]
        state.last_heartbeats[node] = EXPIRED
        if node not in judge.told:
            judge.told.add(node)
            expiry = settings.keep_alive_interval * settings.keep_alive_max_attempt
            _say(
                f"agent {node} stopped beating {judge.watch.silence:.1f}s ago: dropped from "
                f"round {state.round} of the rendezvous (its keep-alive would have kept it "
                f"there up to {expiry.total_seconds():.0f}s)"
            )
    judge.holder._sanitize()
    return True


def absent_from_reform(
    state: Any, me: Any, known: frozenset[Any], known_round: int | None, min_nodes: int
) -> list[Any]:
    """The agents of the last round ``me`` knew that are absent from the round forming right
    after it, which ``me`` is in with at least ``min_nodes`` — the agents whose silence
    would let it start at once. Empty when the rule does not apply: a job's first round, a
    round already complete, one that lost nobody (it may be growing), or one too small."""
    if (
        known_round is None
        or state.complete
        or state.round != known_round + 1
        or me not in state.participants
        or len(state.participants) < min_nodes
    ):
        return []
    return [node for node in known if node not in state.participants and node != me]


def _starts_at_once(judge: _Judge, ctx: Any) -> bool:
    """Whether every agent of the last round missing from this re-forming one is gone."""
    state, settings = ctx.state, ctx.settings
    absent = absent_from_reform(state, ctx.node, judge.known, judge.known_round, settings.min_nodes)
    if not absent:
        return False
    keys = liveness.keys_of(settings.run_id, absent)
    if len(judge.watch.dead(judge.store, list(keys), time.monotonic())) < len(absent):
        return False
    gone = ", ".join(sorted(repr(node) for node in absent))
    _say(
        f"round {state.round} starts at once with {len(state.participants)} agents: the last "
        f"round's {gone} stopped beating (the last call waits only for a first or growing round)"
    )
    return True
