"""The patterns of secrets in free-form text: what :func:`celery_grousset.redact.redact_text`
looks for, whatever the value's name (a header's credentials, a bearer token, a URL's
password, a JWT, a PEM block, an API key of a known form, a card number) and the
``name=value`` / ``'name': value`` / XML pairs whose name it then judges.
Each repetition is bounded, so a scan stays linear on any input."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

__all__ = ["SECRETS", "SPACED", "SPACED_AFTER", "SPACED_HINT", "luhn", "nested_values"]

_TOKEN = r"[A-Za-z0-9\-._~+/]+=*"  # RFC 6750 b64token
_SCHEMES = r"basic|bearer|digest|negotiate|ntlm|token|aws4-hmac-sha256"
_QUOTED = r"'(?:[^'\\\n]|\\.){0,4096}'|\"(?:[^\"\\\n]|\\.){0,4096}\""
_CARD = r"[0-9](?:[ -]?[0-9]){12,18}(?![0-9])"  # 13-19 digits, maybe in groups
# a PEM block (a private key): the whole block, its body included
_PEM = r"-----BEGIN [A-Z0-9 ]{1,40}-----[A-Za-z0-9+/=\s]{0,16384}(?:-----END [A-Z0-9 ]{1,40}-----|\Z)"  # noqa: E501
_KNOWN_KEYS = (
    r"(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,247}|whsec_[0-9A-Za-z+/=]{24,256}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])|gh[pousr]_[0-9A-Za-z]{36,251}"
    r"|github_pat_[0-9A-Za-z_]{22,255}|xox[abpsr]-[0-9A-Za-z-]{10,250}"
    r"|AIza[0-9A-Za-z_-]{35}|glpat-[0-9A-Za-z_-]{20,255}"
    r"|SG\.[0-9A-Za-z_-]{16,64}\.[0-9A-Za-z_-]{16,64}"
    r"|sk-(?=[A-Za-z_-]{0,255}[0-9])[0-9A-Za-z_-]{20,255}"  # (a digit: not sk-learn-…)
)  # their anchors: anchored.KEY_PREFIXES
# a quoted value too long (or not closed) for _QUOTED: masked to the end of its line
_LONG_QUOTED = r"['\"][^\n]*"
# a value in brackets with none inside (a list, an object, a tuple: {"password": "x"}), and
# a call or a bytes literal (Secret('x'), b'x'): judged whole by the name before it, and
# scanned again for the pairs inside when that name is not sensitive. A value opening a
# bracket nested deeper is not taken for a plain value: the scan goes on inside it.
_FLAT = r"[\[{(][^\[\]{}()]{0,4096}[\]})]"
_CALL = r"[A-Za-z_][A-Za-z0-9_.]{0,63}\([^()]{0,4096}\)"
_BYTES = rf"[bBrRuU]{{1,2}}(?:{_QUOTED})"

#: a name in quotes ("password", "db:password", "user[password]") and a bare one
_QUOTED_NAME = r"[A-Za-z0-9_.\- :/\[\]]{1,64}"
_BARE_NAME = r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}"

# Leftmost match first; each repetition bounded, so the scan stays linear on any input.
# Tried only near an anchor (anchored.py): a new alternative must contain one of them.
def _compiled(spaced: str) -> re.Pattern[str]:
    return re.compile(
        # an Authorization header (its scheme kept)
        rf"(?P<header>(?<![A-Za-z0-9_-])(?:proxy-)?authorization[\"']?\s{{0,8}}[:=]\s{{0,8}}[\"']?)"
        rf"(?:(?P<scheme>(?:{_SCHEMES}))(?P<gap>\s{{1,8}}))?(?P<credentials>[^\s\"',;&]+)"
        # a bearer token anywhere
        rf"|(?P<bearer>(?<![A-Za-z0-9_-])bearer\s{{1,8}})(?![A-Za-z_][A-Za-z0-9_-]{{0,63}}=\")"
        rf"(?P<bearer_token>{_TOKEN})"
        # the password of a URL: scheme://user:password@host
        r"|(?P<url>[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s:/?#@]{0,256}:)(?P<password>[^\s/?#]{0,512})(?=@)"
        # a JWT: header.payload.signature, base64url, the header a JSON object
        r"|(?<![A-Za-z0-9_-])(?P<jwt>eyJ[A-Za-z0-9_-]{2,8192}(?:\.[A-Za-z0-9_-]{2,65536}(?:\.[A-Za-z0-9_-]{0,8192}|\Z)|\Z))"
        rf"|(?P<pem>{_PEM})"
        # an API key whose form says what it is (Stripe, AWS, GitHub, Slack, Google, GitLab,
        # SendGrid, OpenAI): in exactly this case, whatever its name; whole, and not a name
        rf"|(?<![A-Za-z0-9_-])(?P<known>(?-i:{_KNOWN_KEYS}))(?![A-Za-z0-9_-]|\s{{0,8}}(?:[=:]|%3d))"
        # <password>value</password> (XML, SOAP; with attributes too)
        r"|(?P<xname><(?P<xkey>[A-Za-z_][A-Za-z0-9_.:\-]{0,63})(?:\s[^<>\n]{0,256})?>)"
        r"(?P<xvalue><!\[CDATA\[(?:[^\]]|\](?!\]>)){0,4096}\]\]>|[^<\n]{1,4096})(?=</(?P=xkey)>)"
        # a card number: 13-19 digits, spaced or dashed in groups (the Luhn check decides)
        rf"|(?<![0-9])(?P<pan>{_CARD})"
        # '--name', 'value': a command line quoted in text (subprocess.CalledProcessError);
        # 'name', 'value': a pair (a header list's ('Authorization', '…'), an error's args)
        # (a pair's value is not a flag: '-v', '--password', 'x' is a flag and its value)
        rf"|(?P<fname>(?P<fq>['\"])(?P<fdash>-{{1,2}})?(?P<fkey>{_BARE_NAME})(?P=fq),\s{{0,8}})"
        rf"(?(fdash)|(?!['\"]-))(?P<fvalue>{_QUOTED})"
        # 'name': value / "name": value (reprs, JSON; 'name' => value: PHP, Ruby)
        # (a name with a path or an index: "db:password", "user[password]"; inside a JSON
        # string, its quotes escaped: \"password\": \"…\")
        rf"|(?P<qname>(?P<q>['\"])(?P<qkey>{_QUOTED_NAME})\\?(?P=q)"
        r"\s{0,8}(?::|=>)\s{0,8})"
        rf"(?P<qvalue>{_QUOTED}|{_LONG_QUOTED}|{_CARD}|{_FLAT}|{_CALL}|{_BYTES}"
        r"|(?![\[{(])[^\s,}\]]+)"
        # name=value, name: value (libpq DSNs, query strings, keyword reprs, --flags, headers)
        # (after a URL-encoded separator too: %26 &, %3F ?)
        r"|(?P<kname>(?:(?<![A-Za-z0-9_.\-<])(?<!</)|(?<=%26)|(?<=%3f))"
        rf"(?P<key>-{{0,2}}{_BARE_NAME}"
        r"|[A-Za-z_][A-Za-z0-9_]{0,24}\[[A-Za-z0-9_.\-]{1,24}\])"  # user[password]= (a form)
        r"\s{0,8}(?:[=:]|%3d)\s{0,8})"
        # (the value may start with an auth scheme: token=Bearer <token>; never with a name
        # and a colon and a space, which start a pair of their own: "ValueError: password:
        # x" — in the second pass (SPACED), a name and a spaced separator either: "FATAL:
        # password = x"; nor with a pair whose value starts with an auth scheme: "Error:
        # Authorization=Basic x". "password=dGVzdA==", "key=v1:abc" are values; a value
        # is taken whole, however long: its tail is never shown)
        r"(?!(?:[A-Za-z_][A-Za-z0-9_.\-]{0,63}(?::(?:\s|\Z)" + spaced + ")"
        rf"|[A-Za-z_][A-Za-z0-9_.\-]{{0,63}}\s{{0,8}}(?:[=:]|%3d)\s{{0,8}}(?:{_SCHEMES})\s"
        r"|['\"][A-Za-z0-9_.\- ]{1,64}['\"]\s{0,8}:))"
        rf"(?P<kvalue>{_PEM}|{_QUOTED}|{_LONG_QUOTED}|{_CARD}|{_FLAT}|{_CALL}|{_BYTES}"
        rf"|(?:(?:{_SCHEMES})\s{{1,8}}(?![A-Za-z_][A-Za-z0-9_.\-]{{0,63}}[=:]))?(?![\[{{(])[^\s&,;)\]}}'\"]+)",
        re.IGNORECASE,
    )


SECRETS = _compiled("")
#: The pattern for a second pass over text the first left with a name, spaces and a
#: separator in it ("Error: password = x"): a value is never such a name there (in the
#: first pass, "password=x : failed" keeps x the value of password). Run only where
#: :data:`SPACED_HINT` finds one.
SPACED = _compiled(r"|\s{1,8}(?:[=:]|%3d)")
SPACED_HINT = re.compile(r"[A-Za-z0-9_.\-]\s{1,8}(?:[=:]|%3d)", re.IGNORECASE)
#: what follows a value that is the name of a pair of its own ("auth: secret = x")
SPACED_AFTER = re.compile(r"\s{1,8}(?:[=:]|%3d)", re.IGNORECASE)


def luhn(number: str) -> bool:
    digits = [int(c) for c in reversed(number) if c.isdigit()]
    total = sum(d if i % 2 == 0 else (d * 2 - 9 if d > 4 else d * 2) for i, d in enumerate(digits))
    return total % 10 == 0


#: a value opening a bracket after a pair's ``:`` or ``=`` (a call's name first, maybe)
_OPENS = re.compile(r"[:=][ \t]{0,8}(?:[A-Za-z_][A-Za-z0-9_.]{0,63})?[\[{(]")
_QUOTED_NAME_RE = re.compile(_QUOTED_NAME)
_BARE_NAME_RE = re.compile(_BARE_NAME)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_SPECIAL = re.compile(r"[()\[\]{}'\"\n]")
NESTED_MAX = 65536  # the farthest a nested value is followed; past it, to its line's end


def nested_values(text: str, chosen: Callable[[str], bool]) -> Iterator[tuple[int, int]]:
    """Where each value in brackets (a list, an object, a call: nested at any depth)
    given to a ``chosen`` name in ``text`` (``"name": {…}``, ``name=Call(…)``) starts
    and ends (balanced brackets, quotes skipped; one not closed within
    :data:`NESTED_MAX` ends with its line). In order, not overlapping."""
    if "[" not in text and "{" not in text and "(" not in text:
        return
    done = 0
    for opened in _OPENS.finditer(text):
        if opened.start() < done:
            continue
        name = _name_before(text, opened.start())
        if name is None or not chosen(name):
            continue
        gap = text[opened.start() + 1 : opened.end()]
        start = opened.start() + 1 + len(gap) - len(gap.lstrip(" \t"))
        done = _balanced_end(text, opened.end() - 1)
        yield start, done


def _name_before(text: str, at: int) -> str | None:
    """The name just before the ``:`` or ``=`` at ``at``: quoted (JSON, a repr) or bare
    (a keyword argument, YAML); None when there is none."""
    end = at
    while end > 0 and text[end - 1] in " \t" and at - end < 8:
        end -= 1
    if end == 0:
        return None
    if text[end - 1] in "'\"":
        opening = text.rfind(text[end - 1], max(0, end - 66), end - 1)
        name = text[opening + 1 : end - 1]
        return name if opening >= 0 and _QUOTED_NAME_RE.fullmatch(name) else None
    start = end
    while start > 0 and end - start < 64 and text[start - 1] in _NAME_CHARS:
        start -= 1
    name = text[start:end]
    return name if _BARE_NAME_RE.fullmatch(name) else None


def _balanced_end(text: str, at: int) -> int:
    """Where the bracket at ``at`` closes (after it), quotes skipped; else its line's end."""
    depth, quote, limit = 0, "", min(len(text), at + NESTED_MAX)
    for found in _SPECIAL.finditer(text, at, limit):
        c = found.group()
        if c == "\n" and quote:
            quote = ""  # a quote is not left open past its line (an apostrophe in prose)
        elif quote:
            if c == quote and text[found.start() - 1] != "\\":
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c != "\n":  # ) ] }
            depth -= 1
            if depth == 0:
                return found.end()
    line_end = text.find("\n", at)
    return len(text) if line_end < 0 else line_end
