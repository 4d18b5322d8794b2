"""Text cut to a column's length, with an honest marker: how many characters are left
out (``args_repr``, the admin's and the outbox's shown text)."""

from __future__ import annotations

__all__ = ["clean_and_cut"]


def _truncate(text: str, max_length: int, dropped: int = 0) -> str:
    """Cut ``text`` to at most ``max_length`` characters, ending with ``…(+N chars)``
    (``dropped``: characters already cut from it, counted in N)."""
    if len(text) <= max_length and not dropped:
        return text
    keep = min(len(text), max(max_length, 0))
    for _ in range(3):  # the marker's own length depends on N; converges in <= 2 steps
        keep = min(len(text), max(max_length - len(f"…(+{len(text) - keep + dropped} chars)"), 0))
    return (text[:keep] + f"…(+{len(text) - keep + dropped} chars)")[: max(max_length, 0)]


def clean_and_cut(text: str, max_length: int, dropped: int = 0) -> str:
    """``text`` without NUL or lone surrogates, cut to ``max_length`` (``…(+N chars)``)."""
    text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot be stored as UTF-8
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _truncate(text, max_length, dropped)
