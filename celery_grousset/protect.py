"""``protect(key, fn)``: run ``fn`` once per key and processor, from any code path.

The guarded flow (docs/how-it-works.md) on any code path: the first caller
claims the key and runs ``fn``; later callers get its memoized return value;
a caller that finds a fresh claim waits for it (``on_in_flight="wait"``) or
raises :class:`~celery_grousset.exceptions.ClaimInFlight` (``"raise"``); a claim
older than ``max_processing_time`` is taken over.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

from celery_grousset import guard
from celery_grousset.binding import off_the_loop, signature_of, synchronous
from celery_grousset.claim import PROTECT_NAME, ClaimRequest
from celery_grousset.conf import grousset_settings, redact_keys
from celery_grousset.exceptions import (
    ClaimInFlight,
    FingerprintError,
    InvalidArgument,
    StoreUnavailable,
)
from celery_grousset.options import Options
from celery_grousset.shown import shown_text
from celery_grousset.store import ClaimResult

T = TypeVar("T")



class _ProtectCaller:
    """protect()'s hooks: wait for a fresh claim or raise ClaimInFlight; a store outage
    raises StoreUnavailable to the caller."""

    __slots__ = ("body", "key", "on_in_flight", "opts")
    local = True  # runs in the caller's process (its transaction: guard.guarded)

    def __init__(self, opts: Options, key: str, on_in_flight: str, body: Callable[[], Any]):
        self.opts, self.key, self.on_in_flight, self.body = opts, key, on_in_flight, body

    def options(self) -> Options:
        return self.opts

    def in_flight_policy(self, opts: Options) -> str:
        return self.on_in_flight

    def defer(self, req: ClaimRequest, res: ClaimResult) -> NoReturn:
        raise ClaimInFlight(
            f"protect({req.args_repr or '…'}): another caller holds a fresh claim; it turns "
            f"stale in {res.retry_in:.1f} s",  # the key as stored: redacted
            fingerprint=req.fingerprint,
            retry_in=res.retry_in,
        )

    def store_unavailable(self, exc: StoreUnavailable) -> NoReturn:
        raise exc

    def run(self, attempt: guard.Attempt) -> Any:
        return self.body()


def _check(
    key: object, fn: object, on_in_flight: str, serializer: object, kwargs: dict[str, Any]
) -> None:
    off_the_loop("protect()", "`await sync_to_async(protect)(key, fn, ...)`")
    if not callable(fn):
        raise InvalidArgument(f"protect(key, fn, ...) needs a callable fn, got {fn!r:.80}")
    synchronous(fn, f"protect()'s function {getattr(fn, '__qualname__', fn)!r}")
    if not isinstance(key, str) or not key:
        raise FingerprintError(
            f"protect() needs a non-empty str key, got {key!r}: build one from what "
            "identifies the operation, e.g. f'import:{day}'."
        )
    if on_in_flight not in ("wait", "raise"):
        raise InvalidArgument(
            f"protect(on_in_flight=…) must be 'wait' or 'raise', got {on_in_flight!r}"
        )
    if not _encodes(serializer):
        from kombu.serialization import registry  # type: ignore[attr-defined]  # (no stubs)

        raise InvalidArgument(  # its memo could not be stored, or never read back
            f"protect(serializer=…) must name a serializer kombu can encode with here ("
            f"{', '.join(n for n in sorted(registry.name_to_type) if _encodes(n))}), got "
            f"{serializer!r}"
        )
    if kwargs:
        _misspelt(fn, kwargs)


#: serializers seen to encode in this process (tried once each, not on every call)
_ENCODING: set[str] = set()


def _encodes(serializer: object) -> bool:
    """Whether kombu encodes with ``serializer`` in this process (it lists msgpack and
    yaml whether or not their libraries are installed)."""
    from kombu.serialization import dumps

    if not isinstance(serializer, str):
        return False
    if serializer not in _ENCODING:
        try:
            dumps(None, serializer=serializer)
        except Exception:
            return False
        _ENCODING.add(serializer)
    return True


@functools.cache
def _options() -> tuple[str, ...]:
    """protect()'s own keyword options, from its signature (read once)."""
    return tuple(p.name for p in inspect.signature(protect).parameters.values()
                     if p.kind is inspect.Parameter.KEYWORD_ONLY)  # fmt: skip


def _misspelt(fn: object, kwargs: dict[str, Any]) -> None:
    """Refuse a keyword for ``fn`` that reads like one of protect()'s options and that
    ``fn`` does not name: passed on to ``fn`` (its ``**kwargs``), the option was lost."""
    from celery_grousset.options import reads_like

    sig = signature_of(fn)
    named = set(sig.parameters) if sig is not None else set()
    for name in kwargs:
        if name not in named and (meant := reads_like(name, _options())):
            raise InvalidArgument(
                f"protect(…, {name}=…) reads like protect()'s option {meant!r}, but it would "
                f"be passed to {getattr(fn, '__qualname__', fn)!r} as an argument (which "
                f"does not name it): write {meant}=…"
            )


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
    validate_payload: bool | None = None,
    **kwargs: Any,
) -> T:
    """Run ``fn(*args, **kwargs)`` at most once for ``key``; return its (memoized) value.

    ``processor_id`` defaults to ``GROUSSET["PROCESSOR_ID"]`` or ``"default"``.
    ``max_processing_time`` is required (here or in ``GROUSSET``).
    ``args``/``kwargs`` given to ``fn`` through ``protect()`` are hashed beside the key:
    a later call of the same key with other arguments raises
    :class:`~celery_grousset.exceptions.PayloadMismatch` (``validate_payload=False``
    turns that off). A closure's captured values are not seen: pass the arguments.
    It blocks: from async code, ``await sync_to_async(protect)(key, fn, ...)`` (asgiref);
    in an event loop's thread it raises Django's ``SynchronousOnlyOperation``.
    """
    _check(key, fn, on_in_flight, serializer, kwargs)
    opts = Options.resolve(
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
            "validate_payload": validate_payload,
        },
        default_processor="default",
    )
    call = guard.Call(
        name=PROTECT_NAME,
        task_id="",
        idempotency_key=key,
        args=args,
        kwargs=kwargs,
        serializer=serializer,
        names=signature_of(fn) if args else None,  # a positional secret, known by name
        args_repr=shown_text(  # a key may quote a token: redacted as arguments are
            "key=", repr(key), redact_keys(), int(grousset_settings.ARGS_REPR_MAX_LENGTH)
        ),
    )
    caller = _ProtectCaller(opts, key, on_in_flight, lambda: fn(*args, **kwargs))
    return guard.guarded(caller, call)  # type: ignore[no-any-return]
