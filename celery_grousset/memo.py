"""Memo codec: a return value in and out of ``Outcome.result``.

Values are encoded with the task's Celery serializer through kombu, so a memo is
exactly what the result backend would have stored; ``result_encoding`` keeps the
content type and encoding. A value that cannot be stored (not serializable,
larger than ``max_result_bytes``) is never a reason to re-run the effect: the
record completes with the marker :data:`ENC_NOT_STORED` and duplicates raise
:class:`~celery_grousset.exceptions.ResultNotStored`.

A memo is decoded only with a serializer the caller accepts (:func:`decode`'s
``accept``), never by the content type the row names alone: a row is data, and a
pickled memo planted in the journal must not run code. A memoized failure is
re-created only as a builtin exception or one of this package's own; no module is
imported by a name read from a row. Every error text stored is redacted.
"""

from __future__ import annotations

import builtins
import contextlib
import json
from collections.abc import Callable, Collection, Mapping
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from kombu.serialization import dumps, loads

from celery_grousset import exceptions
from celery_grousset.claim import (
    ENC_EXCEPTION,
    ENC_GAVE_UP,
    ENC_NONE,
    ENC_NOT_MEMOIZED,
    ENC_NOT_STORED,
)
from celery_grousset.exceptions import (
    GaveUp,
    GroussetError,
    MemoizedFailure,
    MemoNotAccepted,
    ResultNotStored,
)
from celery_grousset.quoted import call_secrets, without_values
from celery_grousset.redact import DEFAULT_REDACT_KEYS, redact_text
from celery_grousset.textcut import encodable

ERROR_MAX = 2000
#: the longest ``result_encoding`` the journal column holds
ENCODING_MAX = 64
#: text longer than this is cut before it is redacted (redaction is linear, but bounded)
_REDACT_MAX = 64 * 1024
#: what ``protect()`` and memo readers that name nothing accept
DEFAULT_ACCEPT = ("json",)


def clean_text(text: str, limit: int = ERROR_MAX) -> str:
    """Text safe for every backend: no NUL, no lone surrogate, at most ``limit`` characters."""
    text = encodable(text.replace("\x00", "\\x00"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: the running attempt's secret argument values, as a function (called only when an
#: error text is recorded): set by the guard around the effect
SECRETS: ContextVar[Callable[[], Collection[str]] | None] = ContextVar("grousset_secrets",
                                                                      default=None)  # fmt: skip


def _without_secrets(text: str) -> str:
    """``text`` with the running attempt's secret argument values masked."""
    secrets = SECRETS.get()
    try:
        return text if secrets is None else without_values(text, secrets())
    except Exception:  # arguments that cannot be read again: the patterns still apply
        return text


def redacted_text(text: str, limit: int = ERROR_MAX) -> str:
    """:func:`clean_text` of ``text`` with secret values (passwords in DSNs, bearer tokens,
    ``password=…``) removed by :func:`celery_grousset.redact.redact_text`, with the
    ``GROUSSET["REDACT_KEYS"]`` too, and the running attempt's secret argument values
    (:data:`SECRETS`). Never raises."""
    return clean_text(_without_secrets(redact_text(text[:_REDACT_MAX], _keys())), limit)


def _keys() -> Collection[str]:
    """The names whose values are redacted: ``GROUSSET["REDACT_KEYS"]`` with the
    defaults (the defaults alone when the settings cannot be read)."""
    try:
        from celery_grousset.conf import redact_keys

        return redact_keys()
    except Exception:
        return DEFAULT_REDACT_KEYS


def masked_summary(exc: BaseException, bound: Mapping[str, object]) -> str:
    """:func:`error_summary` of an exception raised outside an attempt's masking scope
    (by a ``grousset_key`` function, with the call's arguments): the values of the
    call's sensitive arguments (``bound``) are masked in it too."""
    keys = _keys()
    scope = SECRETS.set(lambda: call_secrets({}, bound, keys))
    try:
        return error_summary(exc)
    finally:
        SECRETS.reset(scope)


def error_summary(exc: BaseException | None, limit: int = ERROR_MAX) -> str:
    """``Type: message`` of an exception, redacted; never raises (a ``__str__`` may).
    The message is redacted on its own: after ``Type: ``, a ``password = …`` would be
    read as the value of a pair named by the type."""
    if exc is None:
        return "an exception that could not be recorded"
    try:
        message = str(exc)
    except Exception:
        message = "<str() of the exception raised>"
    inner = exc.__cause__ or exc.__context__
    if not message.strip() and inner is not None and inner is not exc:  # (kombu wraps a
        # broker's refusal in an OperationalError of its empty text)
        message = f"(raised from {error_summary(inner, limit)})"
    return clean_text(f"{type(exc).__name__}: {redacted_text(message, _REDACT_MAX)}", limit)


def _not_stored(why: str) -> tuple[None, str, str]:
    return None, ENC_NOT_STORED, redacted_text(f"result not stored: {why}")


def encode(
    value: Any, *, serializer: str, memoize: bool, max_bytes: int
) -> tuple[bytes | None, str, str]:
    """Return ``(result, result_encoding, error)`` for a completed attempt."""
    if not memoize:
        return None, ENC_NOT_MEMOIZED, ""
    try:
        content_type, content_encoding, data = _dumps(value, serializer)
    except Exception as exc:
        return _not_stored(f"{serializer} cannot encode {type(value).__name__}: {exc}; "
                           "return a value the result serializer encodes")  # fmt: skip
    raw = data.encode(content_encoding or "utf-8") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        return _not_stored(f"{len(raw)} bytes encoded is over max_result_bytes={max_bytes}; "
                           "raise the task's max_result_bytes or return less")  # fmt: skip
    if b'"__type__"' in raw and content_type == "application/json" and _marked(value, 0):
        return _not_stored(_MARKED)
    encoding = f"{content_type};{content_encoding}"
    if len(encoding) > ENCODING_MAX:
        return _not_stored(f"its content type is too long to record ({encoding[:80]!r})")
    return raw, encoding, ""


def _dumps(value: Any, serializer: str) -> tuple[str, str, Any]:
    """kombu's ``dumps``, once more should the soft time limit fire while it encodes (it
    fires once; kombu wraps it in an EncodeError): the value is not to blame."""
    try:
        return dumps(value, serializer=serializer)
    except Exception as exc:
        if not any(isinstance(e, SoftTimeLimitExceeded) for e in (exc, exc.__context__, *exc.args)):
            raise
    return dumps(value, serializer=serializer)


_MARKED = ('a dict with exactly the keys "__type__" and "__value__" reads back as kombu\'s '
           "encoding of another value; return another shape")


def _marked(value: Any, depth: int) -> bool:
    """``value`` holds a dict shaped like kombu's marker (:func:`fingerprint.kombu_marker`)."""
    from celery_grousset.fingerprint import kombu_marker

    if isinstance(value, dict):
        items: Any = value.values()
        if kombu_marker(value):
            return True
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return False
    return depth < 100 and any(_marked(item, depth + 1) for item in items)


def encode_exception(exc: BaseException) -> tuple[bytes, str, str]:
    """The memo of a failure replayed to duplicates (``on_failure="memoize"``)."""
    cls, args = type(exc), exc.args
    # a builtin's one message as given: str(KeyError("k")) is "'k'", rebuilt it would be
    # quoted twice
    one = cls.__module__ == "builtins" and len(args) == 1 and isinstance(args[0], str)
    payload: dict[str, Any] = {
        "exc_type": cls.__qualname__,
        "exc_module": cls.__module__,
        "exc_message": redacted_text(args[0] if one else _text_of(exc)),
    }
    made = _made_with(exc)  # stored when nothing of its text is secret, whole or split
    builtin = cls.__module__ == "builtins" and not one and made and all(map(_scalar, made))
    if builtin and _unredacted(exc):
        payload["exc_args"] = [_arg(a) for a in made]  # KeyError(5), OSError(2, "…", "/x")
    return json.dumps(payload).encode(), ENC_EXCEPTION, error_summary(exc)


def _text_of(exc: BaseException) -> str:
    """``str(exc)``, or what says it could not be had: a ``__str__`` that raises still
    leaves a failure to memoize (it was released instead: the effect ran again)."""
    try:
        return str(exc)
    except Exception as broken:
        return f"<str() of the {type(exc).__name__} raised {type(broken).__name__}>"


def _made_with(exc: BaseException) -> tuple[Any, ...]:
    """The arguments that re-create ``exc``: its ``args``, and an OSError's file names
    (not in its ``args``: ``OSError(errno, strerror, filename, winerror, filename2)``)."""
    if isinstance(exc, OSError) and len(exc.args) == 2 and exc.filename is not None:
        return (*exc.args, exc.filename, None, exc.filename2)
    return exc.args


def _unredacted(exc: BaseException) -> bool:
    """Whether nothing of ``exc``'s text is redacted (no secret in it, whole or split)."""
    try:
        text = str(exc)
    except Exception:
        return False
    return redacted_text(text, len(text) + 1) == clean_text(text, len(text) + 1)


def _scalar(value: object) -> bool:
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")  # (JSON has no NaN, inf)
    return value is None or isinstance(value, (bool, int, str))


def _arg(value: object) -> object:
    """One argument of a builtin exception as stored: redacted as its message is (a
    number whose text a redaction changes, a secret argument's value, is stored as
    that redacted text)."""
    text = value if isinstance(value, str) else str(value)
    shown = redacted_text(text)
    return value if shown == text and not isinstance(value, str) else shown


@lru_cache(maxsize=64)
def _content_types(accept: frozenset[str]) -> frozenset[str]:
    from kombu.serialization import prepare_accept_content

    types: set[str] = set()
    for item in accept:  # a serializer not installed here has nothing to decode with
        with contextlib.suppress(Exception):
            types |= prepare_accept_content([item]) or set()
    return frozenset(types)


PICKLE_TYPE = "application/x-python-serialize"


def app_accept(app: Any) -> Collection[str]:
    """What a Celery app's tasks decode memos with: what it accepts for stored results,
    as its result backend decides (``result_accept_content``, else ``accept_content``;
    Celery's default: JSON only) — but a pickle only when its ``result_serializer``, the
    one that writes its memos, is pickle: an app accepting pickle for its messages alone
    never unpickles a row someone who can only write the journal planted."""
    conf = app.conf
    accept = accepted(conf.result_accept_content or conf.accept_content or DEFAULT_ACCEPT)
    if PICKLE_TYPE in accept and (conf.result_serializer or "json") != "pickle":
        return accept - {PICKLE_TYPE}
    return accept


def accepted(accept: Collection[str]) -> frozenset[str]:
    """The content types of ``accept``: serializer names (``"json"``) or content types
    (``"application/json"``), as Celery's ``accept_content`` takes them."""
    return _content_types(frozenset(str(a) for a in accept))


def decode(
    result: bytes | None,
    encoding: str,
    error: str,
    fingerprint: str,
    *,
    accept: Collection[str] = DEFAULT_ACCEPT,
) -> Any:
    """The memoized value, or raise what the record says duplicates must see.

    Only content types in ``accept`` are decoded (a task passes its app's
    ``accept_content``); any other raises :class:`MemoNotAccepted`, undecoded."""
    if encoding == ENC_NOT_MEMOIZED:
        return None
    if encoding == ENC_NOT_STORED:
        raise ResultNotStored(
            f"the effect of {fingerprint[:16]}… completed but its result was not stored "
            f"({error}); it will not run again (to run it again: `manage.py "
            f"grousset_release {fingerprint} --force`, then publish the call)."
        )
    if encoding == ENC_GAVE_UP:  # its release command, with this record's fingerprint
        raise GaveUp(error.removeprefix("GaveUp: ").replace("<fingerprint>", fingerprint))
    if encoding == ENC_EXCEPTION:
        raise rebuild_exception(result, error)
    if encoding == ENC_NONE or result is None:
        raise ResultNotStored(f"no memo stored for {fingerprint[:16]}…")
    content_type, _, content_encoding = encoding.partition(";")
    allowed = accepted(accept)
    if content_type not in allowed:
        raise MemoNotAccepted(
            f"the memo of {fingerprint[:16]}… is {content_type!r} ({len(result)} bytes), which "
            f"this caller does not accept ({', '.join(sorted(allowed)) or 'nothing'}): it was "
            "not decoded, and the effect will not run again. A task accepts its Celery app's "
            "result_accept_content (else accept_content), a pickle only if its "
            "result_serializer is pickle; protect() its own serializer.",
            content_type=content_type,
        )
    return loads(result, content_type, content_encoding or "utf-8", accept=allowed)


def rebuild_exception(result: bytes | None, error: str) -> BaseException:
    """The exception a memoized failure replays: a builtin exception or one of this
    package's own, re-created from its stored message; anything else is a
    :class:`MemoizedFailure` naming the stored type. Never imports a module."""
    try:
        payload = json.loads(result or b"{}")
        module, qualname = str(payload["exc_module"]), str(payload["exc_type"])
        message, args = str(payload.get("exc_message", "")), payload.get("exc_args")
    except Exception:
        return MemoizedFailure(f"memoized failure: {error}")
    cls = _known_exception(module, qualname)
    if cls is not None:
        try:
            if isinstance(args, list):  # a builtin's arguments, as raised (redacted)
                return cls(*args)
            return cls(message) if message else cls()
        except Exception:  # a constructor that needs more than a message
            pass
    name = qualname if module == "builtins" else f"{module}.{qualname}"
    return MemoizedFailure(
        f"memoized failure: {name}: {message}", exc_type=name, exc_message=message
    )


def _known_exception(module: str, qualname: str) -> type[Exception] | None:
    """The class of a stored exception, looked up by name only among the builtins and
    :mod:`celery_grousset.exceptions` (a plain dict lookup: no import, no attribute walk)."""
    if module == "builtins":
        namespace, base = vars(builtins), Exception
    elif module == exceptions.__name__:
        namespace, base = vars(exceptions), GroussetError
    else:
        return None
    cls = namespace.get(qualname)
    return cls if isinstance(cls, type) and issubclass(cls, base) else None


def control_flow(exc: BaseException) -> bool:
    """Celery's Retry / Ignore / Reject and non-Exception exits never memoize."""
    return not isinstance(exc, Exception) or celery_exit(exc) is not None


def never_memoized(exc: BaseException) -> bool:
    """``exc`` is no failure of the call's own to replay, even with ``on_failure=
    "memoize"``: Celery's control flow (:func:`control_flow`), or the journal's trouble
    that a nested guarded call raised in the body (an outage, a key in flight, a lost
    transaction): replayed for the retention window, the call would never run once the
    trouble passed. (A body returning an awaitable it did not await is memoized as asked:
    code before its return ran.)"""
    return control_flow(exc) or isinstance(exc, _NOT_THE_CALLS)


_NOT_THE_CALLS = (exceptions.StoreUnavailable, exceptions.ClaimInFlight)


def celery_exit(exc: BaseException) -> str | None:
    """The completion outcome of Celery's control-flow exit ``exc``: ``retried``
    (``self.retry()``, ``autoretry_for``), ``ignored`` (``Ignore``: ``self.replace()``, a
    task that drops its delivery), ``rejected`` (``Reject``, requeued or not); None for
    any other exception."""
    from celery.exceptions import Ignore, Reject, Retry

    for kind, outcome in ((Retry, "retried"), (Ignore, "ignored"), (Reject, "rejected")):
        if isinstance(exc, kind):
            return outcome
    return None
