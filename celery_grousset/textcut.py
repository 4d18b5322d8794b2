"""Text cut to a column's length, with an honest marker: how many characters are left
out (``args_repr``, the admin's and the outbox's shown text)."""

from __future__ import annotations

__all__ = ["clean_and_cut", "encodable"]


def encodable(text: str) -> str:
    """``text`` as UTF-8 can write it (a database column, a page, a log file): a lone
    surrogate, which a JSON string or ``json.loads`` of a form's input can hold, as its
    escape (``\\ud800``); any other text as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _truncate(text: str, max_length: int, dropped: int = 0, more: bool = False) -> str:
    """Cut ``text`` to at most ``max_length`` characters, ending with ``…(+N chars)``
    (``dropped``: characters already cut from it, counted in N; ``more``: items were
    left unrendered too, ``…(+N chars and more)``)."""
    if len(text) <= max_length and not dropped and not more:
        return text
    keep, tail = min(len(text), max(max_length, 0)), " and more" if more else ""
    for _ in range(3):  # the marker's own length depends on N; converges in <= 2 steps
        n = len(text) - keep + dropped
        keep = min(len(text), max(max_length - len(f"…(+{n} chars{tail})"), 0))
    n = len(text) - keep + dropped
    return (text[:keep] + f"…(+{n} chars{tail})")[: max(max_length, 0)]


def clean_and_cut(text: str, max_length: int, dropped: int = 0, more: bool = False) -> str:
    """``text`` without NUL or lone surrogates, cut to ``max_length`` (``…(+N chars)``)."""
    return _truncate(encodable(text.replace("\x00", "")), max_length, dropped, more)
