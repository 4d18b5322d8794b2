"""Which names are sensitive: a mapping's key, an argument's or a field's name, the name
of a ``(name, value)`` pair or of a command-line flag. The value under such a name is never
shown (:mod:`celery_grousset.redact` renders it ``'***'``). docs/configuration.md
(``REDACT_KEYS``) is the user's page of these rules.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Collection
from functools import lru_cache

__all__ = ["DEFAULT_REDACT_KEYS", "is_secret_flag", "is_secret_pair", "is_sensitive",
           "is_sensitive_under"]

DEFAULT_REDACT_KEYS: frozenset[str] = frozenset({  # key: a whole part (stripe_key, not keyboard)
    "password", "passwd", "secret", "token", "api_key", "apikey", "authorization", "auth",
    "card", "card_number", "cvv", "cvc", "pan", "ssn", "iban", "private_key",
    "access_token", "refresh_token", "client_secret", "credentials", "credential", "pwd",
    "pass", "passphrase", "passcode", "key", "cookie", "session_id", "sessionid", "sessid",
    "session_key", "session_token", "jwt", "otp", "totp", "pin", "bearer", "dsn",
    "credit_card", "access_key", "signing_key", "pin_code", "security_code", "auth_code",
    "mfa_code", "recovery_code", "social_security", "connection_string", "database_url",
    "mnemonic", "pw", "signature", "sig", "hmac", "account_number", "routing_number",
    "creds", "privkey", "cred", "oauth", "authorisation",
})  # fmt: skip
"""Argument and mapping key names whose values are never shown."""

_WHOLE_WORD_BELOW = 5  # one-part redact keys shorter than this must match a whole part
# Parts: an acronym (not the capital that starts the next word), a capitalised or
# lower-case word, or a run of digits. Everything else separates parts.
_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

_Rules = tuple[tuple[str, ...], frozenset[str]]


def _parts(name: str) -> list[str]:
    return [part.lower() for part in _PARTS.findall(name)]


@lru_cache(maxsize=32)
def _compile_rules(redact_keys: frozenset[str]) -> _Rules:
    """Split redact keys into joined-parts patterns and whole-part patterns."""
    substrings: set[str] = set()
    words: set[str] = set()
    for key in redact_keys:
        parts = _parts(str(key))
        joined = "".join(parts)
        if len(parts) == 1 and len(joined) < _WHOLE_WORD_BELOW:
            words.add(joined)
        elif joined:
            substrings.add(joined)
    return tuple(sorted(substrings)), frozenset(words)


def _rules_for(redact_keys: Collection[str]) -> _Rules:
    if not isinstance(redact_keys, frozenset):
        redact_keys = frozenset(redact_keys)
    return _compile_rules(redact_keys)


def _matches(name: object, rules: _Rules) -> bool:
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    if not isinstance(name, str):  # an enum member or a tuple as a mapping's key
        if isinstance(name, enum.Enum):
            return _matches(name.name, rules) or _matches(name.value, rules)
        return isinstance(name, tuple) and any(_matches(part, rules) for part in name[:8])
    # a task's argument names come again with every call: cached
    return (_name_matches if len(name) <= 64 else _name_matches.__wrapped__)(name, rules)


@lru_cache(maxsize=4096)
def _name_matches(name: str, rules: _Rules) -> bool:
    parts = _parts(name)
    substrings, words = rules
    squashed = "".join(parts)
    if any(pattern in squashed for pattern in substrings):
        return True
    return any(part in words or (part[-1:] == "s" and part[:-1] in words) for part in parts)


def is_sensitive(name: str, redact_keys: Collection[str] = DEFAULT_REDACT_KEYS) -> bool:
    """Whether a value named ``name`` (argument, key or field) must be redacted."""
    try:
        return _matches(name, _rules_for(redact_keys))
    except Exception:  # never raise; when in doubt, redact
        return True


def is_sensitive_under(redact_keys: Collection[str]) -> Callable[[object], bool]:
    """:func:`is_sensitive` with its rules compiled once, for a walk over many names (a
    mapping's key of any type: ``str``, ``bytes``, an enum member, a tuple)."""
    try:
        rules, seen = _rules_for(redact_keys), dict[str, bool]()  # a walk's keys repeat
    except Exception:  # keys that cannot be compiled: every name is in doubt
        return lambda name: True

    def sensitive(name: object) -> bool:
        try:
            if type(name) is not str:  # only a plain str is remembered: another type may
                return _matches(name, rules)  # equal a str and be judged otherwise
            if (known := seen.get(name)) is None:
                known = seen[name] = _matches(name, rules)
            return known
        except Exception:  # never raise; when in doubt, redact
            return True

    return sensitive


def is_secret_pair(value: object, redact_keys: Collection[str] = DEFAULT_REDACT_KEYS) -> bool:
    """A ``(name, value)`` pair whose name is sensitive (a list after JSON: a header
    list's ``[name, value]``): its value is never shown."""
    return _secret_pair(value, _rules_for(redact_keys))


def _secret_pair(value: object, rules: _Rules) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 2
            and isinstance(value[0], (str, bytes)) and _matches(value[0], rules))  # fmt: skip


def is_secret_flag(value: object, redact_keys: Collection[str] = DEFAULT_REDACT_KEYS) -> bool:
    """A command-line flag naming a secret (``--password``, ``-api-key``): the next item
    of its argv list is the secret. ``--password=…`` is text, redacted as such."""
    if not (isinstance(value, str) and value[:1] == "-"):  # most items: no rules to look up
        return False
    return _secret_flag(value, _rules_for(redact_keys))


def _secret_flag(value: object, rules: _Rules) -> bool:
    return (isinstance(value, str) and value[:1] == "-" and len(value) <= 64
            and "=" not in value and not any(c.isspace() for c in value)
            and _matches(value.lstrip("-"), rules))  # fmt: skip
