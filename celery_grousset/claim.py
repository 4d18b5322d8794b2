"""The claim's decision table, in one place (docs/how-it-works.md, "The claim").

A claim is one atomic read-decide-write on the journal row of
``(processor_id, fingerprint)``. :data:`RULES` is the table: ordered rules, each a
list of named conditions on the locked row and the :class:`Kind` it decides. The
stores that lock the row first (SQLite, MySQL/MariaDB) call :func:`decide` on what
they read; the PostgreSQL store evaluates the same rules inside its single
statement, as SQL generated from :data:`RULES` (:func:`decision_sql`). What each
decision writes is :data:`WRITES`. ``tests/test_claim.py`` runs every rule through
both forms.

=============================================  ===============  ==========================
row found                                      decision         write
=============================================  ===============  ==========================
nothing                                        ``NEW``          insert, clock fence
in flight, the caller's own token (re-sent)    ``RESUMED``      nothing
inside its retention, for other arguments      ``MISMATCH``     count a delivery
in flight, before its ``stale_at``             ``IN_FLIGHT``    count a delivery
in flight, stale, ``max_takeovers`` reached    ``GAVE_UP``      row -> failed
in flight, stale                               ``TAKEOVER``     claim (next fence)
``expires_on`` passed                          ``EXPIRED``      claim, counters reset
failed and released (no memo)                  ``RECLAIM``      claim
completed                                      ``COMPLETED``    count a delivery
anything else (a memoized failure)             ``FAILED``       count a delivery
=============================================  ===============  ==========================

"Other arguments" (:data:`OTHER_PAYLOAD`) is :func:`payload_differs` of the row's and
the caller's payload hashes: a keyed call never gets, waits for, takes over or claims
again a record its key holds for another payload inside its retention (the caller
raises ``PayloadMismatch``); only an expired record is claimed afresh by any arguments.

"Stale" is one rule (:data:`STALE`, :func:`deadline`): the row's own ``stale_at``, written
by the claim as ``started_at + max_processing_time`` on the database clock (a 0.1.0
worker's claim, which writes none, by its claimant's ``max_processing_time``).
The admin, the management commands and the metrics read the same column through
:mod:`celery_grousset.journal`.

Fences never go back for a key, even after its row is purged: a claim that takes a
row writes :func:`next_fence` — the greater of the row's fence + 1 and the claim's
moment on the database clock in microseconds since the epoch (:func:`clock_fence`); a
new row gets the clock value. A row inserted after a purge is therefore above every
fence issued before it, as long as the database clock does not step back
(docs/guarantee.md, "Fencing tokens").
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone


class Status(str, enum.Enum):
    IN_FLIGHT = "in_flight"
    COMPLETED = "completed"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class Write(enum.Enum):
    """What a decision writes to the row."""

    INSERT = "insert"  #: a new row, fence = the clock (:func:`clock_fence`)
    CLAIM = "claim"  #: the caller takes the row: new token, :func:`next_fence`
    CLAIM_RESET = "claim_reset"  #: the same, on an expired row: counters start again
    GIVE_UP = "give_up"  #: the row turns failed (``max_takeovers`` reached)
    COUNT = "count"  #: one more delivery, nothing else
    NOTHING = "nothing"  #: the caller's own claim, re-sent


class Kind(str, enum.Enum):
    """The decision of one claim: what the store did and what the caller does next."""

    NEW = "new"  #: nothing there: the caller owns a fresh record
    EXPIRED = "expired"  #: a record past its retention window, claimed afresh
    RECLAIM = "reclaim"  #: a released failure claimed again
    TAKEOVER = "takeover"  #: a stale claim of a dead attempt taken over
    RESUMED = "resumed"  #: the caller's own claim, re-sent after a lost connection
    COMPLETED = "duplicate"  #: done before: return the memo
    IN_FLIGHT = "in_flight"  #: another attempt holds a fresh claim
    FAILED = "failed"  #: a memoized failure (or a record given up): replay it
    GAVE_UP = "gave_up"  #: this claim found the record taken over ``max_takeovers`` times
    MISMATCH = "payload_mismatch"  #: a stale or released record of other arguments
    BYPASSED = "bypassed"  #: the bypass switch is on: no claim was made

    @property
    def owned(self) -> bool:
        """Whether the caller now holds the claim and runs the effect."""
        return WRITES.get(self) in _OWNING or self is Kind.RESUMED

    @property
    def code(self) -> str:
        """The one-letter name of this decision inside the PostgreSQL statement."""
        return _CODES[self]

    @classmethod
    def from_code(cls, code: str) -> Kind:
        return _BY_CODE[code]


#: what each decision writes (BYPASSED makes no claim at all)
WRITES: dict[Kind, Write] = {
    Kind.NEW: Write.INSERT,
    Kind.RESUMED: Write.NOTHING,
    Kind.IN_FLIGHT: Write.COUNT,
    Kind.GAVE_UP: Write.GIVE_UP,
    Kind.TAKEOVER: Write.CLAIM,
    Kind.EXPIRED: Write.CLAIM_RESET,
    Kind.RECLAIM: Write.CLAIM,
    Kind.COMPLETED: Write.COUNT,
    Kind.FAILED: Write.COUNT,
    Kind.MISMATCH: Write.COUNT,
}
_OWNING = frozenset({Write.INSERT, Write.CLAIM, Write.CLAIM_RESET})

# '' is NEW: the statement's lookup found no row to decide on. The codes of the decisions
# that take the row (r, t, x) sort after 'q' and all others before it: the PostgreSQL
# statement tests "claims" with one comparison (checked where it does).
_CODES = {
    Kind.NEW: "",
    Kind.RESUMED: "o",
    Kind.IN_FLIGHT: "i",
    Kind.GAVE_UP: "g",
    Kind.TAKEOVER: "t",
    Kind.EXPIRED: "x",
    Kind.RECLAIM: "r",
    Kind.COMPLETED: "c",
    Kind.FAILED: "f",
    Kind.MISMATCH: "m",
    Kind.BYPASSED: "b",
}
_BY_CODE = {code: kind for kind, code in _CODES.items()}

#: the ``task_name`` of protect() records and the namespace of their fingerprints
PROTECT_NAME = "protect"

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
    #: BLAKE3 of all the bound arguments of a keyed call ('' for a plain call, or when
    #: payload validation is off): written by every claim that takes the row
    payload_hash: str = ""
    #: this delivery is an in-flight requeue of one already counted (grousset_counted)
    bounce: bool = False


@dataclass(frozen=True, slots=True)
class Prev:
    """The columns of an existing row that the decision reads."""

    status: str
    stale_at: datetime
    expires_on: datetime
    result_encoding: str
    takeovers: int
    claim_token: str
    payload_hash: str = ""
    #: the delivery that holds (or completed) the row
    task_id: str = ""
    #: when the holder claimed it, and its fence (None where the reader does not fetch
    #: them): together they tell a 0.1.0 worker's claim (:func:`deadline`)
    started_at: datetime | None = None
    fence: int | None = None


def payload_differs(stored: str, given: str) -> bool:
    """Whether a keyed call's payload hash refuses the record's: both known and
    different ('' is unknown: a plain call, validation off, an older record)."""
    return bool(stored) and bool(given) and stored != given


@dataclass(frozen=True, slots=True)
class Condition:
    """One named test on the locked row, in Python and in SQL (row alias ``o``; the
    statement's parameters ``%(tok)s``, ``%(maxt)s``; ``{now}`` is the database clock)."""

    name: str
    test: Callable[[Prev, datetime, ClaimRequest], bool]
    sql: str


HELD = Condition("in flight", lambda p, now, r: p.status == Status.IN_FLIGHT,
                 "o.status = 'in_flight'")
OWN = Condition("the caller's own token", lambda p, now, r: p.claim_token == r.token,
                "o.claim_token = %(tok)s")


def deadline(p: Prev, r: ClaimRequest) -> datetime:
    """When the claim in ``p`` turns stale for the claimant ``r``: the ``stale_at`` its
    holder's claim wrote. A claim of this version writes a fence at or above its
    ``started_at`` on the clock (:func:`clock_fence`, :func:`next_fence`); a 0.1.0 worker
    counts the fence up by one and writes no ``stale_at`` (a fleet upgraded without a full
    stop, docs/operations.md; or a claim in flight at the upgrade). Such a claim, its
    fence below its ``started_at``, is judged as 0.1.0 judges it: ``started_at`` + the
    claimant's own ``max_processing_time``."""
    if unwritten_deadline(p.fence, p.started_at):
        assert p.started_at is not None
        return p.started_at + timedelta(seconds=r.max_processing_time)
    return p.stale_at


def unwritten_deadline(fence: int | None, started_at: datetime | None) -> bool:
    """Whether the claim of a row (its ``fence`` and ``started_at``) was made by a 0.1.0
    worker, which writes no ``stale_at`` (unknown: False)."""
    return fence is not None and started_at is not None and fence < clock_fence(started_at)


#: the SQL of :func:`clock_fence` on the timestamp ``{t}`` (the PostgreSQL statements)
CLOCK_FENCE_SQL = "(EXTRACT(EPOCH FROM {t}) * 1000000)::int8"
#: :func:`deadline` in SQL, on the row ``o`` (``%(mpt)s``: the claimant's, an interval)
DEADLINE_SQL = (
    f"(CASE WHEN o.fence < {CLOCK_FENCE_SQL.format(t='o.started_at')} "
    "THEN o.started_at + %(mpt)s ELSE o.stale_at END)"
)
#: the one definition of a stale claim: past the deadline its holder's claim wrote
STALE = Condition("stale", lambda p, now, r: deadline(p, r) <= now, f"{DEADLINE_SQL} <= {{now}}")
FRESH = Condition("not stale", lambda p, now, r: deadline(p, r) > now,
                  f"{DEADLINE_SQL} > {{now}}")
EXHAUSTED = Condition("max_takeovers reached", lambda p, now, r: p.takeovers >= r.max_takeovers,
                      "o.takeovers >= %(maxt)s")
EXPIRED = Condition("retention passed", lambda p, now, r: p.expires_on <= now,
                    "o.expires_on <= {now}")
LIVE = Condition("inside its retention", lambda p, now, r: p.expires_on > now,
                 "o.expires_on > {now}")
RELEASED = Condition(
    "a released failure",
    lambda p, now, r: p.status == Status.FAILED and p.result_encoding == ENC_NONE,
    "o.status = 'failed' AND o.result_encoding = ''",
)
#: the one definition of "the record's own delivery again": the row's task id, given
#: again (a broker redelivery, a Celery retry). A ``protect()`` call has no task id, so
#: each call is another delivery.
OWN_DELIVERY = Condition(
    "the record's own delivery",
    lambda p, now, r: bool(r.task_id) and r.task_id == p.task_id,
    "(%(tid)s <> '' AND o.task_id = %(tid)s)",
)
#: a keyed call's arguments differ from the record's, and it is not the record's own
#: delivery again: a Celery retry keeps its task id and may change its arguments
#: (``self.retry(kwargs=…)``)
OTHER_PAYLOAD = Condition(
    "claimed for other arguments",
    lambda p, now, r: payload_differs(p.payload_hash, r.payload_hash)
    and not OWN_DELIVERY.test(p, now, r),
    f"%(ph)s <> '' AND o.payload_hash NOT IN ('', %(ph)s) AND NOT {OWN_DELIVERY.sql}",
)
DONE = Condition("completed", lambda p, now, r: p.status == Status.COMPLETED,
                 "o.status = 'completed'")

#: The decision table, first match wins (a row always exists here: no row is ``NEW``).
RULES: tuple[tuple[tuple[Condition, ...], Kind], ...] = (
    ((HELD, OWN), Kind.RESUMED),
    ((OTHER_PAYLOAD, LIVE), Kind.MISMATCH),
    ((HELD, FRESH), Kind.IN_FLIGHT),
    ((HELD, EXHAUSTED), Kind.GAVE_UP),
    ((HELD,), Kind.TAKEOVER),
    ((EXPIRED,), Kind.EXPIRED),
    ((RELEASED,), Kind.RECLAIM),
    ((DONE,), Kind.COMPLETED),
    ((), Kind.FAILED),
)


def clock_fence(now: datetime) -> int:
    """The fence of a new row claimed at ``now`` (database clock; naive: UTC, as Django
    reads it under ``USE_TZ = False``): microseconds since the Unix epoch. The PostgreSQL
    statement computes the same value in SQL."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    return (now - _EPOCH) // _MICROSECOND


def next_fence(fence: int, now: datetime) -> int:
    """The fence of a claim that takes a row whose fence is ``fence``, at ``now``."""
    return max(fence + 1, clock_fence(now))


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


#: The claim is a redelivery of a delivery already counted: the record's own delivery
#: again or an in-flight requeue. Every other delivery that the row answers (memo,
#: memoized failure, in-flight policy, gave up) is a duplicate.
REDELIVERY = Condition(
    "a redelivery",
    lambda p, now, r: r.bounce or OWN_DELIVERY.test(p, now, r),
    f"(%(bounce)s OR {OWN_DELIVERY.sql})",
)


def is_duplicate(kind: Kind, prev: Prev, req: ClaimRequest) -> bool:
    """Whether this claim counts as a duplicate: another delivery of the key that the row
    answers (the memo, a memoized failure, the in-flight policy, gave up), not a
    redelivery (docs/operations.md, "Deliveries, duplicates and redeliveries")."""
    answered = WRITES[kind] in (Write.COUNT, Write.GIVE_UP)
    return answered and not REDELIVERY.test(prev, prev.stale_at, req)


def recorded(kind: Kind, prev: Prev, req: ClaimRequest) -> str | None:
    """The task id this claim adds to the deliveries table (``Delivery``), or None: a claim
    by another delivery than the row's records that delivery when the row answers it, or
    the row's own delivery when the claim takes the row from it; never an empty task id
    (``protect()``). The PostgreSQL statement applies the same rule in SQL."""
    if WRITES[kind] is Write.NOTHING or OWN_DELIVERY.test(prev, prev.stale_at, req):
        return None
    return (prev.task_id if kind.owned else req.task_id) or None


def decide(prev: Prev | None, now: datetime, req: ClaimRequest) -> Kind:
    """The decision for ``req`` on the row ``prev``; ``now`` is the database clock."""
    if prev is None:
        return Kind.NEW
    for conditions, kind in RULES:
        if all(c.test(prev, now, req) for c in conditions):
            return kind
    raise AssertionError("the last rule matches every row")  # pragma: no cover


def decision_sql(now: str) -> str:
    """:data:`RULES` as one SQL ``CASE`` on the row ``o``, giving each decision's code."""
    whens = [
        f"WHEN {' AND '.join(f'({c.sql})' if ' OR ' in c.sql else c.sql for c in conditions)} "
        f"THEN '{kind.code}'"
        for conditions, kind in RULES[:-1]
    ]
    return f"CASE {' '.join(whens)} ELSE '{RULES[-1][1].code}' END".format(now=now)


def codes(*writes: Write) -> str:
    """The codes of the decisions that make these writes, as a SQL list: ``('x','t')``."""
    return "(" + ",".join(f"'{k.code}'" for k, w in WRITES.items() if w in writes) + ")"


def gave_up_message(takeovers: int | str) -> str:
    return (
        f"GaveUp: the claim was taken over {takeovers} times (max_takeovers, counted over "
        "the record's whole life) by deliveries that found it stale: its attempts died, or "
        "ran past max_processing_time, before completing. The task probably kills its "
        "worker (memory limit, segfault, hard time limit) or runs longer than its "
        "max_processing_time (an attempt still running records its outcome when it ends: "
        "if `manage.py grousset_inspect <fingerprint>` then reads completed, the call ran). "
        "Otherwise, once none runs, fix the task, run `manage.py grousset_release "
        "<fingerprint> --force`, then publish the call again: the deliveries that gave up "
        "were acknowledged."
    )
