"""What the admin and the commands show of stored values: redacted, never raw.

The journal keeps what a duplicate needs (a memo is returned as it was); what a person
sees of it goes through the same redaction as the arguments' text
(:mod:`celery_grousset.redact`): the value under every sensitive name replaced by
``***``, and secret values (bearer tokens, URL passwords…) removed from every string.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import datetime
from typing import Any

from celery_grousset.quoted import secret_values, without_values
from celery_grousset.redact import is_secret_pair, is_sensitive, redact_text
from celery_grousset.textcut import clean_and_cut

_MAX_DEPTH = 20


def shown_json(value: Any, keys: Collection[str]) -> Any:
    """A JSON value (a memo, an outbox row's options) as arguments are shown: the value
    under every sensitive name (a key, a ``[name, value]`` pair's name) replaced by
    ``***``, and masked where another string quotes it; secret values removed from every
    string and key, a number long enough to be a card's masked if it is one."""
    secrets = secret_values([(None, value)], keys)
    shown = _shown(value, keys)
    return _without(shown, secrets) if secrets else shown


def _without(value: Any, secrets: list[str], depth: int = 0) -> Any:
    if depth >= _MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {_without(k, secrets, depth + 1): _without(v, secrets, depth + 1)
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [_without(item, secrets, depth + 1) for item in value]
    if isinstance(value, bytes):
        return _as_bytes(without_values(value.decode("latin-1"), secrets), value)
    return without_values(value, secrets) if isinstance(value, str) else value


def _as_bytes(text: str, value: bytes) -> bytes:
    """``value`` (read as Latin-1: every byte one character, nothing lost), or its text
    with a secret masked."""
    return value if text == value.decode("latin-1") else text.encode("latin-1", "replace")


def _shown(value: Any, keys: Collection[str], depth: int = 0) -> Any:
    if depth >= _MAX_DEPTH:
        return "…"
    if isinstance(value, dict):
        return {
            redact_text(str(name), keys): "***" if is_sensitive(str(name), keys)
            else _shown(item, keys, depth + 1)
            for name, item in value.items()
        }  # fmt: skip
    if isinstance(value, list):
        if is_secret_pair(value, keys):
            return [_shown(value[0], keys, depth + 1), "***"]
        return [_shown(item, keys, depth + 1) for item in value]
    if isinstance(value, str):
        return redact_text(value, keys)
    if isinstance(value, bytes):  # kombu's JSON keeps bytes (and Decimal, UUID…) typed
        return _as_bytes(redact_text(value.decode("latin-1"), keys), value)
    if not isinstance(value, (bool, type(None))) and redact_text(text := str(value), keys) != text:
        return "***"  # a card number as an int, a float, a Decimal
    return value


def shown_text(label: str, text: str, keys: Collection[str], max_length: int) -> str:
    """``label`` and free text stored for humans as an ``args_repr`` is (``protect()``'s
    key): through :func:`redact_text`, then cleaned and cut as ``safe_repr`` is."""
    return clean_and_cut(label + redact_text(text, keys), max_length)


def shown_time(value: datetime) -> str:
    """A stored time as the admin and the commands show it: in the current time zone
    (the admin's, or ``TIME_ZONE`` in a command), with the zone's name — one time in
    UTC beside another in local time misled by hours."""
    from django.utils import timezone

    local = timezone.localtime(value) if timezone.is_aware(value) else value  # USE_TZ=False
    return local.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


#: what a screen acts on rather than shows: C0 and C1 controls, line separators, and the
#: bidirectional overrides and isolates (they reorder what follows: "gpj.exe" read as
#: "exe.jpg"); journal and outbox text comes from whoever published the call
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def visible(text: str, lines: bool = True) -> str:
    """``text`` for a person's screen (a terminal, the admin): its control characters as
    Python escapes, its newlines kept when ``lines``."""
    return _CONTROL.sub(lambda m: "\n" if lines and m.group() == "\n" else
                        m.group().encode("unicode_escape").decode("ascii"),
                        text.replace("\r\n", "\n") if lines else text)  # fmt: skip
