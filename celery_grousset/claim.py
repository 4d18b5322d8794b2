"""The claim state machine: the decision table of DESIGN §4, in one place.

A claim is one atomic read-decide-write on the journal row of
``(processor_id, fingerprint)``. The stores that lock the row first (SQLite,
MySQL/MariaDB) call :func:`decide` on what they read; the PostgreSQL store
evaluates the same table inside its single ``INSERT … ON CONFLICT`` statement
(see ``store/postgresql.py``), and the store contract tests hold both to the same
behaviour.

================================================  ==============  ===========
row found                                         action          owned
================================================  ==============  ===========
nothing                                           ``INSERT``      yes
completed/failed, ``expires_on`` passed           ``RECLAIM``     yes (counters reset)
failed and released (``result_encoding == ""``)   ``RECLAIM``     yes
in flight, older than ``max_processing_time``     ``TAKEOVER``    yes (fence + 1)
… and already taken over ``max_takeovers`` times  ``GIVE_UP``     no (row → failed)
in flight and fresh, completed, memoized failure  ``NONE``        no
================================================  ==============  ===========

Every claim that does not own the row still counts a delivery, except a re-sent
claim with the caller's own token (a retry after a lost connection), which is
recognised as the caller's own and changes nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta


class Status(str, enum.Enum):
    IN_FLIGHT = "in_flight"
    COMPLETED = "completed"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class Action(enum.Enum):
    INSERT = "insert"
    RECLAIM = "reclaim"
    TAKEOVER = "takeover"
    GIVE_UP = "give_up"
    NONE = "none"


class Kind(str, enum.Enum):
    """What a claim found, from the caller's point of view."""

    NEW = "new"  #: nothing there: the caller owns a fresh record
    RECLAIM = "reclaim"  #: expired or released record claimed again
    TAKEOVER = "takeover"  #: a stale claim of a dead attempt taken over
    RESUMED = "resumed"  #: the caller's own claim, re-sent after a lost connection
    COMPLETED = "duplicate"  #: done before: return the memo
    IN_FLIGHT = "in_flight"  #: another attempt holds a fresh claim
    FAILED = "failed"  #: a memoized failure: replay it
    GAVE_UP = "gave_up"  #: taken over ``max_takeovers`` times: marked failed
    BYPASSED = "bypassed"  #: the bypass switch is on: no claim was made

    @property
    def owned(self) -> bool:
        return self in _OWNED


_OWNED = frozenset({Kind.NEW, Kind.RECLAIM, Kind.TAKEOVER, Kind.RESUMED})

#: ``result_encoding`` markers (a content type otherwise, e.g. ``application/json``).
ENC_NONE = ""  #: nothing stored (in flight, or a released failure)
ENC_NOT_MEMOIZED = "grousset/not-memoized"  #: ``memoize=False``: duplicates get None
ENC_NOT_STORED = "grousset/not-stored"  #: could not be stored: duplicates raise
ENC_EXCEPTION = "grousset/exception"  #: ``on_failure="memoize"``: replay the error
ENC_GAVE_UP = "grousset/gave-up"  #: ``max_takeovers`` reached


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Everything one claim writes or compares. Times are seconds."""

    processor_id: str
    fingerprint: str
    task_name: str
    task_id: str
    token: str
    worker: str
    args_repr: str
    max_processing_time: float
    expires_after: float
    max_takeovers: int


@dataclass(frozen=True, slots=True)
class Prev:
    """The columns of an existing row that the decision reads."""

    status: str
    started_at: datetime
    expires_on: datetime
    result_encoding: str
    takeovers: int
    claim_token: str


def decide(prev: Prev | None, now: datetime, req: ClaimRequest) -> Action:
    """The decision table. ``now`` is the database clock."""
    if prev is None:
        return Action.INSERT
    if prev.status == Status.IN_FLIGHT:
        if prev.claim_token == req.token:
            return Action.NONE  # our own claim, re-sent
        if prev.started_at <= now - timedelta(seconds=req.max_processing_time):
            if prev.takeovers >= req.max_takeovers:
                return Action.GIVE_UP
            return Action.TAKEOVER
        return Action.NONE
    if prev.expires_on <= now:
        return Action.RECLAIM
    if prev.status == Status.FAILED and prev.result_encoding == ENC_NONE:
        return Action.RECLAIM
    return Action.NONE


def kind_of(
    prev_status: str | None, owned: bool, own_resend: bool, status: str, result_encoding: str
) -> Kind:
    """Name what a claim found from the previous status and the row it left."""
    if owned:
        if own_resend:
            return Kind.RESUMED
        if prev_status is None:
            return Kind.NEW
        return Kind.TAKEOVER if prev_status == Status.IN_FLIGHT else Kind.RECLAIM
    if status == Status.COMPLETED:
        return Kind.COMPLETED
    if status == Status.IN_FLIGHT:
        return Kind.IN_FLIGHT
    return Kind.GAVE_UP if result_encoding == ENC_GAVE_UP else Kind.FAILED


def gave_up_message(takeovers: int | str) -> str:
    return (
        f"GaveUp: the claim was taken over {takeovers} times (max_takeovers) and every "
        "attempt died before completing; the task probably kills its worker (memory "
        "limit, segfault, hard time limit). Fix the task, then run "
        "`manage.py grousset_release <fingerprint> --force` to allow another attempt."
    )
