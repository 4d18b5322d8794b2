"""Redacted, bounded text renderings of task arguments.

The outcome journal and the admin show what a task was called with. That text
must not leak secrets, must fit a column, and must never make the guard fail, so
:func:`safe_repr`:

* uses Celery's ``argsrepr``/``kwargsrepr`` verbatim when the producer supplied
  them (the producer has already chosen what to show), never the raw values;
* otherwise renders ``repr``-like text in which the value of every mapping key,
  keyword argument, bound parameter, dataclass field or namedtuple field whose
  name looks sensitive is replaced by ``'***'``, recursively;
* strips NUL characters (PostgreSQL text rejects them), replaces lone surrogates,
  and truncates to ``max_length`` characters with a ``…(+N chars)`` marker;
* never raises: a value whose ``__repr__`` fails renders as
  ``<unrepresentable TypeName>``.

A name is sensitive when, case-insensitively and ignoring ``_``, ``-``, ``.`` and
spaces, it contains a redact key: ``user_password``, ``X-Api-Key``, ``clientSecret``
and ``cardnumber`` all are. Redact keys shorter than 5 characters (``auth``,
``pan``, ``ssn``, ``card``...) must instead match a whole word (words are split at
those separators and at camelCase humps), so ``company`` and ``discard`` are shown
while ``auth_header``, ``cardPan`` and ``user ssn`` are redacted.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import lru_cache

__all__ = ["DEFAULT_REDACT_KEYS", "REDACTED", "is_sensitive", "safe_repr"]

DEFAULT_REDACT_KEYS: frozenset[str] = frozenset(
    {
        "password",
        "passwd",
        "secret",
        "token",
        "api_key",
        "apikey",
        "authorization",
        "auth",
        "card",
        "card_number",
        "cvv",
        "cvc",
        "pan",
        "ssn",
        "iban",
        "private_key",
        "access_token",
        "refresh_token",
        "client_secret",
        "credentials",
    }
)
"""Argument and mapping key names whose values are never shown."""

REDACTED = "'***'"
"""What a redacted value renders as."""

_MAX_DEPTH = 20
_WHOLE_WORD_BELOW = 5  # redact keys shorter than this must match a whole word
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = str.maketrans({"-": "_", ".": "_", " ": "_"})

_Rules = tuple[tuple[str, ...], frozenset[str]]


def _normalise(name: str) -> str:
    return _CAMEL_BOUNDARY.sub("_", name).lower().translate(_SEPARATORS)


@lru_cache(maxsize=32)
def _compile_rules(redact_keys: frozenset[str]) -> _Rules:
    """Split redact keys into substring patterns and whole-word patterns."""
    substrings: list[str] = []
    words: set[str] = set()
    for key in redact_keys:
        normalised = _normalise(str(key)).strip("_")
        if len(normalised) >= _WHOLE_WORD_BELOW or "_" in normalised:
            substrings.append(normalised.replace("_", ""))  # separators are ignored
        elif normalised:
            words.add(normalised)
    return tuple(sorted(substrings)), frozenset(words)


def _rules_for(redact_keys: Collection[str]) -> _Rules:
    if not isinstance(redact_keys, frozenset):
        redact_keys = frozenset(redact_keys)
    return _compile_rules(redact_keys)


def _matches(name: object, rules: _Rules) -> bool:
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    if not isinstance(name, str):
        return False
    normalised = _normalise(name)
    substrings, words = rules
    squashed = normalised.replace("_", "")
    if any(pattern in squashed for pattern in substrings):
        return True
    return bool(words) and not words.isdisjoint(normalised.split("_"))


def is_sensitive(name: str, redact_keys: Collection[str] = DEFAULT_REDACT_KEYS) -> bool:
    """Whether a value named ``name`` (argument, key or field) must be redacted."""
    try:
        return _matches(name, _rules_for(redact_keys))
    except Exception:  # never raise; when in doubt, redact
        return True


def _plain_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:
        return f"<unrepresentable {type(value).__name__}>"
    return text if isinstance(text, str) else f"<unrepresentable {type(value).__name__}>"


class _Renderer:
    """Renders values like ``repr``, redacting values under sensitive names."""

    def __init__(self, rules: _Rules) -> None:
        self.rules = rules
        self.active: set[int] = set()  # ids of the containers being rendered (cycles)

    def named(self, name: object, value: object, depth: int) -> str:
        """Render the value of a field/key called ``name``."""
        if _matches(name, self.rules):
            return REDACTED
        return self.render(value, depth)

    def render(self, value: object, depth: int = 0) -> str:
        """Render one value; containers recurse, everything else uses its repr."""
        if isinstance(value, (str, int, float, bytes, type(None))):
            return _plain_repr(value)
        if depth >= _MAX_DEPTH:
            return "…"
        ident = id(value)
        if ident in self.active:
            return "<recursion>"
        self.active.add(ident)
        try:
            return self._render_container(value, depth + 1)
        except Exception:  # a broken __iter__, __len__, keys()...
            return f"<unrepresentable {type(value).__name__}>"
        finally:
            self.active.discard(ident)

    def _render_container(self, value: object, depth: int) -> str:
        if isinstance(value, Mapping):
            items = ", ".join(
                f"{_plain_repr(key)}: {self.named(key, item, depth)}" for key, item in value.items()
            )
            if type(value) is dict:
                return f"{{{items}}}"
            return f"{type(value).__qualname__}({{{items}}})"
        if isinstance(value, tuple):
            names = getattr(value, "_fields", None)
            if isinstance(names, tuple):  # a namedtuple: render by field name, to redact
                return self._call_like(value, zip(names, value, strict=False), depth)
        if isinstance(value, (list, tuple)):
            items = ", ".join(self.render(item, depth) for item in value)
            if isinstance(value, list):
                return f"[{items}]"
            return f"({items},)" if len(value) == 1 else f"({items})"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value) if f.repr)
            return self._call_like(value, fields, depth)
        return _plain_repr(value)

    def _call_like(self, value: object, fields: Iterable[tuple[str, object]], depth: int) -> str:
        inner = ", ".join(f"{name}={self.named(name, item, depth)}" for name, item in fields)
        return f"{type(value).__qualname__}({inner})"


def _truncate(text: str, max_length: int) -> str:
    """Cut ``text`` to at most ``max_length`` characters, ending with ``…(+N chars)``."""
    if len(text) <= max_length:
        return text
    keep = max(max_length, 0)
    for _ in range(3):  # the marker's own length depends on N; converges in <= 2 steps
        keep = max(max_length - len(f"…(+{len(text) - keep} chars)"), 0)
    return (text[:keep] + f"…(+{len(text) - keep} chars)")[: max(max_length, 0)]


def _clean(text: str, max_length: int) -> str:
    text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot be stored as UTF-8
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _truncate(text, max_length)


def safe_repr(
    args: Sequence[object],
    kwargs: Mapping[str, object],
    *,
    argsrepr: str | None = None,
    kwargsrepr: str | None = None,
    redact_keys: Collection[str] = DEFAULT_REDACT_KEYS,
    max_length: int = 1024,
    bound: Mapping[str, object] | None = None,
) -> str:
    """Render a task's arguments as redacted text of at most ``max_length`` characters.

    * ``argsrepr``/``kwargsrepr`` (Celery's, set by the producer) are used verbatim
      when given, as ``args=<argsrepr>, kwargs=<kwargsrepr>``; a missing half is
      rendered from the values, redacted.
    * Otherwise, with ``bound`` (arguments bound to the signature by name) the text
      is ``name=value, ...``, so a positional ``password`` is redacted too; without
      it, call-like ``value, ..., name=value``.

    Values under sensitive names (see :func:`is_sensitive`) render as ``'***'``.
    Never raises.
    """
    try:
        renderer = _Renderer(_rules_for(redact_keys))
        if argsrepr is not None or kwargsrepr is not None:
            shown_args = argsrepr if argsrepr is not None else renderer.render(tuple(args))
            shown_kwargs = kwargsrepr if kwargsrepr is not None else renderer.render(dict(kwargs))
            text = f"args={_as_text(shown_args)}, kwargs={_as_text(shown_kwargs)}"
        elif bound is not None:
            text = ", ".join(f"{name}={renderer.named(name, v, 0)}" for name, v in bound.items())
        else:
            parts = [renderer.render(value) for value in args]
            parts += [f"{name}={renderer.named(name, v, 0)}" for name, v in kwargs.items()]
            text = ", ".join(parts)
        return _clean(text, max_length)
    except Exception as exc:  # last resort: never fail the caller
        return _clean(f"<arguments could not be rendered: {type(exc).__qualname__}>", max_length)


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else _plain_repr(value)
