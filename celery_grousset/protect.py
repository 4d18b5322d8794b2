"""``protect(key, fn)``: run ``fn`` once per key and processor, from any code path.

The mnemosyne primitive (seeds/003) on the outcome journal: the first caller
claims the key and runs ``fn``; later callers get its memoized return value;
a caller that finds a fresh claim waits for it (``on_in_flight="wait"``) or
raises :class:`~celery_grousset.exceptions.ClaimInFlight` (``"raise"``); a claim
older than ``max_processing_time`` is taken over.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from celery_grousset import guard
from celery_grousset.claim import Kind
from celery_grousset.exceptions import ClaimInFlight, FingerprintError
from celery_grousset.fingerprint import fingerprint
from celery_grousset.store.base import get_store

T = TypeVar("T")

#: the ``task_name`` of protect() records and the namespace of their fingerprints
PROTECT_NAME = "protect"


def protect(
    key: str,
    fn: Callable[..., T],
    *args: Any,
    processor_id: str | None = None,
    max_processing_time: float | timedelta | None = None,
    expires_after: float | timedelta | None = None,
    on_in_flight: str = "wait",
    transactional: bool | None = None,
    memoize: bool | None = None,
    on_failure: str | None = None,
    max_result_bytes: int | None = None,
    max_takeovers: int | None = None,
    database: str | None = None,
    serializer: str = "json",
    **kwargs: Any,
) -> T:
    """Run ``fn(*args, **kwargs)`` at most once for ``key``; return its (memoized) value.

    ``processor_id`` defaults to ``GROUSSET["PROCESSOR_ID"]`` or ``"default"``.
    ``max_processing_time`` is required (here or in ``GROUSSET``).
    """
    if not isinstance(key, str) or not key:
        raise FingerprintError(
            f"protect() needs a non-empty str key, got {key!r}: build one from what "
            "identifies the operation, e.g. f'import:{day}'."
        )
    if on_in_flight not in ("wait", "raise"):
        raise ValueError(f"protect(on_in_flight=…) must be 'wait' or 'raise', got {on_in_flight!r}")
    opts = guard.Options.resolve(
        "protect()",
        {
            "processor_id": processor_id,
            "max_processing_time": max_processing_time,
            "expires_after": expires_after,
            "transactional": transactional,
            "memoize": memoize,
            "on_failure": on_failure,
            "max_result_bytes": max_result_bytes,
            "max_takeovers": max_takeovers,
            "database": database,
        },
        default_processor="default",
    )
    fp = fingerprint(PROTECT_NAME, idempotency_key=key)
    store = get_store(opts.database)
    req = guard.request(opts, fp, PROTECT_NAME, "", _args_repr(key))
    res = guard.claim(store, req)
    if res.kind is Kind.IN_FLIGHT:
        if on_in_flight == "raise":
            raise ClaimInFlight(
                f"protect({key!r}): another caller holds a fresh claim; it turns stale in "
                f"{res.retry_in:.1f} s",
                fingerprint=fp,
                retry_in=res.retry_in,
            )
        res = guard.wait_until_settled(store, req, res)
    if not res.owned:
        return guard.answer(req, res)  # type: ignore[no-any-return]
    return guard.run_owned(  # type: ignore[no-any-return]
        store, opts, req, res, lambda: fn(*args, **kwargs), serializer
    )


def _args_repr(key: str) -> str:
    from celery_grousset.memo import clean_text

    return clean_text(f"key={key!r}", 1024)
