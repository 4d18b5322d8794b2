"""The values a call's sensitive arguments hold, masked wherever other text quotes them.

Redaction by name (:mod:`celery_grousset.redact`) hides the value after ``password=``;
the same value quoted in another argument (``message="login failed for <password>"``)
or in an exception's message has no name in front of it. These are the values to mask
there, as given or in another case.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import date, time
from decimal import Decimal
from urllib.parse import quote, quote_plus

from celery_grousset.redact import (
    DEFAULT_REDACT_KEYS,
    TEXT_REDACTED,
    is_secret_flag,
    is_secret_pair,
    is_sensitive_under,
    named_fields,
    safe_repr,
)

__all__ = ["call_secrets", "redacted_call", "secret_values", "without_values"]


def redacted_call(
    args: Sequence[object],
    kwargs: Mapping[str, object],
    bound: Mapping[str, object] | None,
    redact_keys: Collection[str],
    max_length: int,
) -> str:
    """The text of a call's arguments as stored and shown (``args_repr``): redacted by
    name, cut to ``max_length``; a sensitive argument's value quoted in another one is
    masked there too."""
    text = safe_repr(args, kwargs, redact_keys=redact_keys, bound=bound, max_length=max_length)
    return without_values(text, call_secrets(kwargs, bound, redact_keys))


def call_secrets(
    kwargs: Mapping[str, object],
    bound: Mapping[str, object] | None,
    redact_keys: Collection[str] = DEFAULT_REDACT_KEYS,
) -> list[str]:
    """The secret values of one call: from its arguments bound to the task's signature
    (``bound``, so a positional secret is found too), else from its keyword arguments."""
    return secret_values((kwargs if bound is None else bound).items(), redact_keys)


#: the values whose text a message may quote (a UUID, a Decimal, a date: as str() gives it)
_SCALARS = (str, bytes, int, float, Decimal, uuid.UUID, date, time)


def secret_values(
    named: Iterable[tuple[object, object]], redact_keys: Collection[str] = DEFAULT_REDACT_KEYS
) -> list[str]:
    """The text of each value a sensitive name holds (``named``: a call's bound arguments;
    mappings are searched too), longest first: what an error message must not quote.
    Values under 4 characters are left alone (masking them would mask ordinary text).
    Every container is searched (a secret deep in a big argument may be quoted in a short
    one); a plain value under a name that is not sensitive costs no call."""
    found = set[str]()
    sensitive = is_sensitive_under(redact_keys)

    def walk(value: object, depth: int, secret: bool) -> None:
        if secret and isinstance(value, _SCALARS) and not isinstance(value, bool):
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            found.update(_as_quoted(text) if len(text) >= 4 else ())
        elif isinstance(value, Mapping) and depth < 8:
            for key, item in value.items():
                named_secret = secret or sensitive(key)
                if named_secret or type(item) not in _PLAIN:
                    walk(item, depth + 1, named_secret)
        elif isinstance(value, (list, tuple)) and len(value) == 2 and depth < 8 and (
            is_secret_pair(value, redact_keys)  # [("X-Api-Key", …)], a namedtuple's too
        ):
            walk(value[1], depth + 1, True)
        elif type(value) not in _PLAIN and depth < 8 and (
            (fields := named_fields(value)) is not None  # a dataclass's, a namedtuple's
        ):
            try:
                items = list(fields)
            except Exception:  # a field's descriptor that raises: its value is not known
                items = []
            for name, item in items:
                named_secret = secret or sensitive(name)
                if named_secret or type(item) not in _PLAIN:
                    walk(item, depth + 1, named_secret)
        elif isinstance(value, (list, tuple, set, frozenset)) and depth < 8:
            after_flag = False  # ["--password", "hunter2"]: an argv list
            for item in value:  # {"cards": [...]}, [{"password": ...}]
                if secret or after_flag or type(item) not in _PLAIN:
                    walk(item, depth + 1, secret or after_flag)
                after_flag = (type(item) is str and item[:1] == "-"  # most items: no call
                              and is_secret_flag(item, redact_keys))  # fmt: skip

    for name, value in named:
        walk(value, 0, sensitive(name))
    return sorted(found, key=len, reverse=True)


def _as_quoted(text: str) -> set[str]:
    """``text`` and the forms an error message quotes it in: ``repr``, a JSON string (and
    each inside the other: the ``repr`` of a JSON document), a URL's query or path
    (``%2B``, ``+`` for a space; a lone surrogate, which UTF-8 cannot encode, as its
    surrogatepass bytes)."""
    return {
        text,
        repr(text)[1:-1],
        json.dumps(text)[1:-1],
        repr(json.dumps(text)[1:-1])[1:-1],
        json.dumps(repr(text)[1:-1])[1:-1],
        json.dumps(text, ensure_ascii=False)[1:-1],
        quote(text, errors="surrogatepass"),
        quote(text, safe="", errors="surrogatepass"),
        quote_plus(text, errors="surrogatepass"),
    }


#: types a walk needs to look into only under a sensitive name
_PLAIN = frozenset({str, bytes, int, float, bool, type(None)})


def without_values(text: str, values: Iterable[str]) -> str:
    """``text`` with each of ``values`` (:func:`secret_values`) masked, as given or in
    another case (``CARD 4111…``)."""
    for value in values:
        if value and value.isascii() and text.isascii():  # the same, without a regex
            text = _without_ascii(text, value)
        else:
            text = re.sub(re.escape(value), TEXT_REDACTED, text, flags=re.IGNORECASE)
    return text


def _without_ascii(text: str, value: str) -> str:
    """``re.sub`` of ``value``, case-insensitive, when both are ASCII: there, ``lower()``
    agrees with ``re.IGNORECASE`` (a compiled pattern per call cost ~70 µs a task)."""
    low, needle = text.lower(), value.lower()
    at = low.find(needle)
    if at < 0:
        return text
    parts: list[str] = []
    start = 0
    while at >= 0:
        parts += (text[start:at], TEXT_REDACTED)
        start = at + len(needle)
        at = low.find(needle, start)
    parts.append(text[start:])
    return "".join(parts)
