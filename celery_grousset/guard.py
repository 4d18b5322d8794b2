"""THE guarded flow, for every caller (docs/how-it-works.md):

options -> fingerprint (arguments bound once) -> claim -> in-flight policy ->
answer a duplicate from its memo | run the owner -> fenced completion.

:func:`guarded` is the whole decision, top to bottom. What differs between callers
(:class:`~celery_grousset.task.GroussetTask` re-queues a delivery, ``protect()``
waits or raises; a task binds ``self.grousset`` around its body) enters through a
:class:`Caller`; nothing of the flow is written twice.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import socket
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from celery.exceptions import SoftTimeLimitExceeded

from celery_grousset import carry, events, memo, preclaim, testcase_check
from celery_grousset.binding import loose_bind
from celery_grousset.claim import PROTECT_NAME, ClaimRequest, Kind, payload_differs
from celery_grousset.completion import fail, run_owned
from celery_grousset.conf import grousset_settings, redact_keys
from celery_grousset.exceptions import (
    FingerprintError,
    PayloadMismatch,
    PoisonDelivery,
    StoreUnavailable,
    TransactionLost,
)
from celery_grousset.faults import fault
from celery_grousset.fingerprint import bind_arguments, fingerprint_bound, payload_hash
from celery_grousset.inflight import wait_until_settled
from celery_grousset.options import Options
from celery_grousset.publish_check import effect_in_transaction
from celery_grousset.quoted import call_secrets, redacted_call, without_values
from celery_grousset.running import not_running
from celery_grousset.store import ClaimResult, Store, check_claimable, get_store, turns

__all__ = [
    "Attempt", "Call", "Caller", "Options", "fail", "fault", "guarded", "run_owned", "worker_id"
]


@dataclass(frozen=True, slots=True)
class Call:
    """One call as its caller sees it, before it is fingerprinted."""

    name: str  #: task name, or protect()'s namespace
    task_id: str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    signature: inspect.Signature | None = None
    #: binds the arguments by name for redaction alone (protect()'s function: its
    #: fingerprint and payload hash stay positional, as they were)
    names: inspect.Signature | None = None
    key: Sequence[str] | Callable[..., Any] | None = None  #: grousset_key
    idempotency_key: str | None = None
    serializer: str = "json"
    delivery: str = ""  #: broker delivery info, for the duplicate log line
    bounce: bool = False  #: an in-flight requeue of a delivery already counted
    args_repr: str | None = None  #: a repr of the caller's own (protect()'s key)
    slot: str | None = None  #: a periodic run's slot: keyed with it (celery_grousset.periodic)
    retry_of: tuple[str, str] | None = None  #: a retry's mark (delivery.retry_of)


@dataclass(slots=True)
class Attempt:
    """What a running attempt knows about its claim (``self.grousset`` in a task)."""

    fingerprint: str
    fence: int
    deliveries: int
    takeovers: int
    kind: Kind
    processor_id: str
    token: str = field(repr=False)


class Caller(Protocol):
    """How one kind of caller differs: its options, its in-flight policy, what happens
    when the claim must wait or the store is down, and how its body runs.

    Six hooks are optional: ``accept`` (the serializers a duplicate's memo may be decoded
    with; without it, only the call's own ``serializer``), ``poison(exc)`` (a call the
    journal can never record: a task rejects its delivery; without it, it is raised),
    ``carry(outcome, exc)`` (the completion could not be written: a task requeues its
    delivery carrying the outcome; without it, StoreUnavailable is raised), ``carried``
    (the outcome a requeued delivery carries: :mod:`celery_grousset.carry`),
    ``stop_canvas(req, encoding, first)`` (answered unrun: with no memo, no callback) and
    ``wait_within`` (the seconds a "wait" may take: a task's time limit; None: any)."""

    def options(self) -> Options: ...

    def in_flight_policy(self, opts: Options) -> str:
        """``"wait"`` (poll here), or anything else: :meth:`defer`."""

    def defer(self, req: ClaimRequest, res: ClaimResult) -> NoReturn:
        """Another attempt holds a fresh claim: re-queue (a task) or raise (protect())."""

    def store_unavailable(self, exc: StoreUnavailable) -> NoReturn:
        """The claim could not be made: fail closed (re-queue later, or raise)."""

    def run(self, attempt: Attempt) -> Any:
        """The body, for an attempt that owns the claim."""


def guarded(caller: Caller, call: Call) -> Any:
    """Run ``call`` at most once per key: the whole guarded flow."""
    opts = caller.options()
    local = getattr(caller, "local", False)  # protect(), an eager or direct call
    if local or test_database_check:  # in a test's process, its claims must stay in it
        (test_database_check or testcase_check.refuse_leaks)(opts.database)
    fp, args_repr, payload = identity(call, opts.validate_payload)
    store = get_store(opts.database)
    req = request(opts, fp, call.name, call.task_id, args_repr, payload_hash=payload,
                  bounce=call.bounce)  # fmt: skip
    not_running(store, req)  # a call of the key inside its own body: refused
    held = carry.pending(caller, req)  # what a requeued delivery carries (celery_grousset.carry)
    if held is not None and held[1] is not None:  # an outcome whose completion failed
        return carry.deliver(caller, store, req, held[0], held[1], accept_of(caller, call))
    unsettled = req if held is None else held[0]  # the claim a requeue must settle
    carried = None  # (a claim the worker's main process made: committed, whatever the store)
    try:
        check_claimable(req)  # a poison delivery never reaches the database
        if held is not None:  # a claim whose answer was lost: find out, never guess
            carry.settle_lost_claim(store, held[0])
        req, carried = preclaim.own(caller, req)  # claimed by the worker's main process
        unsettled = req  # (its renewal interrupted: the requeue settles the carried claim)
        adopted = preclaim.adopt(caller, store, req, carried)
        [res] = [adopted] if adopted is not None else claim(store, [req])
        if res.kind is Kind.IN_FLIGHT:
            check_payload(req, res)  # held for other arguments: refused, never waited for
            policy = caller.in_flight_policy(opts)
            events.in_flight(req, res, policy)
            if policy == "wait":
                within = getattr(caller, "wait_within", None)  # (a task's time limit)
                res = wait_until_settled(store, req, res, lambda r: claim(store, [r])[0], within)
            if res.kind is Kind.IN_FLIGHT:  # not waited for, or not settled in time
                caller.defer(req, res)
    except StoreUnavailable as exc:
        carry.claim_unavailable(caller, lost(store, unsettled, carried), exc)
    except SoftTimeLimitExceeded as exc:  # a statement interrupted: it may commit yet
        carry.claim_interrupted(caller, store, req, unsettled, exc)  # (or have, on SQLite)
    except PoisonDelivery as exc:
        poisoned(caller, req, exc)
    if not res.owned:
        check_payload(req, res)
        if hasattr(caller, "stop_canvas"):  # a duplicate with no memo has no value to pass on
            caller.stop_canvas(req, res.result_encoding, res.task_id)
        return answer(req, res, call.delivery, accept_of(caller, call))
    attempt = Attempt(fingerprint=fp, fence=res.fence, deliveries=res.deliveries,
                      takeovers=res.takeovers, kind=res.kind, processor_id=opts.processor_id,
                      token=req.token)  # fmt: skip
    if local:  # run in the caller's process: inside one of its transactions?
        effect_in_transaction(call.name, opts.database if opts.transactional else None)
    scope = memo.SECRETS.set(lambda: secrets_of(call))  # kept out of its error text
    try:
        return run_owned(
            store, opts, req, res, lambda: caller.run(attempt), call.serializer,
            carry.hook(caller, req, time.time() + res.retry_in),  # (an owned claim's)
        )  # fmt: skip
    except TransactionLost as exc:  # the next delivery finds out whether it committed
        carry.claim_unavailable(caller, req, exc)
    finally:
        memo.SECRETS.reset(scope)


def lost(store: Store, unsettled: ClaimRequest, carried: object) -> ClaimRequest | None:
    """The claim a requeue must settle: one whose answer may be lost (a remote journal),
    or the claim the worker's main process made for this delivery (None: none)."""
    return unsettled if store.remote or carried is not None else None


def identify(call: Call) -> tuple[str, str]:
    """The call's fingerprint and its redacted repr, from ONE binding of its arguments."""
    fp, args_repr, _ = identity(call, payload=False)
    return fp, args_repr


def identity(call: Call, payload: bool = True) -> tuple[str, str, str]:
    """The call's fingerprint, its redacted repr and (``payload``: validation on) its
    payload hash, all from ONE binding of its arguments."""
    fp, bound = _fingerprint(call)
    ph = _payload_hash(call, bound) if payload else ""
    if call.args_repr is not None:  # protect()'s key: its arguments' secrets masked there
        masked = call.args or call.kwargs
        shown = without_values(call.args_repr, secrets_of(call)) if masked else call.args_repr
        return fp, shown, ph
    if call.signature is not None and bound is None:  # they do not fit it (a key names them)
        bound = loose_bind(call.signature, call.args, call.kwargs)
    shown = redacted(call.args, call.kwargs, bound if call.signature is not None else None)
    return fp, shown, ph


def _payload_hash(call: Call, bound: Mapping[str, object] | None) -> str:
    """The hash of ALL the bound arguments of a call whose key names fewer of them
    (``idempotency_key``, ``grousset_key``). '' when there is nothing to tell apart: a
    plain call (its fingerprint covers every argument), a call that gave the guard no
    arguments (``protect()``), arguments without a canonical encoding."""
    if call.idempotency_key is None and call.key is None:
        return ""
    if bound is None or (call.signature is None and not call.args and not call.kwargs):
        return ""
    try:
        return payload_hash(call.name, bound)
    except FingerprintError:
        return ""


def check_payload(req: ClaimRequest, res: ClaimResult) -> None:
    """Raise :class:`PayloadMismatch` when the record of this key was claimed by a call
    with other arguments (both hashes known and different): its answer is not this
    call's. Logged as ``grousset.payload_mismatch``."""
    if not payload_differs(res.payload_hash, req.payload_hash):
        return
    events.payload_mismatch(req, res)
    by, keys, off = (
        ("another protect() call", "key", "pass validate_payload=False to protect()")
        if req.task_name == PROTECT_NAME
        else (f"task id {res.task_id or '-'}", "idempotency_key / grousset_key",
              "set validate_payload=False on the task")
    )  # fmt: skip
    raise PayloadMismatch(
        f"{req.task_name}: the key of this call (fingerprint {req.fingerprint[:16]}…) was "
        f"used before with other arguments (its record is {res.status}, claimed by {by}). "
        "Its answer belongs to that call, so it is not returned, and this call did not run. "
        f"Give each operation its own {keys}; if the key is meant to cover varying "
        f"arguments, {off} (or GROUSSET['VALIDATE_PAYLOAD'] = False).",
        fingerprint=req.fingerprint,
        stored_hash=res.payload_hash,
        given_hash=req.payload_hash,
    )


def fingerprint_of(call: Call) -> str:
    """The call's fingerprint alone (publish-time checks)."""
    return _fingerprint(call)[0]


def fingerprint_and_payload(call: Call, payload: bool) -> tuple[str, str]:
    """The call's fingerprint and (``payload``: validation on) its payload hash
    (``publish_unique``)."""
    fp, bound = _fingerprint(call)
    return fp, _payload_hash(call, bound) if payload else ""


def _fingerprint(call: Call) -> tuple[str, dict[str, object] | None]:
    try:
        bound = bind_arguments(call.signature, call.args, call.kwargs, call.name)
    except FingerprintError:
        if call.idempotency_key is None:
            raise
        bound = None  # the key names the call; the repr falls back to call-like
    fp = fingerprint_bound(
        call.name, bound, signature=call.signature, key=call.key,
        idempotency_key=call.idempotency_key, causality=call.slot,
    )  # fmt: skip
    if call.retry_of is not None and call.retry_of[1] == fp:  # a Celery retry's message:
        return call.retry_of[0], bound  # the call it retries, whatever its arguments
    return fp, bound


def named(call: Call) -> dict[str, object] | None:
    """The call's arguments bound by name to its task's signature, so that a positional
    secret is known by its name (loosely when they do not fit it:
    :func:`~celery_grousset.binding.loose_bind`); None without a signature."""
    signature = call.signature or call.names
    if signature is None:
        return None
    try:
        return bind_arguments(signature, call.args, call.kwargs)
    except FingerprintError:  # named as far as the signature names them
        return loose_bind(signature, call.args, call.kwargs)


def secrets_of(call: Call) -> list[str]:
    """The values the call's sensitive arguments hold (bound to the signature, so a
    positional one is found too): what its stored error text must not quote."""
    return call_secrets(call.kwargs, named(call), redact_keys())


def redacted(
    args: Sequence[Any], kwargs: Mapping[str, Any], bound: Mapping[str, object] | None
) -> str:
    """The only text of a call's arguments the package stores or shows: redacted by name
    (bound to the signature, so a positional secret is redacted too), truncated; a
    sensitive argument's value quoted in another one is masked there too."""
    length = int(grousset_settings.ARGS_REPR_MAX_LENGTH)
    return redacted_call(args, kwargs, bound, redact_keys(), length)


#: set by the pytest plugin (celery_grousset.contrib.pytest) during a test: refuses a
#: call in the test's process (an in-process worker's too) whose claims would leak out
test_database_check: Callable[[str], None] | None = None

_worker_id: tuple[int, str] = (0, "")


def worker_id() -> str:
    """``hostname:pid`` of this process (cached per pid)."""
    global _worker_id
    pid = os.getpid()
    if _worker_id[0] != pid:
        _worker_id = (pid, f"{socket.gethostname()}:{pid}")
    return _worker_id[1]


def request(
    opts: Options,
    fingerprint: str,
    task_name: str,
    task_id: str,
    args_repr: str,
    token: str | None = None,
    payload_hash: str = "",
    bounce: bool = False,
) -> ClaimRequest:
    return ClaimRequest(
        processor_id=opts.processor_id,
        fingerprint=fingerprint,
        task_name=task_name,
        task_id=task_id,
        token=token or uuid.uuid4().hex,
        worker=worker_id(),
        args_repr=args_repr,
        max_processing_time=opts.max_processing_time,
        expires_after=opts.expires_after,
        max_takeovers=opts.max_takeovers,
        payload_hash=payload_hash,
        bounce=bounce,
    )


def claim(store: Store, reqs: Sequence[ClaimRequest], *, report: bool = True) -> list[ClaimResult]:
    """Ask the store (one result per request); count each, report takeovers and give-ups
    (``report`` False: the caller reports those it acts on, :func:`events.decided`).
    Raises StoreUnavailable, reported always: each failed claim is an attempt of its own."""
    t0 = time.perf_counter()
    try:
        results = turns.claiming(store.claim_all, reqs)  # (its turn bounded: gevent)
    except StoreUnavailable as exc:
        for req in reqs:
            events.store_error(req, "claim", exc)
        raise
    seconds = (time.perf_counter() - t0) / max(len(reqs), 1)
    for req, res in zip(reqs, results, strict=True) if report else ():
        events.decided(req, res, seconds)
    return results


def answer(
    req: ClaimRequest,
    res: ClaimResult,
    delivery: str = "",
    accept: Collection[str] = memo.DEFAULT_ACCEPT,
) -> Any:
    """The value (or error) a non-owning delivery returns: the memo, decoded only with a
    serializer in ``accept``. An error raised here carries ``grousset_replayed`` (the
    fingerprint): error tools can tell a duplicate's replay from a new failure."""
    if res.kind in (Kind.COMPLETED, Kind.FAILED):  # (a replayed failure: a duplicate too)
        events.duplicate(req, res, delivery)
    try:
        return memo.decode(
            res.result, res.result_encoding, res.error, req.fingerprint, accept=accept
        )
    except Exception as exc:
        exc.grousset_replayed = req.fingerprint  # type: ignore[attr-defined]
        raise


def accept_of(caller: Caller, call: Call) -> Collection[str]:
    """What the caller decodes memos with: its ``accept`` (a task: its app's
    accept_content), else only the call's own serializer (``protect()``)."""
    accept = getattr(caller, "accept", None)
    return (call.serializer,) if accept is None else accept


def poisoned(caller: Caller, req: ClaimRequest, exc: PoisonDelivery) -> NoReturn:
    """A call the journal can never record: say so once, loudly; then the caller's
    ``poison(exc)`` hook (a task rejects the delivery without requeue), else raise."""
    def shown(value: str) -> str:  # bounded, no NUL (the log line quotes what it must)
        return memo.clean_text(value, 100)

    safe = dataclasses.replace(req, task_id=shown(req.task_id),
                               task_name=shown(req.task_name),
                               processor_id=shown(req.processor_id))  # fmt: skip
    events.poison_delivery(safe, str(exc))
    hook = getattr(caller, "poison", None)
    if callable(hook):
        hook(exc)
    raise exc
