"""Memo codec: a return value in and out of ``Outcome.result``.

Values are encoded with the task's Celery serializer through kombu, so a memo is
exactly what the result backend would have stored; ``result_encoding`` keeps the
content type and encoding. A value that cannot be stored (not serializable,
larger than ``max_result_bytes``) is never a reason to re-run the effect: the
record completes with the marker :data:`ENC_NOT_STORED` and duplicates raise
:class:`~celery_grousset.exceptions.ResultNotStored`.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from kombu.serialization import dumps, loads

from celery_grousset.claim import (
    ENC_EXCEPTION,
    ENC_GAVE_UP,
    ENC_NONE,
    ENC_NOT_MEMOIZED,
    ENC_NOT_STORED,
)
from celery_grousset.exceptions import GaveUp, GroussetError, ResultNotStored

ERROR_MAX = 2000


def clean_text(text: str, limit: int = ERROR_MAX) -> str:
    """Text safe for every backend: no NUL, no lone surrogate, at most ``limit`` characters."""
    text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot be stored as UTF-8
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_summary(exc: BaseException | None) -> str:
    """``Type: message`` of an exception; never raises (a ``__str__`` may)."""
    if exc is None:
        return "an exception that could not be recorded"
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:
        text = f"{type(exc).__name__}: <str() of the exception raised>"
    return clean_text(text)


def encode(
    value: Any, *, serializer: str, memoize: bool, max_bytes: int
) -> tuple[bytes | None, str, str]:
    """Return ``(result, result_encoding, error)`` for a completed attempt."""
    if not memoize:
        return None, ENC_NOT_MEMOIZED, ""
    try:
        content_type, content_encoding, data = dumps(value, serializer=serializer)
    except Exception as exc:
        return (
            None,
            ENC_NOT_STORED,
            clean_text(
                f"result not stored: {serializer} cannot encode {type(value).__name__}: {exc}"
            ),
        )
    raw = data.encode(content_encoding or "utf-8") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        return (
            None,
            ENC_NOT_STORED,
            (f"result not stored: {len(raw)} bytes encoded is over max_result_bytes={max_bytes}"),
        )
    return raw, f"{content_type};{content_encoding}", ""


def encode_exception(exc: BaseException) -> tuple[bytes, str, str]:
    """The memo of a failure replayed to duplicates (``on_failure="memoize"``)."""
    cls = type(exc)
    payload = {
        "exc_type": cls.__qualname__,
        "exc_module": cls.__module__,
        "exc_message": clean_text(str(exc)),
    }
    return json.dumps(payload).encode(), ENC_EXCEPTION, error_summary(exc)


def decode(result: bytes | None, encoding: str, error: str, fingerprint: str) -> Any:
    """The memoized value, or raise what the record says duplicates must see."""
    if encoding == ENC_NOT_MEMOIZED:
        return None
    if encoding == ENC_NOT_STORED:
        raise ResultNotStored(
            f"the effect of {fingerprint[:16]}… completed but its result was not stored "
            f"({error}); it will not run again."
        )
    if encoding == ENC_GAVE_UP:
        raise GaveUp(error)
    if encoding == ENC_EXCEPTION:
        raise rebuild_exception(result, error)
    if encoding == ENC_NONE or result is None:
        raise ResultNotStored(f"no memo stored for {fingerprint[:16]}…")
    content_type, _, content_encoding = encoding.partition(";")
    return loads(result, content_type, content_encoding or "utf-8", accept={content_type})


def rebuild_exception(result: bytes | None, error: str) -> BaseException:
    """Re-create a memoized exception when its class is importable, else GroussetError."""
    try:
        payload = json.loads(result or b"{}")
        module = importlib.import_module(payload["exc_module"])
        cls: Any = module
        for part in payload["exc_type"].split("."):
            cls = getattr(cls, part)
        if isinstance(cls, type) and issubclass(cls, Exception):
            return cls(payload["exc_message"])  # type: ignore[no-any-return,unused-ignore]
    except Exception:
        pass
    return GroussetError(f"memoized failure: {error}")
