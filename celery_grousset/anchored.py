"""Find-and-replace with redaction's pattern, scanning only near the characters a match
needs: every alternative of ``secret_patterns.SECRETS`` contains, at most :data:`BACK` characters
after its start, an *anchor* — ``=``, ``:``, ``<`` or ``%`` (a ``name=value`` pair, a
URL, a header, an XML element, ``%3d``), the start of a run of digits (a card number),
or ``bearer``, ``eyj`` (a JWT), ``-----beg`` (a PEM block), in any case, a quote and a
dash (a quoted command-line flag), a quote and a comma (a ``('name', value)`` pair), or the prefix
of an API key of a known form (``sk_live_``, ``AKIA``, ``ghp_``…: :data:`KEY_PREFIXES`).
So a match can only start in the :data:`BACK` characters before an anchor: :func:`sub`
tries the pattern there, and nowhere else. It gives exactly ``pattern.sub(repl, text)`` (a
differential test holds it to that on generated text) at a fraction of the cost on
ordinary text: a name, an e-mail address, a sentence with a number.
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: the farthest an anchor lies from the start of a match (74: ``-{0,2}`` and a name of up
#: to 64 characters and ``\s{0,8}`` before the ``=`` of a ``name=value`` pair, or a quoted
#: name before its ``:``; a URL's scheme lies 31 before ``://``), with room to spare;
#: tests/test_redact_scan.py shows 73 missing matches
BACK = 80
_CHARS = re.compile(r"[=:<%]")
_DIGIT = re.compile(r"[0-9]")
_DIGITS = re.compile(r"[0-9]+")  # a run's start
#: the start of an API key whose form is known (secret_patterns._KNOWN_KEYS), lower-cased; those
#: patterns match in exact case only, so a long s or a Kelvin sign never makes them match
KEY_PREFIXES = ("sk_", "rk_", "whsec_", "akia", "asia", "ghp_", "gho_", "ghu_", "ghs_",
                "ghr_", "github_pat_", "xox", "aiza", "glpat-", "sg.", "sk-")  # fmt: skip
#: a command-line flag quoted in text (``'--password', 'x'``): its opening quote and dash;
#: a pair quoted in text (``('password', 'x')``): the quote and comma after its name
QUOTED_FLAGS = ("'-", '"-', "',", '",')
#: words found in the lower-cased text (those matched in any case have no i, k or s,
#: where lower() is not exact), overlapping ones too (``sk-----begin``)
_WORDS = re.compile(
    "(?=(?:"
    + "|".join(map(re.escape, ("bearer", "eyj", "-----beg", *QUOTED_FLAGS, *KEY_PREFIXES)))
    + "))"
)
#: more anchors than one in DENSE characters: one pass costs less than the windows (a
#: position tried from Python costs about twice one the single pass scans)
DENSE = 160


def _anchors(text: str) -> list[int] | None:
    """The anchors' positions, sorted; None when one pass costs less (dense anchors) or
    only one pass is exact (a character whose lower case is longer, as ``İ``: the
    positions would move)."""
    low = text.lower()
    if len(low) != len(text):
        return None
    found = [m.start() for m in _CHARS.finditer(text)]
    if len(found) * DENSE > len(text):
        return None
    if _DIGIT.search(text) is not None:
        found += [m.start() for m in _DIGITS.finditer(text)]
    found += [m.start() for m in _WORDS.finditer(low)]
    return sorted(found)


def sub(pattern: re.Pattern[str], repl: Callable[[re.Match[str]], str], text: str) -> str:
    """``pattern.sub(repl, text)``, trying ``pattern`` only where a match can start."""
    anchors = _anchors(text)
    if anchors is None or len(anchors) * DENSE > len(text):
        return pattern.sub(repl, text)
    out: list[str] = []
    last = tried = 0  # the end of the last match; the positions before `tried` failed
    for anchor in anchors:
        if anchor < tried:
            continue
        for at in range(max(last, anchor - BACK, tried), anchor + 1):
            match = pattern.match(text, at)
            if match is not None:
                out += (text[last : match.start()], repl(match))
                last = tried = match.end()
                break
        else:
            tried = anchor + 1
    return "".join(out) + text[last:] if out else text
