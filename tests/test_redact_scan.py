"""How much text redaction scans: only near the characters a secret needs
(``celery_grousset.anchored``), and only as far as can be shown (``SCAN_MARGIN``).
Both are held to the plain single pass: the same output on generated text."""

from __future__ import annotations

import random
import re

import pytest

from celery_grousset import anchored, redact
from celery_grousset.redact import DEFAULT_REDACT_KEYS, SCAN_MARGIN, safe_repr

RULES = redact._rules_for(DEFAULT_REDACT_KEYS)
#: pieces of every secret form and every anchor, and ordinary text between them
PIECES = [
    "password", "token", "api_key", "note", "x", "Name", "key", "-", "--", "_", ".", " ",
    "  ", "\t", "\n", "=", ":", "%3d", "'", '"', ",", ";", "&", "{", "}", "[", "]", "(",
    ")", "<", ">", "</", "<pin>", "</pin>", "<note>", "</note>", "4111", "1111", " 1111",
    "-1111", "42", "7", "eyJhbGciOiJIUzI1NiJ9", "eyJ", "EYJ", "Bearer ", "bearer\t",
    "Authorization: ", "proxy-authorization=", "Basic ", "https://", "://", "u:p@h", "@",
    "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----", "-----BEGıN ",  # noqa: RUF001
    "MIIEow", "abc/+=", "İ", "ſ", "K", "é", "ü", "a" * 63, " " * 8, "KeyError: ",  # noqa: RUF001
    # the farthest an anchor lies from a match's start: a long name, then its separator
    "--password" + "p" * 56 + " " * 8 + "=", "'token" + "s" * 59 + "'" + " " * 8 + ":",
    "c" + "h" * 30 + "://u:pw@h", "proxy-authorization" + " " * 8 + ":",
    # API keys of a known form, their prefixes in other cases, and near-misses
    "sk_live_", "SK_LIVE_", "sk_test_", "rk_", "whsec_", "AKIA", "akia", "ASIA", "ghp_",
    "GHP_", "github_pat_", "xoxb-", "XOXB-", "AIza", "glpat-", "SG.", "sk-", "sk-proj-",
    "ABCDEFGHIJKLMNOP", "0123456789abcdefghij", "Zz9_-", "\u017fk_live_", "\u212aey",
]  # fmt: skip


def generated(rng: random.Random, count: int) -> list[str]:
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 120))) for _ in range(count)]


def both(text: str) -> tuple[str, str]:
    repl = redact._replacer(RULES, 0)
    return anchored.sub(redact._SECRETS, repl, text), redact._SECRETS.sub(repl, text)


@pytest.mark.parametrize("dense", [anchored.DENSE, 0], ids=["as-shipped", "windows-always"])
def test_anchored_scan_gives_exactly_the_single_pass(
    dense: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(anchored, "DENSE", dense)
    # Given generated text full of secret forms, near-misses and anchors, and the
    # farthest an anchor can lie from a match's start (a 64-character name, 8 spaces)
    texts = generated(random.Random(20261203), 4000)
    texts += [
        "x " * 40 + "-" * 2 + "p" * 64 + " " * 8 + "=hunter2 " + "y " * 100,
        "z " * 60 + "'" + "s" * 64 + "'" + " " * 8 + ": 'v' " + "w " * 90,
        "q " * 50 + "a" * 31 + "://user:pw@host " + "r " * 90,
        "plain words only, " * 30,
        "y " * 100 + "sk-----BEGIN X-----abc",  # overlapping anchors (sk- and -----beg)
    ]
    for text in texts:
        # Then the anchored scan gives what one pass over the whole text gives
        fast, whole = both(text)
        assert fast == whole, text


def test_the_generated_text_reaches_the_anchor_distance(monkeypatch: pytest.MonkeyPatch) -> None:
    # The differential test above can fail: with windows one character shorter than the
    # farthest a match's start can lie from its anchor, the anchored scan misses matches
    monkeypatch.setattr(anchored, "BACK", 73)
    monkeypatch.setattr(anchored, "DENSE", 0)  # windows even on dense text
    texts = generated(random.Random(20261203), 4000)
    assert any(fast != whole for fast, whole in map(both, texts))


def test_text_without_anchors_is_not_scanned(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an argument with none of the characters a secret needs
    tried: list[int] = []
    real = redact._SECRETS

    class Spy:
        def match(self, text: str, at: int) -> re.Match[str] | None:
            tried.append(at)
            return real.match(text, at)

        def sub(self, repl: object, text: str) -> str:
            tried.extend(range(len(text)))
            return real.sub(repl, text)  # type: ignore[arg-type]

    monkeypatch.setattr(redact, "_SECRETS", Spy())
    # When it is rendered / Then the pattern is tried at no position
    assert safe_repr(("a customer from example dot com, " * 20,), {}) .startswith("'a customer")
    assert tried == []
    # ... while a secret is still found where its anchor is
    assert "hunter2" not in safe_repr(("x " * 300 + "password=hunter2",), {}, max_length=5000)
    assert 0 < len(tried) <= anchored.BACK + 1


def test_only_what_can_be_shown_is_scanned(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a 1 MB argument and a 100-character args_repr
    seen: list[int] = []
    real = anchored.sub
    monkeypatch.setattr(
        anchored, "sub", lambda p, r, text: seen.append(len(text)) or real(p, r, text)
    )
    text = safe_repr(("word " * 200_000,), {}, max_length=100)
    # Then redaction scans the shown part and its margin, not the megabyte
    assert seen == [100 + SCAN_MARGIN]
    # ... and the cut still says how much was left out, the whole argument counted
    dropped = int(re.search(r"…\(\+(\d+) chars\)$", text)[1])  # type: ignore[index]
    assert len(text) <= 100 and 999_900 <= dropped <= 1_000_002


def test_several_arguments_share_the_scan_budget() -> None:
    # Given many long arguments: once the shown part is full, later ones are not read
    shown = safe_repr(tuple("v" * 3000 for _ in range(50)), {}, max_length=200)
    # Then the first is scanned into the margin, counted, and the cut says there is more
    dropped = int(re.search(r"…\(\+(\d+) chars and more\)$", shown)[1])  # type: ignore[index]
    assert len(shown) <= 200 and shown.startswith("'vvv") and 2_800 <= dropped <= 3_002


@pytest.mark.parametrize("kind", [set, frozenset])
def test_a_big_set_is_rendered_only_as_far_as_it_is_shown(
    kind: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a set of 50,000 strings
    value = kind(f"item-{i}" for i in range(50_000))
    whole = safe_repr((value,), {}, max_length=10**7)
    lengths: list[int] = []
    real = redact._plain_repr
    monkeypatch.setattr(redact, "_plain_repr", lambda v: lengths.append(len(t := real(v))) or t)
    shown = safe_repr((value,), {}, max_length=300)
    # Then no repr of the whole set is made, only of the items shown
    assert max(lengths) < 100 and len(lengths) < 1_000, (max(lengths), len(lengths))
    head, marker = shown.split("…(+")
    assert whole.startswith(head) and marker.endswith(" chars and more)"), shown
    assert whole == repr(value)  # rendered as repr renders it


ORDERS = [{"sku": f"SKU-{i}", "password": "pw-secret-9", "qty": i} for i in range(20_000)]


@pytest.mark.parametrize(
    "args",
    [
        (list(range(100_000)),),
        ({f"k{i}": [i, "text", {"x": i}] for i in range(30_000)},),
        (ORDERS,),
        ([b"\x00" * 40_000, frozenset(range(5))] * 50,),
        (*range(50_000),),
    ],
    ids=["ints", "mapping", "orders", "bytes", "positional"],
)
def test_a_big_argument_is_rendered_only_as_far_as_it_is_shown(
    args: tuple[object, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an argument (or arguments) of tens of thousands of items
    whole = safe_repr(args, {}, max_length=10**7)
    rendered: list[object] = []
    real = redact._Renderer.render
    monkeypatch.setattr(
        redact._Renderer, "render", lambda self, v, d=0: rendered.append(v) or real(self, v, d)
    )
    shown = safe_repr(args, {}, max_length=300)
    # Then only the items the shown part and its margin reach are rendered, not them all
    assert len(rendered) < 1_000, len(rendered)
    # ... and what is shown is the whole rendering's start, cut with a marker saying so
    head, marker = shown.split("…(+")
    assert whole.startswith(head) and len(head) > 200, shown
    assert len(shown) <= 300 and marker.endswith(" chars and more)"), shown
    assert "pw-secret-9" not in shown


@pytest.mark.parametrize(
    "secret",
    [
        "-----BEGIN RSA PRIVATE KEY-----\n" + "MIIEowIBAAKCAQEA" * 600,  # END past the cut
        "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxIn0" * 3000 + ".c2ln",  # a JWT past the cut
        "token='" + "s3cr3t" * 5000 + "'",  # a quoted value closing past the cut
    ],
    ids=["pem", "jwt", "quoted"],
)
def test_a_secret_running_past_the_cut_is_masked(secret: str) -> None:
    # Given a secret that starts in the shown part and ends past the scanned margin
    shown = safe_repr(("intro " + secret,), {}, max_length=300)
    # Then none of its body is shown
    assert "MIIEow" not in shown and "eyJzdWIi" not in shown and "s3cr3t" not in shown, shown
    assert "***" in shown


def test_a_secret_masked_early_does_not_hide_the_arguments_after_it() -> None:
    # Given a long secret value (masked to ***) followed by more text and another argument
    shown = safe_repr(("token=" + "x" * 5000 + " user=alice", "second-arg"), {}, max_length=100)
    # Then what follows it is shown as it is, not cut away or emptied
    assert shown == "'token=*** user=alice', 'second-arg'"


def test_a_secret_after_a_long_masked_one_is_still_recognised() -> None:
    # Given a card number and a password after a 5,000-character token (the token's ***
    # brings them into the shown part)
    shown = safe_repr(("token=" + "x" * 5000 + " pw=hunter2 4111 1111 1111 1111 end",), {},
                      max_length=100)  # fmt: skip
    # Then they are masked, as one pass over the whole text masks them
    assert shown == "'token=*** pw=*** *** end'"


def test_a_jwt_cut_in_its_first_segment_is_masked() -> None:
    shown = safe_repr(("x " + "eyJ" + "A" * 5000 + ".eyJzdWIiOiIxIn0.c2ln",), {}, max_length=60)
    assert "AAAA" not in shown and "***" in shown, shown


def test_the_bounded_scan_shows_what_the_whole_scan_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given arguments with long secret values (masked to ***) among ordinary text
    rng = random.Random(3)
    long_pieces = [*PIECES, "token=" + "x" * 3000, "'" + "q" * 6000 + "'", "a" * 2000,
                   "password=" + "p" * 9000 + " ", "<pin>" + "9" * 5000 + "</pin>"]  # fmt: skip
    calls = [tuple("".join(rng.choice(long_pieces) for _ in range(rng.randint(1, 12)))
                   for _ in range(rng.randint(1, 3))) for _ in range(300)]  # fmt: skip
    bounded = [safe_repr(args, {}, max_length=200) for args in calls]
    # When the same are rendered scanning every character
    monkeypatch.setattr(redact, "SCAN_MARGIN", 10**9)
    whole = [safe_repr(args, {}, max_length=200) for args in calls]
    # Then the shown text is the same (the quote that repr() picks for a string it saw
    # whole or cut aside, with the escapes it brings: compared up to 150 of 200 chars)
    def same(text: str) -> str:
        return text.replace("\\'", "'").replace('"', "'")[:150]

    assert [same(t) for t in bounded] == [same(t) for t in whole]
