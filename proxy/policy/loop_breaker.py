"""The loop breaker on the request path: the pure rules of ``proxy.guard.decisions.loops`` plus the session's state.

One ``LoopBreaker`` per guarded request (a request that declares tools). The paths ask it, after a
turn is assembled and before it is delivered, whether that turn completes a loop (``check_turn``),
and when the attempts run out whether this is one exhausted turn too many (``check_exhausted``).
The request's own history counts first; the session's state (``loops:<session id>`` in the shared
state, ``infra.shared_state``: Redis with ``REDIS_URL``, else process memory; a JSON value with a TTL of
``LOOP_SESSION_TTL_SECONDS``) adds the steps and exhausted turns the history lacks (a compacted
history, an agent that sends only its last step, a user who types "continue" into a fresh request).

Without a session header a request joins a session only with proof (``session_id``): its history holds
the conversation's first delivered turn; a new conversation reads no state and starts its chain with
the turn it is delivered (``chain_session``), so two independent runs with one opening never share.

Reads and writes of the state fail open (the shared state never raises: unknown state is an empty
state), so a sick Redis only loses the state's addition, never a request.
"""

from __future__ import annotations

import json
import logging

from django.conf import settings

from infra import metrics
from infra.shared_state import get_state
from proxy.guard.decisions.loops import (
    Step,
    Stuck,
    chain_session,
    check_exhausted,
    check_turn,
    history_steps,
    merge,
    state_dumps,
    state_loads,
    turn_key,
)
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from proxy.guard.policy import GuardPolicy
from proxy.guard.turn import Turn

logger = logging.getLogger(__name__)

_PREFIX = "loops:"


class LoopBreaker:
    """The loop check of one request of session ``session`` (``proxy.guard.decisions.loops.session_id``), whose
    chat.completions ``messages`` are its history, under ``policy``."""

    def __init__(self, *, session: str, messages: object, policy: GuardPolicy) -> None:
        self.session = session
        self.policy = policy
        self._history, self._history_exhausted = history_steps(messages, policy)
        self._steps: list[Step] | None = None
        self._exhausted = 0
        #: The loop found (set by a ``check_*`` that found one), for the audit.
        self.stuck: Stuck | None = None

    @property
    def enabled(self) -> bool:
        """True when the policy turns the breaker on and the request has a session."""
        return self.policy.loop_breaker and bool(self.session)

    async def _load(self) -> list[Step]:
        if self._steps is None:
            remembered: list[Step] = []
            exhausted = 0
            raw = None if self._new else await get_state().recall(_PREFIX + self.session)
            if raw:
                try:
                    remembered, exhausted = state_loads(json.loads(raw))
                except ValueError:
                    remembered, exhausted = [], 0
            self._steps = merge(remembered, self._history)
            self._exhausted = max(exhausted, self._history_exhausted)
        return self._steps

    @property
    def _new(self) -> bool:
        """A new conversation (no session header, no assistant turn yet): it has no state to join."""
        return self.session.startswith("n:")

    async def _save(self, steps: list[Step], exhausted: int, *, turn: Turn | None = None) -> None:
        session = chain_session(self.session, turn) if self._new and turn is not None else \
            ("" if self._new else self.session)
        if session:
            await get_state().remember(_PREFIX + session, json.dumps(state_dumps(steps, exhausted)),
                                       settings.LOOP_SESSION_TTL_SECONDS)

    async def check_turn(self, turn: Turn) -> Stuck | None:
        """The loop ``turn`` would complete (None: deliver it). Remembers the session's steps (the turn itself
        counts once the next request's history shows it with its results) and that no turn ended exhausted."""
        if not self.enabled:
            return None
        steps = await self._load()
        key = turn_key(turn, self.policy)
        self.stuck = check_turn(steps, key, self.policy)
        if self.stuck is not None:
            metrics.LOOPS_BROKEN.labels(rule=self.stuck.rule).inc()
        await self._save(steps, 0, turn=turn)
        return self.stuck

    async def check_exhausted(self) -> Stuck | None:
        """Whether this exhausted request is one exhausted turn too many in a row (None: answer it as
        exhausted). Remembers the exhausted turn (or, when it is replaced by the stuck answer, a fresh count)."""
        if not self.enabled:
            return None
        steps = await self._load()
        self.stuck = check_exhausted(self._exhausted, self.policy)
        if self.stuck is not None:
            metrics.LOOPS_BROKEN.labels(rule=self.stuck.rule).inc()
        await self._save(steps, 0 if self.stuck is not None else self._exhausted + 1)
        return self.stuck

    def finding(self) -> Finding | None:
        """The ``agent-loop`` finding of the loop found, with its rule and fingerprints, else None."""
        if self.stuck is None:
            return None
        prints = ", ".join(self.stuck.fingerprints)
        detail = f"{self.stuck.rule}: {self.stuck.detail}" + (f" [fingerprints: {prints}]" if prints else "")
        return Finding(FindingKind.AGENT_LOOP, Severity.WARNING, Action.IGNORED, detail[:2000])
