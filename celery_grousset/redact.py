"""Redacted, bounded text renderings of task arguments.

The outcome journal and the admin show what a task was called with. That text must not
leak secrets, must fit a column, and must never make the guard fail, so
:func:`safe_repr` uses the producer's ``argsrepr``/``kwargsrepr`` when given (through
:func:`redact_text`), and otherwise renders ``repr``-like text in which the value under
every sensitive name (mapping key, keyword argument, bound parameter, dataclass or
namedtuple field, the name of a ``(name, value)`` pair) is ``'***'``, recursively; it
strips NULs, replaces lone surrogates, truncates with a ``…(+N chars)`` marker, and never
raises. Which names are sensitive is :mod:`celery_grousset.sensitive`'s rule: names are
split into lower-case parts (``accessKey`` is ``access key``,
``X-Api-Key`` is ``x api key``); a one-part key shorter than 5 characters (``key``,
``pin``) must be a whole part (``stripe_key`` yes, ``keyboard`` no), any other is looked
for with the parts joined (``userPassword``, ``cardnumber``). docs/configuration.md
(``REDACT_KEYS``) is the user's page of these rules; :func:`redact_text` removes secret
*values* from any text, whatever their name.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from itertools import takewhile

from celery_grousset import anchored
from celery_grousset.secret_patterns import _BARE_NAME_RE, luhn, nested_values
from celery_grousset.secret_patterns import SECRETS as _SECRETS
from celery_grousset.secret_patterns import SPACED as _SPACED
from celery_grousset.secret_patterns import SPACED_AFTER as _SPACED_AFTER
from celery_grousset.secret_patterns import SPACED_HINT as _SPACED_HINT
from celery_grousset.sensitive import (
    DEFAULT_REDACT_KEYS,
    _matches,
    _Rules,
    _rules_for,
    _secret_flag,
    _secret_pair,
    is_secret_flag,
    is_secret_pair,
    is_sensitive,
    is_sensitive_under,
)
from celery_grousset.textcut import clean_and_cut

__all__ = ["DEFAULT_REDACT_KEYS", "REDACTED", "is_long_number", "is_secret_flag",
           "is_secret_pair", "is_sensitive", "is_sensitive_under", "redact_text", "safe_repr"]


REDACTED = "'***'"
"""What a redacted value renders as."""

_MAX_DEPTH = 20
#: How far past the shown ``max_length`` the redacted text reaches before the rest is left
#: unscanned: a secret starting in the shown part is recognised if it ends within it (an
#: XML element's or quoted value: 4,096; a URL's password, a card: less; PEM, JWT: masked).
SCAN_MARGIN = 4096 + 128


def is_long_number(value: object) -> bool:
    """A number long enough to be a card's: scanned as text (:func:`redact_text`)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) >= 1e12


def _plain_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:
        return f"<unrepresentable {type(value).__name__}>"
    return text if isinstance(text, str) else f"<unrepresentable {type(value).__name__}>"


class _Renderer:
    """Renders values like ``repr``, redacting values under sensitive names."""

    def __init__(self, rules: _Rules, shown: int) -> None:
        self.rules, self.budget = rules, shown + SCAN_MARGIN  # characters left to scan
        self.reserve = SCAN_MARGIN  # past the shown part: only a started string reads on
        self.dropped = 0  # characters cut before rendering: counted in the "…(+N chars)"
        self.more = False  # items left unrendered once the budget ran out: "… and more)"
        self.active: set[int] = set()  # ids of the containers being rendered (cycles)

    def unspent(self, _item: object = None) -> bool:
        """The shown part is not full yet. Once it is, a container's further items are
        never shown, so they are not rendered (a 100,000-item list costs what its first
        items do); a string started in the shown part is still scanned into the margin."""
        self.more = self.more or self.budget <= self.reserve
        return self.budget > self.reserve

    def scanned(self, text: str) -> str:
        """``text`` redacted, scanned only until its redacted part fills what is left of
        ``max_length + SCAN_MARGIN`` (a secret masked shrinks it: then more is scanned,
        doubling): what lies past that can never be shown."""
        need, keep = self.budget, min(len(text), max(self.budget, 0))
        while True:
            out = _redact_text(text[:keep] if keep < len(text) else text, self.rules)
            if keep == len(text) or len(out) >= need:
                break
            keep = min(len(text), max(2 * keep, keep + need - len(out)))
        self.budget -= len(out)
        self.dropped += len(text) - keep
        return out

    def named(self, name: object, value: object, depth: int) -> str:
        """Render the value of a field/key called ``name``."""
        if _matches(name, self.rules):
            return REDACTED
        return self.render(value, depth)

    def render(self, value: object, depth: int = 0) -> str:
        """Render one value; containers recurse, everything else uses its repr."""
        if isinstance(value, str):
            return _plain_repr(self.scanned(value))
        if isinstance(value, (int, float, type(None))):
            text = _plain_repr(value)
            if is_long_number(value):
                return self.scanned(text)
            self.budget -= len(text)
            return text
        if isinstance(value, bytes):  # each byte is 1+ characters of its repr
            cut = value[: max(self.budget, 0) + 1]
            self.more = self.more or len(cut) < len(value)
            return self.scanned(_plain_repr(cut))
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
                f"{self.render(key, depth)}: {self.named(key, item, depth)}"
                for key, item in takewhile(self.unspent, value.items())
            )
            if type(value) is dict:
                return f"{{{items}}}"
            return f"{type(value).__qualname__}({{{items}}})"
        if isinstance(value, (list, tuple)) and _secret_pair(value, self.rules):
            pair = f"{self.render(value[0], depth)}, {REDACTED}"  # a (name, value) pair
            return f"({pair})" if isinstance(value, tuple) else f"[{pair}]"
        fields = named_fields(value, shown_only=True)
        if fields is not None:  # a namedtuple, a dataclass: by field
            return self._call_like(value, fields, depth)
        if isinstance(value, (list, tuple)):
            items = ", ".join(self.sequence(value, depth))
            if isinstance(value, list):
                return f"[{items}]"
            return f"({items},)" if len(value) == 1 else f"({items})"
        if type(value) in (set, frozenset) and value:  # item by item, as far as shown
            items = ", ".join(self.sequence(value, depth))  # type: ignore[arg-type]
            return f"{{{items}}}" if type(value) is set else f"frozenset({{{items}}})"
        return self.scanned(_plain_repr(value))  # other objects' reprs

    def sequence(self, values: Iterable[object], depth: int) -> list[str]:
        """Render the items of a sequence; the item after a sensitive command-line flag
        (``'--password', 'hunter2'``: an argv list) is ``'***'``."""
        shown, after_flag = [], False
        for item in values:
            if not self.unspent():
                break
            shown.append(REDACTED if after_flag else self.render(item, depth))
            after_flag = _secret_flag(item, self.rules)
        return shown

    def _call_like(self, value: object, fields: Iterable[tuple[str, object]], depth: int) -> str:
        inner = ", ".join(f"{name}={self.named(name, item, depth)}"
                          for name, item in takewhile(self.unspent, fields))  # fmt: skip
        return f"{type(value).__qualname__}({inner})"


_UNSET = object()


def named_fields(
    value: object, *, shown_only: bool = False
) -> Iterable[tuple[str, object]] | None:
    """The fields of a namedtuple or a dataclass instance, by name (None: it is neither):
    a field's name redacts its value as a keyword argument's does. ``shown_only``: the
    dataclass fields its ``repr`` shows."""
    names = getattr(value, "_fields", None)
    if isinstance(value, tuple) and isinstance(names, tuple):
        return zip(names, value, strict=False)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ((f.name, item) for f in dataclasses.fields(value)  # (a field never set:
                if (f.repr or not shown_only)  # init=False, no default: left out)
                and (item := getattr(value, f.name, _UNSET)) is not _UNSET)  # fmt: skip
    return None


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

    * ``argsrepr``/``kwargsrepr`` (Celery's, set by the producer) are used when
      given, as ``args=<argsrepr>, kwargs=<kwargsrepr>``, through :func:`redact_text`;
      a missing half is rendered from the values, redacted.
    * Otherwise, with ``bound`` (arguments bound to the signature by name) the text
      is ``name=value, ...``, so a positional ``password`` is redacted too; without
      it, call-like ``value, ..., name=value``.

    Values under sensitive names (see :func:`is_sensitive`) render as ``'***'``;
    strings go through :func:`redact_text`. Never raises.
    """
    try:
        rules = _rules_for(redact_keys)
        renderer = _Renderer(rules, max(max_length, 0))
        if argsrepr is not None or kwargsrepr is not None:
            shown_args = (
                _redact_text(_as_text(argsrepr), rules)
                if argsrepr is not None
                else renderer.render(tuple(args))
            )
            shown_kwargs = (
                _redact_text(_as_text(kwargsrepr), rules)
                if kwargsrepr is not None
                else renderer.render(dict(kwargs))
            )
            text = f"args={shown_args}, kwargs={shown_kwargs}"
        elif bound is not None:
            text = ", ".join(f"{name}={renderer.named(name, v, 0)}" for name, v in bound.items())
        else:
            parts = renderer.sequence(args, 0)
            parts += [f"{name}={renderer.named(name, v, 0)}" for name, v in kwargs.items()]
            text = ", ".join(parts)
        return clean_and_cut(text, max_length, renderer.dropped, more=renderer.more)
    except Exception as exc:  # last resort: never fail the caller
        text = f"<arguments could not be rendered: {type(exc).__qualname__}>"
        return clean_and_cut(text, max_length)


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else _plain_repr(value)


TEXT_REDACTED = "***"  # what a secret in text becomes


def _redact_text(text: str, rules: _Rules, depth: int = 0) -> str:
    try:
        if not depth:
            text = _without_nested(text, rules)
        if depth:  # the value of a pair, re-scanned: short, and scanned whole
            return _SECRETS.sub(_replacer(rules, depth), text)
        text = anchored.sub(_SECRETS, _replacer(rules, depth), text)
        if _SPACED_HINT.search(text):  # "Error: password = x": a second pass (rare text)
            text = anchored.sub(_SPACED, _replacer(rules, depth), text)
        return text
    except Exception:  # never fail the caller; when in doubt, show nothing
        return TEXT_REDACTED if text else text


def _without_nested(text: str, rules: _Rules) -> str:
    """``text`` with the value a sensitive name holds masked whole where it is nested
    (``"password": {"a": {"b": …}}``, ``password=Secret(Str(…))``): the pattern of
    :data:`_SECRETS` sees values one level deep."""
    pieces: list[str] = []
    last = 0
    for start, end in nested_values(text, lambda name: _matches(name, rules)):
        pieces += (text[last:start], TEXT_REDACTED)
        last = end
    return "".join(pieces) + text[last:] if pieces else text


#: "KeyError: 'user_id'" is an exception's summary, not a key's value
_EXCEPTION_NAME = re.compile(r"[A-Z][A-Za-z0-9]*(?:Error|Exception|Warning)")



def _masked(value: str) -> str:
    """``***``, in the quotes of ``value`` if it is quoted."""
    quote = value[:1]
    return f"{quote}{TEXT_REDACTED}{quote}" if quote in ("'", '"') else TEXT_REDACTED


def _replacer(rules: _Rules, depth: int) -> Callable[[re.Match[str]], str]:
    def inner(value: str) -> str:  # the value of a name that is not sensitive: its own
        return _redact_text(value, rules, depth + 1) if depth < 3 else value  # secrets

    def replace(match: re.Match[str]) -> str:
        if match.group("header") is not None:
            scheme = (match.group("scheme") or "") + (match.group("gap") or "")
            return match.group("header") + scheme + TEXT_REDACTED
        if match.group("bearer") is not None:
            return match.group("bearer") + TEXT_REDACTED
        if match.group("url") is not None:
            return match.group("url") + TEXT_REDACTED
        if match.group("jwt") is not None or match.group("known") is not None:
            return TEXT_REDACTED
        if match.group("pem") is not None:
            return TEXT_REDACTED
        if match.group("xname") is not None:
            secret = _matches(match.group("xkey"), rules)
            return match.group("xname") + (TEXT_REDACTED if secret else match.group("xvalue"))
        if match.group("pan") is not None:
            return TEXT_REDACTED if luhn(match.group("pan")) else match.group(0)
        if match.group("fname") is not None:
            if _matches(match.group("fkey"), rules):
                return match.group("fname") + _masked(match.group("fvalue"))
            return match.group("fname") + inner(match.group("fvalue"))
        if match.group("qname") is not None:
            if _matches(match.group("qkey"), rules):
                return match.group("qname") + _masked(match.group("qvalue"))
            return match.group("qname") + inner(match.group("qvalue"))
        key, colon = match.group("key"), match.group("kname").rstrip().endswith(":")
        value = match.group("kvalue")
        if (_BARE_NAME_RE.fullmatch(value) and _SPACED_AFTER.match(match.string, match.end())
                and _matches(value, rules)):  # "auth: secret = x": the name of a pair of
            return match.group(0)  # its own, masked by the second pass (_SPACED)
        if _matches(key, rules) and not (colon and _EXCEPTION_NAME.fullmatch(key)):
            return match.group("kname") + _masked(match.group("kvalue"))
        return match.group("kname") + inner(match.group("kvalue"))

    return replace


def redact_text(text: str, redact_keys: Collection[str] = DEFAULT_REDACT_KEYS) -> str:
    """``text`` with secret values replaced by ``***``; never raises.

    Removed: the credentials of an ``Authorization`` header (``Authorization: Basic
    ***``) and any ``Bearer`` token; the password of a URL or DSN
    (``postgres://user:***@host/db``); JWTs; the value of a ``name=value`` or
    ``'name': value`` pair whose name is sensitive (:func:`is_sensitive` with
    ``redact_keys``), as in ``password=*** host=db`` or ``{'pin': '***'}``. Everything
    else is kept as it is. Meant for exception text and other free-form strings.
    """
    try:
        rules = _rules_for(redact_keys)
    except Exception:
        rules = _rules_for(DEFAULT_REDACT_KEYS)
    return _redact_text(text, rules)

