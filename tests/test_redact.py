"""Tests of the redacted argument rendering stored in the journal and shown in the admin."""

from __future__ import annotations

import dataclasses
import json
from collections import namedtuple
from collections.abc import Iterator, Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_grousset.redact import DEFAULT_REDACT_KEYS, REDACTED, is_sensitive, safe_repr

SECRET = "hunter2"


def test_password_kwarg_is_redacted() -> None:
    # Given a task called with password= as a keyword argument
    # When its arguments are rendered
    text = safe_repr((42,), {"user": "bob", "password": SECRET})
    # Then the password is masked and the rest is shown
    assert SECRET not in text
    assert text == "42, user='bob', password='***'"


def test_positional_password_is_redacted_when_bound() -> None:
    # Given a task called positionally, with its arguments bound by name
    args = ("bob", SECRET)
    bound = {"user": "bob", "password": SECRET}
    # When rendered with the bound arguments
    text = safe_repr(args, {}, bound=bound)
    # Then the positional password is masked, rendered as name=value
    assert SECRET not in text
    assert text == "user='bob', password='***'"


def test_password_nested_in_a_dict_is_redacted() -> None:
    # Given a password inside a dict argument, positional and keyword
    payload = {"login": {"user": "bob", "password": SECRET}, "n": 1}
    # When rendered
    text = safe_repr((payload,), {"payload": payload})
    # Then it is masked at every depth
    assert SECRET not in text
    assert "{'login': {'user': 'bob', 'password': '***'}, 'n': 1}" in text


def test_password_in_a_list_of_dicts_is_redacted() -> None:
    # Given passwords inside a list of dicts, inside a tuple
    accounts = [{"user": "a", "password": SECRET}, {"user": "b", "Password": SECRET + "!"}]
    # When rendered
    text = safe_repr(((accounts,),), {})
    # Then every one is masked
    assert SECRET not in text
    assert text == "([{'user': 'a', 'password': '***'}, {'user': 'b', 'Password': '***'}],)"


def test_sensitive_container_is_masked_whole() -> None:
    # Given a sensitive key whose value is a container of secrets
    credentials = {"credentials": {"user": "bob", "pin": SECRET}}
    # When rendered
    text = safe_repr((credentials,), {})
    # Then the whole container is masked
    assert SECRET not in text
    assert text == "{'credentials': '***'}"


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "PASSWORD",
        "user_password",
        "userPassword",
        "x-api-key",
        "X-Api-Key",
        "XApiKey",
        "HTTP_AUTHORIZATION",
        "clientSecret",
        "auth",
        "auth_header",
        "card_pan",
        "cardNumber",
        "cardnumber",
        "privatekey",
        "cardPan",
        "stripe.token",
        "iban",
        "user ssn",
    ],
)
def test_sensitive_names(name: str) -> None:
    # Given a name that contains a redact key once normalised
    # When it is checked
    sensitive = is_sensitive(name)
    # Then it is sensitive, and its value is masked
    assert sensitive
    assert SECRET not in safe_repr((), {name: SECRET})


@pytest.mark.parametrize("name", ["company", "discard", "expand", "author_name", "user", "amount"])
def test_harmless_names_that_contain_short_keys_are_shown(name: str) -> None:
    # Given a name that merely contains a short redact key ("pan", "card", "auth")
    # When it is checked
    sensitive = is_sensitive(name)
    # Then it is not redacted: short keys must match a whole word
    assert not sensitive
    assert "ACME" in safe_repr((), {name: "ACME"})


def test_custom_redact_keys_replace_the_defaults() -> None:
    # Given custom redact keys
    keys = frozenset({"pin", "mother_maiden_name"})
    # When rendering
    text = safe_repr(
        (), {"card_pin": "1234", "motherMaidenName": "X", "password": "p"}, redact_keys=keys
    )
    # Then only the custom keys are masked
    assert text == "card_pin='***', motherMaidenName='***', password='p'"
    assert "password" in DEFAULT_REDACT_KEYS and REDACTED == "'***'"


def test_dataclass_and_namedtuple_fields_are_redacted_by_name() -> None:
    # Given a dataclass and a namedtuple with sensitive fields
    @dataclasses.dataclass
    class Login:
        user: str
        password: str
        otp: str = dataclasses.field(default="", repr=False)

    Key = namedtuple("Key", "name api_key")
    # When rendered
    text = safe_repr((Login("bob", SECRET, "999999"), Key("k", SECRET)), {})
    # Then field names are shown, sensitive values and repr=False fields are not
    assert SECRET not in text and "999999" not in text
    assert text.endswith("Login(user='bob', password='***'), Key(name='k', api_key='***')")


def test_producer_reprs_are_used_never_the_raw_values() -> None:
    # Given raw values with a secret, and the reprs the producer chose to show
    args = (SECRET,)
    kwargs = {"token": SECRET}
    # When rendered with Celery's argsrepr/kwargsrepr
    text = safe_repr(args, kwargs, argsrepr="('<hidden>',)", kwargsrepr="{'token': '<hidden>'}")
    # Then those reprs are used (through redact_text: a sensitive name's value is masked)
    assert text == "args=('<hidden>',), kwargs={'token': '***'}"
    assert SECRET not in text


def test_a_missing_producer_repr_half_is_rendered_redacted() -> None:
    # Given only argsrepr from the producer
    # When rendered
    text = safe_repr((SECRET,), {"password": SECRET, "n": 1}, argsrepr="(...)")
    # Then the other half is rendered from the values, redacted
    assert text == "args=(...), kwargs={'password': '***', 'n': 1}"


def test_long_text_is_truncated_with_an_exact_marker() -> None:
    # Given arguments whose rendering is 2002 characters ('x' * 2000, quoted)
    value = "x" * 2000
    # When rendered with the default and a small max_length
    text = safe_repr((value,), {})
    short = safe_repr((value,), {}, max_length=50)
    # Then the text fits, and the marker counts exactly what was cut
    assert len(text) == 1024 and text.endswith("…(+991 chars)")
    assert len(text) - len("…(+991 chars)") + 991 == 2002
    assert len(short) == 50 and short.startswith("'xxx") and short.endswith("…(+1966 chars)")


def test_short_text_is_not_truncated() -> None:
    # Given text exactly max_length long
    # When rendered
    text = safe_repr(("abc",), {}, max_length=5)
    # Then it is kept whole
    assert text == "'abc'"


def test_producer_reprs_are_truncated_and_nul_free() -> None:
    # Given producer reprs with NUL characters and too much text
    # When rendered
    text = safe_repr((), {}, argsrepr="(\x00" + "a" * 100 + ")", kwargsrepr="{}", max_length=40)
    # Then NULs are gone and the length is bounded
    assert "\x00" not in text
    assert len(text) == 40 and "…(+" in text


def test_nul_and_lone_surrogates_never_reach_the_database() -> None:
    # Given objects whose repr contains a NUL and a lone surrogate
    class Weird:
        def __repr__(self) -> str:
            return "W\x00\ud800W"

    # When rendered
    text = safe_repr((Weird(),), {})
    # Then the text is NUL-free and valid UTF-8
    assert "\x00" not in text
    assert text.encode("utf-8") == b"W\\ud800W"


def test_unrepresentable_objects_do_not_raise() -> None:
    # Given an object whose __repr__ raises
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("boom")

    # When rendered
    text = safe_repr((Broken(), 1), {"x": Broken()})
    # Then it is named, not raised
    assert text == "<unrepresentable Broken>, 1, x=<unrepresentable Broken>"


def test_broken_containers_and_mappings_do_not_raise() -> None:
    # Given a mapping whose iteration raises, as an argument and as kwargs
    class BadMapping(Mapping[str, object]):
        def __getitem__(self, key: str) -> object:
            raise KeyError(key)

        def __iter__(self) -> Iterator[str]:
            raise RuntimeError("boom")

        def __len__(self) -> int:
            return 1

    # When rendered
    inner = safe_repr((BadMapping(),), {})
    outer = safe_repr((), BadMapping())
    # Then neither raises; both say what could not be shown
    assert inner == "<unrepresentable BadMapping>"
    assert outer.startswith("<arguments could not be rendered")


def test_self_referencing_structures_render_finitely() -> None:
    # Given a list and a dict that contain themselves
    loop: list[object] = [1]
    loop.append(loop)
    cycle: dict[str, object] = {"a": 1}
    cycle["self"] = cycle
    # When rendered
    text = safe_repr((loop, cycle), {})
    # Then the self references are marked, not followed
    assert text == "[1, <recursion>], {'a': 1, 'self': <recursion>}"


def test_deep_nesting_is_cut() -> None:
    # Given 50 nested lists around a secret-free value
    deep: list[object] = [0]
    for _ in range(50):
        deep = [deep]
    # When rendered
    text = safe_repr((deep,), {})
    # Then rendering stops at the depth cap
    assert "…" in text and "0" not in text


def test_shared_sub_structures_are_not_mistaken_for_cycles() -> None:
    # Given the same dict referenced twice (not a cycle)
    shared = {"password": SECRET}
    # When rendered
    text = safe_repr(([shared, shared],), {})
    # Then both occurrences are rendered (and redacted)
    assert text == "[{'password': '***'}, {'password': '***'}]"


# -- names by normalised parts, and values that look like secrets (issue 16, defect 13) ----


@pytest.mark.parametrize(
    "name",
    [
        "pwd",
        "db_pwd",
        "passphrase",
        "stripe_key",
        "encryption_key",
        "accessKey",
        "AWS_SECRET_ACCESS_KEY",
        "key",
        "keys",
        "cookie",
        "Set-Cookie",
        "cookies",
        "session_id",
        "sessionId",
        "SESSIONID",
        "jwt",
        "id_jwt",
        "otp",
        "otp_code",
        "totp",
        "pin",
        "PIN",
        "pin_code",
        "PINCode",
        "userPIN",
        "pin2",
        "bearer",
        "bearer_token",
        "dsn",
        "sentry_dsn",
        "DATABASE_DSN",
        "x-auth-token",
        "credential",
        "webhook_signature",
        "X-Amz-Signature",
        "sig",
        "hmac",
        "bank_account_number",
        "routing_number",
        "creds",
        "privkey",
        "aws_cred",
        "oauth",
        "OAuthClientSecret",
        "oauth_verifier",
        "Authorisation",
        "proxy-authorisation",
    ],
)
def test_more_sensitive_names(name: str) -> None:
    # Given a common secret name that the built-in list used to miss
    # When it is checked / Then it is sensitive and its value is masked
    assert is_sensitive(name), name
    assert SECRET not in safe_repr((), {name: SECRET})


@pytest.mark.parametrize(
    "name",
    [
        "pinned",
        "spinner",
        "keyboard_layout",
        "keyboard",
        "monkey",
        "turnkey_solution",
        "pinnacle",
        "hotpot",
        "cookbook",
        "session_count",
        "dsnake",
        "opinion",
        "bearing",
        "company",
        "order_id",
        "credit_limit",
        "incredible",
    ],
)
def test_harmless_names_that_contain_sensitive_words_are_shown(name: str) -> None:
    # Given a name in which a short sensitive word is only part of a longer word
    # When it is checked / Then it is shown: short words must be a whole name part
    assert not is_sensitive(name), name
    assert "ACME" in safe_repr((), {name: "ACME"})


JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
    "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # bearer tokens and Authorization headers
        ("Authorization: Bearer abc.def-123", "Authorization: Bearer ***"),
        ("authorization=Basic dXNlcjpwYXNz", "authorization=Basic ***"),
        ("Authorization: Basic dXNlcjpwYXNz extra", "Authorization: Basic *** extra"),
        ("Authorization: abcdef123456", "Authorization: ***"),
        ("401 for bearer eyJ0eXAi.x.y now", "401 for bearer *** now"),
        ("Proxy-Authorization: Digest abc", "Proxy-Authorization: Digest ***"),
        # URLs and DSNs with a password
        ("postgres://user:pass@host:5432/db", "postgres://user:***@host:5432/db"),
        ("could not connect to redis://:s3cret@cache:6379/0!", "could not connect to redis://:***@cache:6379/0!"),
        ("amqp://guest:p@ss@rabbit//", "amqp://guest:***@rabbit//"),
        ("mysql+pymysql://root:hunter2@db/x?charset=utf8", "mysql+pymysql://root:***@db/x?charset=utf8"),
        ("https://example.com/path?x=1", "https://example.com/path?x=1"),
        ("https://user@example.com/", "https://user@example.com/"),
        # JWTs
        (f"token {JWT} rejected", "token *** rejected"),
        (JWT, "***"),
        # name=value pairs whose name is sensitive (libpq DSNs, query strings, reprs)
        ("host=db password=hunter2 user=bob", "host=db password=*** user=bob"),
        ("https://api.test/v1?api_key=abc123&page=2", "https://api.test/v1?api_key=***&page=2"),
        (
            "failed for {'user': 'bob', 'password': 'hunter2'}",
            "failed for {'user': 'bob', 'password': '***'}",
        ),
        ('{"pin": 1234, "n": 1}', '{"pin": ***, "n": 1}'),
        # API keys of a known form, whatever their name (and none in ordinary words)
        ("stripe=sk_live_51HxYzAbCdEfGhIjKlMn ok", "stripe=*** ok"),
        ("{'provider': 'rk_test_4eC39HqLyjWDarjtT1zdp7dc'}", "{'provider': '***'}"),
        ("aws AKIAIOSFODNN7EXAMPLE here", "aws *** here"),
        ("gh ghp_abcdefghijklmnopqrstuvwxyz0123456789 x", "gh *** x"),
        ("slack xoxb-1234567890-abcdefghij", "slack ***"),
        ("maps AIzaSyA1234567890abcdefghijklmnopqrstuv ok", "maps *** ok"),
        ("openai sk-proj-abcdefghij0123456789KLMN", "openai ***"),
        *[(text, text) for text in ["mask-the-disk-sk-queue ASIAN market task_live_x",
                                    "xoxo-hugs-and-kisses", "sk-learn-tutorial-classification"]],
        # ... and a name that starts like one is a name: its value is what is masked
        ("xoxb-bot-token-secret=hunter2", "xoxb-bot-token-secret=***"),
        ("github_pat_token_for_ci_user_password=hunter2",
         "github_pat_token_for_ci_user_password=***"),
        # a pair right after another name and its separator (an exception's summary, a
        # label): the first is no pair of its own, the second's value is masked
        ("ValueError: password: hunter2", "ValueError: password: ***"),
        ("upstream said: token: tok777", "upstream said: token: ***"),
        ('E: "password": "x"', 'E: "password": "***"'),
        ("Error: api_key: abc123456xyz", "Error: api_key: ***"),
        ("note='Login problem: password: pw9'", "note='Login problem: password: ***'"),
        ("note: a=b time=12:30", "note: a=b time=12:30"),
        # ... while a value that holds '=' or ':' is still a value, masked whole
        ("password=dGVzdA==", "password=***"),
        ("api_key=abc123:xyz789 ok", "api_key=*** ok"),
        ("token=abc-def_ghi= secret=sha256:9f86d08", "token=*** secret=***"),
        ("session_id=v1:8f2a9c", "session_id=***"),
        ("?token=abcdef%3D%3D", "?token=***"),
        ("host=db password=pass=word", "host=db password=***"),
        ("Error: password=hunter2", "Error: password=***"),
        # harmless text is untouched
        ("KeyError: 'token'", "KeyError: 'token'"),
        ("ValueError: order 42 is not open", "ValueError: order 42 is not open"),
        ("celery_grousset.conf.seconds failed", "celery_grousset.conf.seconds failed"),
        ("version 1.2.3", "version 1.2.3"),
        ("", ""),
    ],
)
def test_redact_text(text: str, expected: str) -> None:
    from celery_grousset import redact

    # Given text that may carry a secret value / When redacted
    # Then the secret is gone, everything else is kept
    assert redact.redact_text(text) == expected


def test_string_arguments_that_look_like_secrets_are_redacted() -> None:
    # Given arguments under harmless names whose values carry secrets
    args = ("postgres://app:hunter2@db/prod", f"Bearer {JWT}")
    # When rendered
    text = safe_repr(args, {"header": f"Authorization: Basic {SECRET}"})
    # Then none of the secrets is shown
    assert SECRET not in text and JWT not in text and "hunter2" not in text
    assert "postgres://app:***@db/prod" in text


def test_producer_reprs_are_redacted_too() -> None:
    text = safe_repr((), {}, argsrepr="('postgres://a:hunter2@db/x',)", kwargsrepr="{}")
    assert "hunter2" not in text


def test_redact_text_is_linear_on_pathological_input() -> None:
    import time

    from celery_grousset import redact

    # Given long inputs made of what the patterns look for, without an end
    samples = [
        "a." * 100_000,
        "a=" * 100_000,
        "x://" + "u:" * 100_000,
        "eyJ" + "a" * 200_000,
        "bearer " * 50_000,
        "'password': " * 30_000,
    ]
    for sample in samples:
        t0 = time.perf_counter()
        redact.redact_text(sample)
        # Then each is redacted in well under a second
        assert time.perf_counter() - t0 < 1.0, sample[:20]


# -- secret values that the review found shown (each a case that leaked before) ------------


@pytest.mark.parametrize(
    ("text", "secret", "kept"),
    [
        ("DATABASE_URL=postgres://app:pw-7Q1x@db/x", "pw-7Q1x", "DATABASE_URL="),
        ("settings: postgres://app:pw-7Q1x@db/x", "pw-7Q1x", "@db/x"),
        ("Command '['mysqldump', '--password=DbPw_7Q', 'prod']' failed", "DbPw_7Q", "mysqldump"),
        ("password: hunter2-x next", "hunter2-x", "next"),
        ("X-Api-Key: xak_TUPLEHDR sent", "xak_TUPLEHDR", "sent"),
        ("card=4111 1111 1111 1111 declined", "1111 1111", "declined"),
        ("charge 4111-1111-1111-1111 declined", "4111", "declined"),
        ("password='" + "S" * 5000 + "' tail", "SSSS", "password="),
    ],
)
def test_redact_text_removes_secrets_written_in_other_forms(
    text: str, secret: str, kept: str
) -> None:
    from celery_grousset.redact import redact_text

    shown = redact_text(text)
    assert secret not in shown and kept in shown and "***" in shown, shown


@pytest.mark.parametrize(
    "text",
    ["KeyError: 'user_id'", "order 1234567890123456 failed", "http://host:8080/path",
     "error: connection refused at 12:30"],
)  # fmt: skip
def test_redact_text_leaves_ordinary_text(text: str) -> None:
    from celery_grousset.redact import redact_text

    # (an exception's summary, a number failing the Luhn check, a port, a time)
    assert redact_text(text) == text


def test_safe_repr_redacts_bytes_sets_pairs_objects_and_one_word_names() -> None:
    class Profile:  # a model whose repr names its fields (pydantic, attrs)
        def __repr__(self) -> str:
            return "Profile(email='a@b.c', password='ModelPw_123')"

    args = (b"password=BodyBytesPw&x=1", {"password=SetSecret"}, Profile(),
            [("Authorization", "Basic dXNlcjpw"), ("X-Api-Key", "xak_PAIR")])  # fmt: skip
    kwargs = {"creditcard": "4000-0566", "pincode": 4821, "user_pw": "pw-1a"}
    text = safe_repr(args, kwargs)
    for secret in ("BodyBytesPw", "SetSecret", "ModelPw_123", "dXNlcjpw", "xak_PAIR",
                   "4000-0566", "4821", "pw-1a"):  # fmt: skip
        assert secret not in text, (secret, text)
    assert "a@b.c" in text and "Authorization" in text and "x=1" in text


def test_secret_values_are_found_in_lists_and_deep_mappings() -> None:
    from celery_grousset.quoted import secret_values

    named = {"cards": ["4111111111111111"], "items": [{"password": "Pw-in-a-list"}],
             "a": {"b": {"c": {"d": {"e": {"token": "deep-token-5"}}}}},
             "note": 'say "hi"'}  # fmt: skip
    found = secret_values(named.items())
    assert {"4111111111111111", "Pw-in-a-list", "deep-token-5"} <= set(found)
    assert not any("hi" in value for value in found)


def test_secret_values_are_found_in_dataclass_and_namedtuple_fields() -> None:
    """A secret in a dataclass's field was shown nowhere by name, but an error message
    that quoted it kept it: the masking did not look inside such objects."""
    from celery_grousset.quoted import secret_values

    @dataclasses.dataclass
    class Creds:
        user: str
        password: str
        pin: str = dataclasses.field(repr=False, default="4821-hidden")

    Card = namedtuple("Card", "holder cvv")
    # Given the secrets inside a dataclass (one field its repr hides) and a namedtuple
    named = {"order": {"creds": Creds("bob", "DataclassSecretWW")},
             "card": Card("Bob", "cvv-7731")}  # fmt: skip
    # When the call's secret values are listed / Then all three are, the names are not
    found = set(secret_values(named.items()))
    assert {"DataclassSecretWW", "4821-hidden", "cvv-7731"} <= found, found
    assert not found & {"bob", "Bob"}


def test_a_namedtuple_pair_and_an_unset_dataclass_field_are_handled() -> None:
    """A review of the fields walk: a namedtuple pairing a secret name with its value was
    no longer masked (read by its fields, "name" and "value"), and a dataclass field never
    set (init=False) raised AttributeError out of the call's identity."""
    from celery_grousset.quoted import redacted_call, secret_values

    Setting = namedtuple("Setting", "name value")

    @dataclasses.dataclass
    class Lazy:
        user: str
        password: str
        cache: str = dataclasses.field(init=False, repr=False)

    # Given a (name, value) namedtuple and a dataclass with an unset field
    named = {"setting": Setting("api_key", "abcd1234pair"), "who": Lazy("bob", "LazyPw-991")}
    # When the call's secret values and its stored text are made / Then both secrets are
    # found and masked where quoted, and nothing raises
    assert {"abcd1234pair", "LazyPw-991"} <= set(secret_values(named.items()))
    text = redacted_call((), {"note": "abcd1234pair LazyPw-991", **named}, None,
                         DEFAULT_REDACT_KEYS, 1024)  # fmt: skip
    assert "abcd1234pair" not in text and "LazyPw-991" not in text, text


def test_a_secret_quoted_twice_escaped_is_masked() -> None:
    """A generated password with a quote or a backslash, quoted in an error as the repr
    of a JSON document, was left in clear (one level of escaping was covered)."""
    from celery_grousset.quoted import secret_values, without_values

    for secret, core in (('Hunter2PWsecretZQQ"x', "Hunter2PW"), ("b\\ck-Secret9", "Secret9")):
        values = secret_values([("password", secret)])
        # Given the secret as the repr of a JSON document, and as a JSON string of its repr
        for text in (repr(json.dumps({"p": secret})), json.dumps({"p": repr(secret)})):
            # When masked / Then none of it is left
            shown = without_values(text, values)
            assert core not in shown and "***" in shown, shown


def test_a_secret_with_a_lone_surrogate_is_masked_not_an_error() -> None:
    """Its URL-quoted forms raised UnicodeEncodeError (UTF-8, strict): the call it came
    in could not be redacted, so not run (a review)."""
    from celery_grousset.quoted import secret_values, without_values

    secret = "\ud800Hunter2-secret-55"
    values = secret_values([("password", secret)])
    assert without_values(f"login failed for {secret}!", values) == "login failed for ***!"


def test_a_key_equal_to_a_sensitive_name_does_not_hide_the_real_one() -> None:
    from celery_grousset.quoted import secret_values

    class Alike:  # equal to every str, its hash that of "password"
        __hash__ = staticmethod(lambda: hash("password"))  # type: ignore[assignment]
        __eq__ = staticmethod(lambda other: True)  # type: ignore[assignment]

    class Folded(str):  # a case-insensitive name: "PASSWORD" equals it, as a key
        __hash__ = lambda self: hash(self.lower())  # type: ignore[assignment]  # noqa: E731
        __eq__ = lambda self, other: str(self).lower() == str(other).lower()  # type: ignore[assignment]  # noqa: E731

    # Given a look-alike key met first, then a real sensitive key, in one call
    named = [("meta", {Alike(): "x", Folded("MonKey"): "y"}),
             ("cfg", {"password": "hunter2secret", "monkey": 1})]  # fmt: skip
    # Then the real key's value is still found (masked where another argument quotes it)
    assert "hunter2secret" in secret_values(named)


def test_a_long_unquoted_secret_is_masked_whole() -> None:
    from celery_grousset.redact import redact_text

    # Given a token far longer than a line (a SAML assertion, a pasted key)
    shown = redact_text("password=" + "T" * 9000 + " tail")
    # Then none of it is left, and what follows is
    assert shown == "password=*** tail"


@pytest.mark.parametrize(
    ("text", "secret", "kept"),
    [
        ("<user>bob</user><password>XmlPw_77</password>", "XmlPw_77", "<user>bob</user>"),
        ("GET /x?api_key%3DUrlEnc_9 next", "UrlEnc_9", "next"),
        ("private_key=-----BEGIN RSA PRIVATE KEY-----\nMIIEBODY123\n"
         "-----END RSA PRIVATE KEY----- tail", "MIIEBODY123", "tail"),
    ],
)
def test_redact_text_removes_xml_url_encoded_and_pem_secrets(
    text: str, secret: str, kept: str
) -> None:
    from celery_grousset.redact import redact_text

    shown = redact_text(text)
    assert secret not in shown and kept in shown and "***" in shown, shown


def test_secrets_in_numbers_json_pairs_keys_and_namespaced_xml_are_redacted() -> None:
    from celery_grousset.redact import redact_text

    # Given a card number as an int (and a float), header pairs after JSON (lists), a
    # mapping whose key holds a DSN password
    text = safe_repr(
        (1, 4111111111111111, 4012888888881881.0, 12345678901234),
        {"headers": [["Authorization", "Basic SEC04basic"], ["X-Api-Key", "SEC04apikey"],
                     ["Host", "shop.example"]],
         "routes": {"postgres://app:KEYSECRETpw@db/x": "primary"}},
    )  # fmt: skip
    # Then none of the secrets is shown; what is not secret is
    for secret in ("4111111111111111", "401288888888", "SEC04basic", "SEC04apikey",
                   "KEYSECRETpw"):  # fmt: skip
        assert secret not in text, (secret, text)
    assert "12345678901234" in text and "shop.example" in text and "postgres://app:" in text
    # And in free text: a namespaced or CDATA XML element, a pair after %26 or %3F
    shown = redact_text("<ns:Password>XMLNSSECRET</ns:Password> <password><![CDATA[CDSEC]]>"
                        "</password> foo%3Dbar%26api_key%3DENC2 next=%2Fpay%3Fpassword%3DENC6")
    for secret in ("XMLNSSECRET", "CDSEC", "ENC2", "ENC6"):
        assert secret not in shown, (secret, shown)
    assert "foo%3Dbar" in shown and "<ns:Password>" in shown


def test_a_secret_quoted_in_another_argument_is_masked_there_too() -> None:
    from celery_grousset import guard
    from celery_grousset.binding import bind_arguments, signature_of

    def login(message: str, password: str = "") -> None: ...

    args, kwargs = ("login failed with ERR01pwvalue",), {"password": "ERR01pwvalue"}
    # Given a call whose password is quoted in another argument / When it is shown
    for bound in (bind_arguments(signature_of(login), args, kwargs), None):
        text = guard.redacted(args, kwargs, bound)
        # Then the value is masked wherever it appears, by name or quoted
        assert "ERR01pwvalue" not in text and "login failed with ***" in text, text


def test_a_sensitive_uuid_decimal_or_float_quoted_elsewhere_is_masked_too() -> None:
    import uuid
    from datetime import date
    from decimal import Decimal

    from celery_grousset import guard
    from celery_grousset.quoted import call_secrets, without_values

    token = uuid.UUID("12345678-1234-5678-1234-567812345678")
    kwargs = {"session_token": token, "account_number": Decimal("98765432101"),
              "pin_code": 9876.5432, "secret_day": date(2031, 5, 17),
              "note": f"renew {token} acct 98765432101 pin 9876.5432 on 2031-05-17"}  # fmt: skip
    # Given sensitive arguments that are not str / When the call is shown
    text = guard.redacted((), kwargs, None)
    # Then their values are masked where another argument quotes them
    for value in (str(token), "98765432101", "9876.5432", "2031-05-17"):
        assert value not in text, (value, text)
    # ... and where an exception's message quotes them (a body's f-string)
    message = without_values(f"session {token} rejected", call_secrets(kwargs, None))
    assert message == "session *** rejected"


@given(
    text=st.text(alphabet=st.characters(max_codepoint=127), max_size=60),
    value=st.text(alphabet=st.characters(max_codepoint=127), min_size=1, max_size=6),
    cut=st.integers(min_value=0, max_value=60),
)
def test_masking_an_ascii_value_without_a_regex_matches_the_regex(
    text: str, value: str, cut: int
) -> None:
    """The ASCII path of without_values (no regex compiled per call) masks exactly what
    re.sub(..., re.IGNORECASE) does: the value anywhere, in any case, never overlapping."""
    import re

    from celery_grousset.quoted import without_values
    from celery_grousset.redact import TEXT_REDACTED

    text = text[:cut] + value.swapcase() + text[cut:]  # the value in it, in another case
    expected = re.sub(re.escape(value), TEXT_REDACTED, text, flags=re.IGNORECASE)
    assert without_values(text, [value]) == expected
    # ... and a non-ASCII text still takes the regex (the Kelvin sign is a "k" to it)
    assert without_values("\u212aey-123", ["key-123"]) == TEXT_REDACTED


def test_the_value_after_a_secret_flag_in_an_argv_list_is_redacted() -> None:
    from celery_grousset.quoted import secret_values, without_values

    # Given a task called with a command line (a list, or spread as positional arguments)
    argv = ["mysqldump", "--password", "ArgvPw_31", "--user", "bob", "-k", "short"]
    shown = [safe_repr((argv,), {}), safe_repr(tuple(argv), {}),
             safe_repr((), {}, bound={"argv": tuple(argv)})]  # fmt: skip
    # Then the value after --password is not shown; the rest is, "-k" is not a secret
    for text in shown:
        assert "ArgvPw_31" not in text and "'--password', '***'" in text, text
        assert "'bob'" in text and "'short'" in text, text
    # And an error quoting the command (subprocess.CalledProcessError) is masked too
    error = f"Command {argv!r} returned non-zero exit status 2."
    masked = without_values(error, secret_values([("argv", argv)]))
    assert "ArgvPw_31" not in masked and "mysqldump" in masked, masked


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        # json.dumps / str(dict) of a nested object: its first key is judged too
        ('{"data": {"password": "NestJson_1"}}', "NestJson_1"),
        ("{'d': {'password': 'NestRepr_2'}}", "NestRepr_2"),
        ('{"headers": {"Authorization": "Basic NestAuth_3"}}', "NestAuth_3"),
        ('{"a": {"b": {"token": "Deeper_4"}}}', "Deeper_4"),
        ("data: {password: Yamlish_5}", "Yamlish_5"),
        # a sensitive name's value that is a list, a call, bytes: masked whole
        ('{"password": ["ListPw_6"]}', "ListPw_6"),
        ("Conn(password=Secret('CallPw_7'))", "CallPw_7"),
        ("Conn(password=b'BytesPw_8')", "BytesPw_8"),
        ("password=['ListPw_9']", "ListPw_9"),
        # an XML element with attributes
        ('<password type="plain">XmlAttr_10</password>', "XmlAttr_10"),
    ],
)
def test_a_secret_inside_a_nested_value_in_text_is_redacted(text: str, secret: str) -> None:
    from celery_grousset.redact import redact_text

    # (the text of an argument or an error: a provider's JSON, a custom __repr__)
    shown = redact_text(text)
    assert secret not in shown and "***" in shown, shown


def test_nested_values_without_secrets_are_kept() -> None:
    from celery_grousset.redact import redact_text

    for text in ('{"data": {"user": "bob", "n": [1, 2]}}', "Point(x=1, y=(2, 3))",
                 "items=[1, 2] mode=(fast)", "call(a={'b': 'c'})"):  # fmt: skip
        assert redact_text(text) == text


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        # a namespaced parent element (SOAP) is not a name=value pair
        ("<soap:Body><Login><Password>correct horse</Password></Login></soap:Body>", "horse"),
        # json.dumps(indent=2) of a list under a sensitive name
        ('{\n  "password": [\n    "Indented_1"\n  ]\n}', "Indented_1"),
        # a nested value under a sensitive name: masked whole
        ('{"password": {"a": {"b": "Deep_2"}}}', "Deep_2"),
        ('{"credentials": {"github": "Deep_3", "aws": {"id": "x"}}}', "Deep_3"),
        ("Creds(password=SecretStr(Secret('Deep_4')))", "Deep_4"),
        ("password: [[\"Deep_5\"]]", "Deep_5"),
        # CDATA holding a "]"
        ("<password><![CDATA[a]b Cdata_6]]></password>", "Cdata_6"),
        # an argv list quoted in text (subprocess.CalledProcessError)
        ("Command '['mysqldump', '--password', 'Argv_7', 'app']' returned non-zero exit "
         "status 2.", "Argv_7"),
        # a name with an index or a path (a Rails/PHP form, a config path)
        ("user[password]=Form_8&user[email]=a@b.c", "Form_8"),
        ('{"db:password": "Path_9", "secrets/db_password": "Path_10"}', "Path_9"),
        ('{"secrets/db_password": "Path_10"}', "Path_10"),
        # a hash in PHP's or Ruby's syntax
        ("{'user' => 'bob', 'password' => 'Arrow_12'}", "Arrow_12"),
        # JSON inside a JSON string (a webhook's body in a log line)
        ('{"body": "{\\"password\\": \\"InJson_11\\"}"}', "InJson_11"),
    ],
)
def test_secrets_in_nested_and_quoted_shapes_of_text_are_redacted(
    text: str, secret: str
) -> None:
    from celery_grousset.redact import redact_text

    shown = redact_text(text)
    assert secret not in shown and "***" in shown, shown


def test_a_bytes_header_pair_is_redacted() -> None:
    from celery_grousset.quoted import secret_values

    # httpx's Headers.raw: a list of (bytes, bytes)
    text = safe_repr((), {"headers": [(b"x-api-key", b"BytesPair_1"), (b"accept", b"json")]})
    assert "BytesPair_1" not in text and "b'json'" in text, text
    # And a header pair's value is one an error quoting it must not show
    found = secret_values([("headers", [("Authorization", "Basic PairVal_2"), ("a", "bcde")])])
    assert "Basic PairVal_2" in found and "bcde" not in found, found


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("token_type=bearer expires_in=3600 scope=read", "expires_in=3600"),
        ('WWW-Authenticate: Bearer error="invalid_token"', 'error="invalid_token"'),
        ("<soap:Body><Login><User>bob</User></Login></soap:Body>", "<User>bob</User>"),
    ],
)
def test_what_is_not_a_secret_in_those_shapes_is_kept(text: str, kept: str) -> None:
    from celery_grousset.redact import redact_text

    assert kept in redact_text(text), redact_text(text)


def test_a_value_under_an_enum_or_tuple_key_naming_a_secret_is_redacted() -> None:
    import enum

    class Field(enum.Enum):
        PASSWORD = "pw"
        USER = "user"

    text = safe_repr((), {"h": {Field.PASSWORD: "EnumKey_1", Field.USER: "bob",
                                ("db", "password"): "TupleKey_2"}})  # fmt: skip
    assert "EnumKey_1" not in text and "TupleKey_2" not in text and "'bob'" in text, text


def test_name_rules_at_their_edges() -> None:
    import enum

    from celery_grousset.sensitive import is_sensitive, is_sensitive_under

    # A five-letter key (creds, token…) inside one lower-case run, and keys no other covers
    for name in ("csrftoken", "authtoken", "mycreds", "apitoken", "mnemonic", "cvv", "ssn"):
        assert is_sensitive(name), name

    class Field(enum.Enum):
        A = "password"

    assert is_sensitive(Field.A)  # an enum key by its value
    # When a name cannot be judged, it is redacted
    assert is_sensitive("harmless", ["x", ["unhashable"]])  # type: ignore[list-item]
    assert is_sensitive_under(["x", ["unhashable"]])("harmless")  # type: ignore[list-item]


def test_a_flag_with_its_value_leaves_the_next_item_alone() -> None:
    text = safe_repr((["prog", "--password=abc", "visible-file.txt"],), {}, max_length=200)
    assert "visible-file.txt" in text and "abc" not in text, text


def test_a_sensitive_value_is_masked_wherever_another_argument_quotes_it() -> None:
    from celery_grousset.quoted import redacted_call, without_values

    def shown(kwargs: dict[str, object], bound: dict[str, object] | None = None,
              args: tuple[object, ...] = ()) -> str:  # fmt: skip
        return redacted_call(args, kwargs, bound, DEFAULT_REDACT_KEYS, 400)

    assert "1234" not in shown({"pin": "1234", "note": "pin was 1234"})  # 4 characters
    assert "hunter\\n22" not in shown({"password": "hunter\n22", "note": "saw hunter\n22"})
    assert "987654" not in shown({"pin": 987654, "note": "pin 987654 failed"})  # an int
    # the longer first: masking "abcd" first would leave "WXYZ" of "abcdWXYZ" shown
    assert "WXYZ" not in shown({"password": "abcd", "token": "abcdWXYZ", "note": "x abcdWXYZ"})
    bound = {"password": "hunter22", "note": "login failed for hunter22"}  # positional
    assert "hunter22" not in shown({}, bound, args=tuple(bound.values()))
    assert "hunter22" not in shown({"password": b"hunter22", "note": "saw hunter22"})
    assert "hunter22" not in shown({"password": {"hunter22"}, "note": "saw hunter22"})
    # text that lower() changes in length (İ) is masked at the right place
    assert without_values("\u0130\u0130 hunter22!", ["hunter22"]) == "\u0130\u0130 ***!"


def test_a_secret_quoted_url_encoded_or_as_a_json_string_is_masked_too() -> None:
    """A failure's text quoting a secret argument in a URL (requests' 'for url: …?ref=…')
    or a JSON body was stored and shown: only the value as given and its repr were
    masked."""
    import json
    from urllib.parse import quote, quote_plus

    from celery_grousset import memo
    from celery_grousset.quoted import secret_values

    token, password = "Zm9vYmFy+c2VjcmV0/eHh4eA==", 'P\u00e4sswort"#1 x'
    # Given a call's secret arguments (as the guard finds them for its attempt)
    found = secret_values({"api_token": token, "password": password}.items())
    scope = memo.SECRETS.set(lambda: found)
    try:
        # When an error quotes them in each form a message writes them in
        for value in (token, password):
            as_json = (json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1])
            for form in (quote_plus(value), quote(value), quote(value, safe=""), *as_json):
                text = memo.redacted_text(f"400 Client Error for url: /export?ref={form}&x=1")
                # Then the stored text masks it
                assert form not in text and "/export?ref=***&x=1" in text, (form, text)
    finally:
        memo.SECRETS.reset(scope)


@pytest.mark.parametrize(
    ("message", "secret"),
    [
        ("password = hunter2pw", "hunter2pw"),
        ("password\t=\ttabpw1234", "tabpw1234"),
        ("settings: password = hunter2pw", "hunter2pw"),
        ("FATAL:  password = x1234abc", "x1234abc"),
        ("password : abcd1234", "abcd1234"),
        ("auth: secret = s3cr3tvalue", "s3cr3tvalue"),
        ("Authorization=Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
        ("token=Bearer abcdef123456", "abcdef123456"),
    ],
)
def test_a_spaced_pair_after_a_word_and_a_colon_is_redacted(message: str, secret: str) -> None:
    """``Type: message``: the type and its colon took the pair's name for their value,
    and the secret after ``password = `` was kept (in the journal's error column, logs)."""
    from celery_grousset import events
    from celery_grousset.memo import encode_exception, error_summary
    from celery_grousset.redact import redact_text

    # Given an exception whose message is a pair with spaces, or a header pair
    exc = RuntimeError(message)
    # When it is summarized (the journal's error, a log line's error) or redacted in text
    shown = [error_summary(exc), events.error_text(exc), redact_text(f"Error: {message}"),
             encode_exception(exc)[2]]  # fmt: skip
    # Then the secret is masked in each
    for text in shown:
        assert secret not in text and "***" in text, text


def test_a_name_value_pair_quoted_in_text_is_redacted_anywhere_in_a_long_text() -> None:
    from celery_grousset.memo import encode_exception
    from celery_grousset.redact import redact_text

    # Given a (name, value) pair written out (a header list, an error's two arguments)
    # in a long text (scanned near its anchors only) and in a short one
    tail = " " + "x" * 400
    for text in ("headers were [('Authorization', 'Basic dXNlcjpwYXNz')]",
                 '["password","vaultpw12"]', "('password', 'vaultpw12')"):  # fmt: skip
        for whole in (text, text + tail):
            # Then its value is masked, and a pair whose name is not sensitive is kept
            assert "dXNlcjpwYXNz" not in redact_text(whole)
            assert "vaultpw12" not in redact_text(whole)
    assert redact_text("['user', 'bob']" + tail) == "['user', 'bob']" + tail
    # ... and an exception made with the pair stores neither its message nor its args
    memo = encode_exception(ValueError("password", "vaultpw12"))
    assert b"vaultpw12" not in memo[0] and "vaultpw12" not in memo[2]


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("password=hunter2 : authentication failed", "hunter2"),
        ("token=abc123 = bad", "abc123"),
        ("password: hunter2 : rejected", "hunter2"),
        ("api_key=AK123 : quota exceeded", "AK123"),
        ("auth: secret = s3cr3tvalue", "s3cr3tvalue"),
        ("token: password = x9x9x9", "x9x9x9"),
    ],
)
def test_a_value_followed_by_a_spaced_separator_is_still_masked(text: str, secret: str) -> None:
    """A review of the spaced-pair fix: taking every name before " :" or " =" for a pair
    of its own left "password=hunter2 : failed" unmasked."""
    from celery_grousset.memo import error_summary
    from celery_grousset.redact import redact_text

    # When text with a sensitive pair and a spaced separator after it is redacted
    # Then the secret is masked, on its own and in an exception's summary
    assert secret not in redact_text(text), redact_text(text)
    assert secret not in error_summary(RuntimeError(text))


def test_a_value_longer_than_the_scan_window_is_masked_whole() -> None:
    from celery_grousset.redact import redact_text, safe_repr

    # Given a password value of 70,000 characters / When it is redacted
    text = "password=" + "A" * 70_000 + " tail"
    # Then none of it shows, in text or in an argument's repr, nor as a quoted name's
    assert redact_text(text) == "password=*** tail"
    assert redact_text("'password': " + "A" * 70_000 + " tail") == "'password': *** tail"
    assert "AAAA" not in safe_repr((text,), {})


def test_text_shown_to_a_person_keeps_its_lines_and_escapes_what_reorders_them() -> None:
    """A CRLF line end showed a literal \\r on every line of an error in the admin."""
    from celery_grousset.shown import visible

    assert visible("a\r\nb\tc") == "a\nb\tc"
    assert visible("gpj\u202eexe\x1b[2J") == "gpj\\u202eexe\\x1b[2J"
    assert visible("a\r\nb", lines=False) == "a\\r\\nb"

