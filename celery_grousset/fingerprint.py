"""Deterministic fingerprints of task invocations.

A fingerprint is the BLAKE3-256 hex digest of a canonical, versioned encoding of
what an effect is about: the task name (or ``protect()`` namespace), the causality
token, and the bound arguments, a ``key=`` selection of them, a ``key=`` callable's
return value, or an idempotency key. Values are canonicalised as they look after
the task serializer's JSON round trip (tuples are lists, int dict keys are str,
dict keys sorted, one representation per value); values JSON cannot carry
faithfully raise :class:`FingerprintError` naming the path, e.g. ``order["items"][2]``.
Any change to the encoding must bump :data:`FINGERPRINT_VERSION` (golden test vectors).

Encoding v1: a one-byte ASCII tag per value; ``LEN`` is a big-endian uint64::

    N | T | F              None | True | False (True is never 1)
    i int64                int in [-2**63, 2**63), big-endian two's complement
    I LEN bytes            other ints, minimal big-endian two's complement
    f float64              finite float, IEEE 754 big-endian; -0.0 written as 0.0
    s LEN utf-8            str (lone surrogates kept, "surrogatepass")
    b LEN bytes            bytes, bytearray, memoryview
    l LEN value*           list or tuple (LEN = item count)
    m LEN (LEN key value)* dict, keys as UTF-8 (int keys as decimal str), sorted by bytes
    Z | z int64            aware datetime: µs since 0001-01-01 UTC | naive: µs since 0001-01-01
    d int32                date: proleptic Gregorian ordinal
    t | u int64            naive time: µs since midnight | aware: µs since midnight UTC
    e sign LEN digits int  finite Decimal: sign byte, coefficient digits (one byte each,
                           trailing zeros moved into the i/I exponent); zero is e 00 LEN0 i0
    U 16 bytes             UUID

Values are self-delimiting, so the encoding is injective. A fingerprint hashes
``b"grousset-fp\\x00" VERSION(1 byte) name(s) causality(s|N)`` + ``K`` idempotency
key(s) | ``A`` bound arguments or their ``key=`` selection (m, by parameter name)
| ``C`` the ``key=`` callable's value; in BLAKE3's keyed mode when
``GROUSSET["FINGERPRINT_KEY"]`` is set (then a fingerprint of a low-entropy secret
argument, a PIN or a card number, cannot be confirmed by hashing guesses).
"""

from __future__ import annotations

import inspect
import json
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from operator import itemgetter
from typing import cast
from uuid import UUID

from blake3 import blake3

from .binding import bind_arguments as bind_arguments
from .binding import validate_key_names as validate_key_names
from .exceptions import FingerprintError

FINGERPRINT_VERSION: int = 1
"""Version of the canonical encoding; hashed into every fingerprint."""

_PREFIX, _MAX_DEPTH = b"grousset-fp\x00" + bytes([FINGERPRINT_VERSION]), 100
_TAG_LEN, _TAG_I64, _TAG_I32, _TAG_F64, _TAG_SIGN, _LEN = (
    struct.Struct(fmt).pack for fmt in (">BQ", ">Bq", ">Bi", ">Bd", ">BB", ">Q")
)
# One-byte tags, as ints for struct.pack (see the module docstring).
_INT, _BIGINT, _FLOAT, _STR, _BYTES, _LIST, _MAP = b"iIfsblm"
_AWARE_DT, _NAIVE_DT, _DATE, _NAIVE_TIME, _AWARE_TIME, _DECIMAL = b"Zzdtue"
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_FIX = "or choose what identifies the effect with grousset_key= or idempotency_key="
_SUPPORTED = "None, bool, int, float, str, bytes, list, dict, datetime, date, time, Decimal, UUID"
_DEPTH = "nested too deeply"
_first = itemgetter(0)


class _Fail(Exception):
    """Internal: an unencodable value; ``trail`` collects path segments while unwinding."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.trail: list[tuple[str, int]] = []  # (segment, id(container)), innermost first

    def error(self, root: str) -> FingerprintError:
        """Build the public error, naming the full argument path."""
        segments = [segment for segment, _ in reversed(self.trail)]
        idents = [ident for _, ident in reversed(self.trail)]
        path, detail = root + "".join(segments), self.detail
        if detail is _DEPTH:
            detail = f"containers are nested more than {_MAX_DEPTH} levels deep"
            for index, ident in enumerate(idents):
                if ident in idents[:index]:  # the first container that contains itself
                    path = root + "".join(segments[:index])
                    same = root + "".join(segments[: idents.index(ident)])
                    detail = f"it is the same container as {same} (self-referencing)"
                    break
        return FingerprintError(f"cannot fingerprint {path}: {detail}")


def _write_int(value: int, out: bytearray) -> None:
    if _I64_MIN <= value <= _I64_MAX:
        out += _TAG_I64(_INT, value)
    else:
        raw = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
        out += _TAG_LEN(_BIGINT, len(raw)) + raw


def _write_temporal(value: datetime | time, out: bytearray, naive: int, aware: int) -> None:
    """Write a datetime or time as microseconds, converted to UTC when aware."""
    micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 10**6 + value.microsecond
    if isinstance(value, datetime):
        micros += (value.toordinal() - 1) * 86_400 * 10**6
    try:
        offset = value.utcoffset()
    except Exception as exc:  # a broken tzinfo
        raise _Fail(f"its tzinfo failed to give a UTC offset ({exc!r})") from exc
    if offset is None:
        out += _TAG_I64(naive, micros)
    else:
        micros -= (offset.days * 86_400 + offset.seconds) * 10**6 + offset.microseconds
        out += _TAG_I64(aware, micros)


def kombu_marker(value: Mapping[object, object]) -> bool:
    """``value`` has the shape of kombu's JSON marker (``{"__type__": "bytes", "__value__":
    …}``): kombu's decoder turns it into another value, or fails on a type it does not
    know."""
    return len(value) == 2 and "__type__" in value and "__value__" in value


def _write_dict(value: Mapping[object, object], out: bytearray, depth: int) -> None:
    if kombu_marker(value):
        raise _Fail(
            'a dict with exactly the keys "__type__" and "__value__" is ambiguous with kombu\'s '
            f"JSON encoding of datetime, Decimal, UUID, bytes; pass the real object, {_FIX}"
        )
    entries: list[tuple[bytes, object, object]] = []
    kinds = 0  # bit 1: str keys seen, bit 2: int keys seen
    for key, item in value.items():
        if isinstance(key, str):
            entries.append((key.encode("utf-8", "surrogatepass"), key, item))
            kinds |= 1
        elif isinstance(key, int) and not isinstance(key, bool):
            try:
                entries.append((int.__repr__(key).encode("ascii"), key, item))
            except ValueError as exc:  # more digits than sys.get_int_max_str_digits()
                raise _Fail(f"an int dict key is too large to turn into a str ({exc})") from exc
            kinds |= 2
        else:
            problem = "mixed dict key types" if isinstance(key, bool) else "unsupported dict key"
            raise _Fail(f"{problem}: a {type(key).__qualname__} key; use str keys, {_FIX}")
    if kinds == 3:
        raise _Fail(f"mixed dict key types (str and int collide in JSON); use str keys, {_FIX}")
    entries.sort(key=_first)  # keys are unique, so values are never compared
    out += _TAG_LEN(_MAP, len(entries))
    key = None
    try:
        for raw, key, item in entries:  # noqa: B007 - `key` names the path on failure
            out += _LEN(len(raw)) + raw
            _encode(item, out, depth)
    except _Fail as fail:
        shown = json.dumps(key, ensure_ascii=False) if isinstance(key, str) else repr(key)
        fail.trail.append((f"[{shown}]", id(value)))
        raise


def _encode(value: object, out: bytearray, depth: int) -> None:
    """Append the canonical encoding of ``value`` to ``out`` (common types first)."""
    if isinstance(value, str):  # also StrEnum, SafeString...: JSON writes the str
        raw = value.encode("utf-8", "surrogatepass")
        out += _TAG_LEN(_STR, len(raw)) + raw
    elif value is None:
        out += b"N"
    elif value is True:
        out += b"T"
    elif value is False:
        out += b"F"
    elif isinstance(value, int):  # also IntEnum...: JSON writes the int
        if _I64_MIN <= value <= _I64_MAX:
            out += _TAG_I64(_INT, value)
        else:
            _write_int(value, out)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _Fail(f"the float {value!r} is not finite; replace it (e.g. with None), {_FIX}")
        out += _TAG_F64(_FLOAT, value + 0.0)  # -0.0 + 0.0 == 0.0
    elif isinstance(value, (list, tuple)):  # also namedtuple...: JSON writes a list
        if depth >= _MAX_DEPTH:
            raise _Fail(_DEPTH)
        out += _TAG_LEN(_LIST, len(value))
        index = 0
        try:
            for index, item in enumerate(value):  # noqa: B007 - `index` names the path
                _encode(item, out, depth + 1)
        except _Fail as fail:
            fail.trail.append((f"[{index}]", id(value)))
            raise
    elif isinstance(value, dict):
        if depth >= _MAX_DEPTH:
            raise _Fail(_DEPTH)
        _write_dict(value, out, depth + 1)
    else:
        _encode_other(value, out)


def _encode_other(value: object, out: bytearray) -> None:
    """Encode the less common types."""
    if isinstance(value, datetime):
        _write_temporal(value, out, _NAIVE_DT, _AWARE_DT)
    elif isinstance(value, date):
        out += _TAG_I32(_DATE, value.toordinal())
    elif isinstance(value, time):
        _write_temporal(value, out, _NAIVE_TIME, _AWARE_TIME)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise _Fail(f"Decimal({str(value)!r}) is not finite; pass a finite Decimal, {_FIX}")
        sign, digits, exponent = value.as_tuple()
        raw = bytes(digits)
        stripped = raw.rstrip(b"\x00")  # Decimal("1.0") == Decimal("1.00") == Decimal("1")
        if stripped:
            exponent = cast(int, exponent) + len(raw) - len(stripped)
        else:
            sign, exponent = 0, 0  # 0 == -0 == 0.00
        out += _TAG_SIGN(_DECIMAL, sign) + _LEN(len(stripped)) + stripped
        _write_int(exponent, out)
    elif isinstance(value, UUID):
        out += b"U" + value.bytes
    elif isinstance(value, (bytes, bytearray, memoryview)):
        try:
            raw = bytes(value)
        except Exception as exc:  # e.g. a released memoryview
            raise _Fail(f"its bytes could not be read ({exc!r})") from exc
        out += _TAG_LEN(_BYTES, len(raw)) + raw
    elif isinstance(value, (set, frozenset)):
        raise _Fail(f"a {type(value).__name__} has no order; pass a sorted list instead, {_FIX}")
    elif _lazy_text(value):  # gettext_lazy(): kombu's JSON sends it as the str it is now
        _encode(str(value), out, 0)
    else:
        raise _Fail(
            f"a {type(value).__module__}.{type(value).__qualname__} object has no deterministic "
            f"encoding; pass a JSON-compatible value ({_SUPPORTED}) instead, {_FIX}"
        )


def _lazy_text(value: object) -> bool:
    from django.utils.functional import Promise

    return isinstance(value, Promise)


def _encode_root(value: object, out: bytearray, path: str) -> None:
    try:
        _encode(value, out, 0)
    except _Fail as fail:
        raise fail.error(path) from None
    except RecursionError:  # the caller's stack was already deep
        raise FingerprintError(f"cannot fingerprint {path}: {_DEPTH}") from None


def canonical_bytes(value: object, *, path: str = "value") -> bytes:
    """Return the canonical encoding of ``value`` (no version prefix).

    Raises :class:`FingerprintError`, naming ``path``, for values without one.
    """
    out = bytearray()
    _encode_root(value, out, path)
    return bytes(out)


def _encode_arguments(bound: Mapping[str, object], out: bytearray) -> None:
    """Encode bound arguments as a map; error paths are rooted at the argument names."""
    out += _TAG_LEN(_MAP, len(bound))
    name = ""
    try:
        for name in sorted(bound):  # code point order == UTF-8 byte order
            raw = name.encode("utf-8", "surrogatepass")
            out += _LEN(len(raw)) + raw
            _encode(bound[name], out, 0)
    except _Fail as fail:
        raise fail.error(name) from None
    except RecursionError:  # the caller's stack was already deep
        raise FingerprintError(f"cannot fingerprint {name}: {_DEPTH}") from None


def fingerprint(
    name: str,
    args: Sequence[object] = (),
    kwargs: Mapping[str, object] | None = None,
    *,
    signature: inspect.Signature | None = None,
    key: Sequence[str] | Callable[..., object] | None = None,
    idempotency_key: str | None = None,
    causality: str | None = None,
) -> str:
    """Return the 64-hex-digit BLAKE3-256 fingerprint of one invocation.

    ``name`` is the task name or ``protect()`` namespace. ``idempotency_key``, when
    given, replaces the arguments. Otherwise they are bound (:func:`bind_arguments`)
    and ``key`` selects what counts: argument names, or a callable called as
    ``key(**bound)`` whose return value is fingerprinted. Raises FingerprintError.
    """
    bound = None
    if idempotency_key is None:
        bound = bind_arguments(signature, args, {} if kwargs is None else kwargs, name)
    return fingerprint_bound(
        name, bound, signature=signature, key=key, idempotency_key=idempotency_key,
        causality=causality,
    )


def fingerprint_bound(
    name: str,
    bound: Mapping[str, object] | None,
    *,
    signature: inspect.Signature | None = None,
    key: Sequence[str] | Callable[..., object] | None = None,
    idempotency_key: str | None = None,
    causality: str | None = None,
) -> str:
    """:func:`fingerprint` of arguments already bound by :func:`bind_arguments` (the
    guard binds once and renders the redacted repr from the same binding). ``bound``
    may be None only with an ``idempotency_key``."""
    if not isinstance(name, str) or not name:
        raise FingerprintError(f"the fingerprint name must be a non-empty str, got {name!r}")
    if causality is not None and not isinstance(causality, str):
        raise FingerprintError(f"causality must be a str or None, not {type(causality).__name__}")
    out = bytearray(_PREFIX)
    _encode(name, out, 0)
    _encode(causality, out, 0)
    if idempotency_key is not None:
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise FingerprintError("idempotency_key must be a non-empty str")
        out += b"K"
        _encode(idempotency_key, out, 0)
        return _digest(out)
    if bound is None:
        raise FingerprintError("no arguments were bound and no idempotency_key was given")
    if key is None:
        out += b"A"
        _encode_arguments(bound, out)
    elif callable(key):
        try:
            material = key(**bound)
        except Exception as exc:
            from .memo import masked_summary  # (only here: an error's text, redacted)

            raise FingerprintError(  # its traceback is left out: it may quote the arguments
                f"grousset_key() raised {masked_summary(exc, bound)}; it is called with the "
                f"call's arguments by name: {', '.join(bound) or '(none)'} (a *args or **kwargs "
                "parameter is one argument under its name). Call it with them yourself to "
                "see its traceback"
            ) from None
        if material is None or (isinstance(material, (str, bytes, tuple, list, dict))
                                and not material):  # fmt: skip
            raise FingerprintError(
                f"grousset_key() returned {material!r}: every call would share one key, "
                "so distinct calls would be answered from the first one's memo; return what "
                "identifies the call (did the function miss its `return`?)"
            )
        out += b"C"
        _encode_root(material, out, "grousset_key()")
    else:
        validate_key_names(signature, key)
        out += b"A"
        names = (key,) if isinstance(key, str) else key
        _encode_arguments({item: bound[item] for item in names}, out)
    return _digest(out)


def _digest(out: bytearray) -> str:
    """BLAKE3-256 of ``out`` in hex, keyed with ``GROUSSET["FINGERPRINT_KEY"]`` when set."""
    from django.conf import settings

    if not settings.configured:  # the encoding alone (tools, golden vectors)
        return blake3(out).hexdigest()
    from celery_grousset.conf import GroussetSettingsError, grousset_settings, validate_setting

    try:
        key = grousset_settings.FINGERPRINT_KEY
    except GroussetSettingsError:  # another setting's error (BYPASS still runs): this one
        given = getattr(settings, "GROUSSET", None)
        raw = given.get("FINGERPRINT_KEY") if isinstance(given, dict) else None
        key = validate_setting("FINGERPRINT_KEY", raw)
    return (blake3(out) if key is None else blake3(out, key=key)).hexdigest()


def payload_hash(name: str, bound: Mapping[str, object]) -> str:
    """The payload hash of a keyed call: BLAKE3 of the canonical encoding of ALL its bound
    arguments (the fingerprint the call would have without ``key=`` or an idempotency
    key). Stored beside the key, it tells a reuse of the key with other arguments.
    Raises FingerprintError."""
    return fingerprint_bound(name, bound)
