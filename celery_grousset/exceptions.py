"""Exceptions raised by celery-grousset (public API: ``celery_grousset.exceptions``).

Every exception is a :class:`GroussetError`, so ``except GroussetError`` catches
anything this package raises on purpose. A configuration error is also Django's
``ImproperlyConfigured``; a bad argument is also a ``ValueError`` / ``TypeError``.
"""

from __future__ import annotations

from celery.exceptions import Reject
from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "ArgumentsMismatch",
    "ClaimInFlight",
    "ConfigurationError",
    "FencedOut",
    "FingerprintError",
    "GaveUp",
    "GroussetError",
    "InvalidArgument",
    "MemoNotAccepted",
    "MemoizedFailure",
    "NotAwaited",
    "PayloadMismatch",
    "PoisonDelivery",
    "PoisonRejected",
    "ResultNotStored",
    "StoreUnavailable",
    "TransactionLost",
]


class GroussetError(Exception):
    """Base class of every error celery-grousset raises on purpose."""


class ClaimInFlight(GroussetError):
    """Another attempt holds a fresh claim on this fingerprint.

    ``retry_in`` is the number of seconds (database clock) until that claim turns
    stale and may be taken over.
    """

    def __init__(self, message: str, *, fingerprint: str = "", retry_in: float = 0.0) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint
        self.retry_in = retry_in

    @classmethod
    def requeued(
        cls, task: str, fingerprint: str, retry_in: float, countdown: float
    ) -> ClaimInFlight:
        """Why a task's delivery is re-queued (the ``exc`` of its Celery retry: its log
        line, ``on_retry`` and ``task_retry``): the call is in flight elsewhere."""
        return cls(
            f"{task}: another attempt holds the claim (fingerprint {fingerprint[:16]}…); "
            f"this delivery is re-queued in {countdown:.2f} s",
            fingerprint=fingerprint, retry_in=retry_in,
        )  # fmt: skip


class StoreUnavailable(GroussetError):
    """The outcome journal could not be reached or did not answer in time.

    The guard fails closed: the effect did not run. Retry the delivery later.
    """


class TransactionLost(StoreUnavailable):
    """A transactional attempt's connection to the journal database was lost before its
    commit was confirmed: its effect was rolled back with its completion (or, if the
    commit reached the server, both stand). A task's delivery is requeued and the next
    one finds out which, running the effect once or answering from the memo. Raised too
    when the database rolled the transaction back for a conflict with another one (a
    serialization failure, a deadlock): the claim is released, and the next delivery
    runs the effect.

    ``dropped``: the connection broke and the transaction did not commit (the claim was
    released). A delivery whose transaction is dropped ``carry.MAX_DROPPED`` times in a
    row fails with it instead of being sent again (a server or proxy idle timeout
    shorter than the body ends every attempt the same way)."""

    def __init__(self, message: str, *, dropped: bool = False) -> None:
        super().__init__(message)
        self.dropped = dropped


class FencedOut(GroussetError):
    """This attempt lost its claim (it was taken over); its completion was refused."""


class NotAwaited(GroussetError, TypeError):
    """A guarded body is an ``async def`` function (refused before it claims; check
    ``E019``), or returned an awaitable it did not await: the guard runs bodies
    synchronously, so what that awaitable was to do never happened. The latter is the
    attempt's failure (its claim released, or memoized under ``on_failure="memoize"``:
    the body may have done part of its work before it returned)."""


class FingerprintError(GroussetError, ValueError):
    """An argument cannot be encoded deterministically into a fingerprint."""


class ArgumentsMismatch(FingerprintError, TypeError):
    """A call's arguments do not fit its task's (or function's) parameters: a ``TypeError``
    too, as Celery's own ``delay()`` check raises."""


class ResultNotStored(GroussetError):
    """The effect completed, but its return value could not be memoized.

    The effect is never run again because of this; duplicates raise this error.
    """


class GaveUp(GroussetError):
    """The claim was taken over ``max_takeovers`` times; the record was marked failed.

    This usually means the task kills its worker (memory limit, segfault). The
    message is not requeued again; release the record to allow another attempt.
    """


class ConfigurationError(GroussetError, ImproperlyConfigured):
    """The package is configured in a way it cannot work with (a missing
    ``max_processing_time``, a journal database it has no store for, an unknown alias).
    The message names what to set and where."""


class InvalidArgument(GroussetError, ValueError, TypeError):
    """An argument of a package function is out of range or of the wrong type."""


class MemoNotAccepted(GroussetError):
    """A memo's content type is not one this caller accepts; it was not decoded.

    A task decodes memos only with its Celery app's ``result_accept_content`` (or
    ``accept_content``), ``protect()`` only with its own ``serializer`` (JSON by default):
    a pickled memo is never unpickled where pickle is not accepted. The effect is not run
    again because of this; duplicates raise this error until the record expires or is
    forgotten.
    """

    def __init__(self, message: str, *, content_type: str = "") -> None:
        super().__init__(message)
        self.content_type = content_type


class MemoizedFailure(GroussetError):
    """A memoized failure whose exception class is not rebuilt from the journal.

    Only builtin exceptions and this package's own are re-created for duplicates; no
    module is ever imported by a name read from a journal row. ``exc_type`` is the stored
    ``module.QualName`` of the original exception, ``exc_message`` its (redacted) text.
    """

    def __init__(self, message: str, *, exc_type: str = "", exc_message: str = "") -> None:
        super().__init__(message)
        self.exc_type = exc_type
        self.exc_message = exc_message


class PoisonDelivery(GroussetError):
    """A call the journal can never record: its task id, task name or processor id is too
    long or holds a NUL, or the database refused its data (a data error).

    Permanent, never "store unavailable": retrying cannot help. A task rejects the
    delivery without requeue (:class:`PoisonRejected`: the broker drops it or
    dead-letters it, and the caller's ``result.get()`` raises it); ``protect()``,
    eager and direct calls raise it. The effect did not run.
    """


class PoisonRejected(Reject, PoisonDelivery):
    """What a worker raises for a :class:`PoisonDelivery`: Celery's ``Reject`` without
    requeue (the broker drops or dead-letters the message) that is also the
    ``PoisonDelivery``, so the caller's ``result.get()`` raises one, with its reason."""

    def __init__(self, message: str, requeue: bool = False) -> None:
        super().__init__(message, requeue=False)
        self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])

    __repr__ = Exception.__repr__


class PayloadMismatch(GroussetError):
    """A key (``idempotency_key`` or ``grousset_key``) came with other arguments than the
    call that holds its record: the record's answer belongs to that other call, so it is
    not returned, and this call did not run.

    ``fingerprint`` is the key's fingerprint; ``stored_hash`` and ``given_hash`` the
    payload hashes (BLAKE3 of all the bound arguments) of the record and of this call.
    Give each operation its own key, or turn ``validate_payload`` off for a task whose key
    is meant to cover varying arguments (docs/configuration.md).
    """

    def __init__(
        self,
        message: str,
        *,
        fingerprint: str = "",
        stored_hash: str = "",
        given_hash: str = "",
    ) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint
        self.stored_hash = stored_hash
        self.given_hash = given_hash
