"""What the rendezvous does about an agent that is gone: a fraction of a second, not seconds.

Two of torch's waits stood between a lost agent and the survivors training again:

* **Its keep-alive.** An agent that dies without leaving (its node lost, its pod's processes
  SIGKILLed, the OOM killer) stays a participant of the last round until its keep-alive
  expires (``keep_alive_interval × keep_alive_max_attempt`` after the last one: 6 s with
  torchkube's defaults), and no round can form without it. Here every agent beats on a
  counter of its own (:mod:`torchkube.elastic.liveness`), and an agent waiting for a round
  drops a participant whose counter stood still (or stood still briefly and whose port is
  refused: its process is gone), as torch's expiry would have done later:
  it marks the keep-alive expired and lets torch's own expiry take it out of the state. Only
  a round that forms or breaks up (an agent waits to get in) is judged: a whole round that
  trains is left to torch's expiry, so that a spare standing by never restarts a healthy
  job for a participant's beats delayed past the silence.
* **The last call.** Once ``min_nodes`` agents are in, torch waits ``last_call_timeout`` for
  more before the round starts. That is right for a job's first round, whose agents arrive
  over seconds, and for a round that grows (the newcomers' pods came one by one). A round
  that re-forms because an agent is gone waits for nobody: every other agent of the last
  round is in already or gone too, a replacement pod is seconds from joining, and one that
  comes later joins as any newcomer does (the survivors restart to let it in). So a round
  whose agents are all of the last round's that still beat, with at least one of them gone,
  starts at once — the agents on their way in counted as the last round's: the wait list,
  and the spares standing by, which take the lost agents' places.

An agent judged gone while it was alive (its beats starved for the whole silence) costs one
more round, never a wrong one: it finds itself out of the round, and joins the next.
"""

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from torchkube.elastic import liveness
from torchkube.elastic.say import say

EXPIRED = datetime(1970, 1, 1, tzinfo=UTC)
"""A keep-alive so old that torch's own expiry takes the participant out of the state."""


@dataclass
class _Judge:
    """One agent's view of the others: their counters, and the last round it knew."""

    node: Any
    """The agent's own node descriptor."""
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
    """The launcher runs one agent at a time: the latest handler's node beats and judges."""

    node: Any = None
    beats: liveness.Beats | None = None
    judge: _Judge | None = None


def beat_for(handler: Any, lone: bool) -> None:
    """Beat for ``handler``'s node from now on, and judge the others at the same pace. Not
    for a lone agent (a rendezvous of its own, which nobody waits on), nor where the silence
    would outlast torch's own expiry (the beats' pace is bounded for the whole job: from
    several thousand agents on), nor for a store that is not a TCPStore."""
    node, settings, store = handler._this_node, handler._settings, handler._store
    if _Beating.node == node:
        return
    stop_beating()
    _Beating.node, _Beating.judge = node, None
    beat = liveness.beat_seconds(settings.max_nodes, settings.keep_alive_interval.total_seconds())
    silence = liveness.silence_seconds(beat)
    if lone or silence >= _expiry(settings).total_seconds() or not hasattr(store, "host"):
        return
    key = liveness.beat_key(settings.run_id, node)
    _Beating.beats = liveness.Beats(liveness.connect_beside(store), key, beat)
    _Beating.beats.start()
    judge_as(node, store, handler._state_holder, silence, liveness.probe_after_seconds(beat))


def _expiry(settings: Any) -> timedelta:
    """How long after its last keep-alive torch itself takes an agent out of the state."""
    return settings.keep_alive_interval * settings.keep_alive_max_attempt


def judge_as(
    node: Any, store: Any, holder: Any, silence: float, probe_after: float | None = None
) -> None:
    """Judge the others for ``node`` (whose copy of the shared state ``holder`` is), by their
    counters in ``store``: dead after ``silence`` seconds, or after ``probe_after`` with
    their port refused."""
    _Beating.judge = _Judge(node, store, holder, liveness.Watch(silence, probe_after))


def stop_beating() -> None:
    """This launcher's agent leaves (or a new one takes over): its counter stands still."""
    if _Beating.beats is not None:
        _Beating.beats.stop()
    _Beating.beats = None


def remember_round(handler: Any) -> None:
    """Note the round ``handler``'s agent just joined, to know later who left it, and try its
    agents' ports while they are alive (a refusal later is evidence only from a port that
    answered)."""
    judge = _Beating.judge
    if judge is not None and judge.node == handler._this_node:
        state = handler._state_holder.state
        _remember(judge, state)
        others = (node for node in state.participants if node != judge.node)
        judge.watch.learn(judge.store, _hosts(liveness.keys_of(handler._settings.run_id, others)))


def _remember(judge: _Judge, state: Any) -> None:
    """Add what ``state`` shows of its round to what the judge knows of it: its agents leave
    it one by one, and every one of them is still expected in the next round."""
    seen = {*state.participants, *state.wait_list, *state.redundancy_list}
    if judge.known_round != state.round:
        judge.known = frozenset()
    judge.known, judge.known_round = judge.known | seen, state.round


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
        judge, state = _Beating.judge, ctx.state
        if (
            judge is None
            or judge.node != ctx.node
            or state.closed
            or (state.complete and ctx.node in state.participants)
        ):
            return join(self, ctx, deadline)  # in a round already: nothing to judge
        if state.complete:
            _remember(judge, state)
        if _breaking(state) and _dropped_silent(judge, ctx):
            return _Action.KEEP_ALIVE
        if _starts_at_once(judge, ctx):
            return _Action.MARK_RENDEZVOUS_COMPLETE
        return join(self, ctx, deadline)

    join_class.__call__ = join_call


def _breaking(state: Any) -> bool:
    """Whether the round is forming, or breaking up (an agent waits to get in: every
    participant restarts into a new round). A whole round that trains is not judged: a spare
    standing by would otherwise restart a healthy job for a participant's beats delayed past
    the silence (lost packets, a stalled node), where torch's expiry tolerates seconds."""
    return not state.complete or bool(state.wait_list)


def _dropped_silent(judge: _Judge, ctx: Any) -> bool:
    """Whether this agent took silent participants out of its copy of the state."""
    state, settings = ctx.state, ctx.settings
    others = liveness.keys_of(settings.run_id, (n for n in state.participants if n != ctx.node))
    silent = judge.watch.dead(judge.store, list(others), time.monotonic(), _hosts(others))
    if not silent:
        return False
    for key in silent:
        node = others[key]
        state.last_heartbeats[node] = EXPIRED
        if node not in judge.told:
            judge.told.add(node)
            how = (
                "stopped beating and its port refused a connection (its process is gone)"
                if key in judge.watch.refused
                else f"stopped beating {judge.watch.silence:.1f}s ago"
            )
            say(
                f"agent {node} {how}: dropped from round {state.round} of the rendezvous (its "
                f"keep-alive would have kept it there up to "
                f"{_expiry(settings).total_seconds():.0f}s)"
            )
    judge.holder._sanitize()
    return True


def _hosts(nodes: dict[str, Any]) -> dict[str, str]:
    """Each counter key's agent's address (torch's node descriptor holds it)."""
    return {key: node.addr for key, node in nodes.items() if getattr(node, "addr", None)}


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
    # on their way in: the wait list, and spares standing by (a survivor that trained when
    # a spare came never saw it; the spare takes the lost agent's place in this round)
    expected = known | state.wait_list | state.redundancy_list
    return [node for node in expected if node not in state.participants and node != me]


def _starts_at_once(judge: _Judge, ctx: Any) -> bool:
    """Whether every agent of the last round missing from this re-forming one is gone."""
    state, settings = ctx.state, ctx.settings
    absent = absent_from_reform(state, ctx.node, judge.known, judge.known_round, settings.min_nodes)
    if not absent:
        return False
    keys = liveness.keys_of(settings.run_id, absent)
    if len(judge.watch.dead(judge.store, list(keys), time.monotonic(), _hosts(keys))) < len(absent):
        return False
    gone = ", ".join(sorted(repr(node) for node in absent))
    say(
        f"round {state.round} starts at once with {len(state.participants)} agents: the last "
        f"round's {gone} stopped beating (the last call waits only for a first or growing round)"
    )
    return True
