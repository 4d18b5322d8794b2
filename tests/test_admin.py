"""The journal admin, driven through Django's test client against real databases.

Users, sessions and log entries live on ``default`` (SQLite); the journal is read
from ``GROUSSET["DATABASE"]``: ``default`` for most tests, PostgreSQL for the
estimated count, the loose index scan and NUL bytes. Rows come from the real store.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.db.models import F
from django.test import Client, override_settings

from celery_grousset.admin_base import EstimatedCountPaginator
from celery_grousset.claim import ENC_EXCEPTION, ENC_NOT_STORED, ClaimRequest, Kind
from celery_grousset.journal import fingerprint_prefix
from celery_grousset.journal import now as _db_now
from celery_grousset.models import Outcome
from celery_grousset.redact import DEFAULT_REDACT_KEYS
from celery_grousset.store import get_store
from celery_grousset.store.base import Completion
from tests import services

URL = "/admin/celery_grousset/outcome/"


def journal_on(alias: str) -> Any:
    return override_settings(GROUSSET={**settings.GROUSSET, "DATABASE": alias})


@pytest.fixture
def journal() -> Iterator[str]:
    """The admin reads the journal from ``default`` (SQLite) for this test."""
    services.require_database("default")
    with journal_on("default"):
        yield "default"


def make_user(*perms: str, superuser: bool = False) -> User:
    name = f"u-{uuid.uuid4().hex[:10]}"
    manager = User.objects.db_manager("default")
    if superuser:
        return manager.create_superuser(name, f"{name}@example.com", "pw")
    user = manager.create_user(name, f"{name}@example.com", "pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)  # sessions on ``default``
    return client


def put(
    alias: str, processor: str, *, status: str = "completed", task: str = "tests.effect",
    result: bytes = b'{"id": 7, "items": ["a", "b"]}', encoding: str = "application/json;utf-8",
    error: str = "",
) -> Outcome:  # fmt: skip
    """One journal row written by the real store: claimed, then finished unless in flight."""
    fp, token, store = uuid.uuid4().hex + uuid.uuid4().hex, uuid.uuid4().hex, get_store(alias)
    store.claim(ClaimRequest(
        processor_id=processor, fingerprint=fp, task_name=task, task_id=f"task-{uuid.uuid4()}",
        token=token, worker="w:1", args_repr="(1,)", max_processing_time=60.0,
        expires_after=3600.0, max_takeovers=3,
    ))  # fmt: skip
    if status != "in_flight":
        store.finish(processor, fp, token, Completion(status, result, encoding, error))
    return Outcome.objects.using(alias).get(processor_id=processor, fingerprint=fp)


def listed(html: str, *rows: Outcome) -> list[bool]:
    return [row.fingerprint in html for row in rows]  # listed or not, row by row


def test_changelist_shows_badges_and_fingerprints(journal: str, processor: str) -> None:
    # Given one row of each status
    rows = [put(journal, processor, status=s) for s in ("in_flight", "completed", "failed")]
    # When a superuser opens the journal
    resp = client_for(make_user(superuser=True)).get(URL, {"processor": processor})
    html = resp.content.decode()
    # Then every row is listed with a coloured badge, a short fingerprint and a copy affordance
    assert resp.status_code == 200
    for status, colour in (("in_flight", "#92400e"), ("completed", "#166534"),
                           ("failed", "#991b1b")):  # fmt: skip
        assert f"grousset-status grousset-status-{status}" in html and colour in html
    for row in rows:
        fp = row.fingerprint
        assert f'title="{fp}" data-copy="{fp}">{fp[:12]}</code>' in html
    assert "grousset-copy" in html and "celery_grousset/admin.js" in html
    # And it is read-only: no add link, the actions are offered to a superuser
    assert f"{URL}add/" not in html
    assert "release_stale_claims" in html and "forget_outcomes" in html


def test_status_task_processor_and_date_filters(journal: str, processor: str) -> None:
    # Given rows differing by status, task, processor and age
    other = f"{processor}-b"
    flying = put(journal, processor, status="in_flight", task="tests.alpha")
    done = put(journal, processor, task="tests.beta")
    elsewhere = put(journal, other, task="tests.alpha")
    Outcome.objects.using(journal).filter(pk=done.pk).update(
        started_at=F("started_at") - timedelta(days=8)
    )
    client = client_for(make_user(superuser=True))

    def page(**params: str) -> str:
        resp = client.get(URL, params)
        assert resp.status_code == 200
        return resp.content.decode()

    # When filtering / Then only the matching rows are listed
    assert listed(page(processor=processor, status="in_flight"), flying, done) == [True, False]
    assert listed(page(processor=processor, task="tests.beta"), flying, done) == [False, True]
    assert listed(page(task="tests.alpha"), flying, done, elsewhere) == [True, False, True]
    assert listed(page(processor=other), flying, elsewhere) == [False, True]
    assert listed(page(processor=processor, started="older7d"), flying, done) == [False, True]
    assert listed(page(processor=processor, started="24h"), flying, done) == [True, False]
    # And the task and processor filters offer the distinct values
    html = page()
    assert "?task=tests.alpha" in html and "?task=tests.beta" in html
    assert f"?processor={processor}" in html and f"?processor={other}" in html


@pytest.mark.parametrize("alias", ["default", "postgresql"])
def test_a_filtered_count_stops_at_the_cap(
    alias: str, processor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_grousset.admin import OutcomeAdmin

    services.require_database(alias)
    services.require_database("default")  # users and sessions
    # Given 5 failed rows of one processor, a count cap of 3 and 2 rows a page
    monkeypatch.setattr(OutcomeAdmin, "count_cap", 3, raising=False)
    monkeypatch.setattr(OutcomeAdmin, "list_per_page", 2)
    with journal_on(alias):
        rows = [put(alias, processor, status="failed") for _ in range(5)]
        client = client_for(make_user(superuser=True))
        try:
            # When the list is filtered on them
            params = {"processor": processor, "status": "failed"}
            first = client.get(URL, params).content.decode()
            # Then it says "3+" (not 5), and its pages stop at the cap: 2 pages of 2
            assert ">3+</span> journal entries" in first and "5 journal entries" not in first
            assert "Select all 3+ journal entries" in first and "All 3+ selected" in first
            # (the search bar's count too: it said "3 results")
            assert "3+</span> results" in first and "3 results" not in first
            assert sum(listed(first, *rows)) == 2
            assert sum(listed(client.get(URL, {**params, "p": 2}).content.decode(), *rows)) == 1
            assert client.get(URL, {**params, "p": 3}).status_code == 302  # out of range
            # And below the cap the count stays exact
            monkeypatch.setattr(OutcomeAdmin, "count_cap", 10)
            exact = client.get(URL, params).content.decode()
            assert "5 journal entries" in exact and "+</span>" not in exact
            assert "Select all 5 journal entries" in exact
        finally:
            Outcome.objects.using(alias).filter(processor_id=processor).delete()


@pytest.mark.parametrize("cap", [0, -1, 2.5, "10", True])
def test_a_bad_count_cap_is_refused_with_what_is_allowed(cap: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="count_cap must be a whole number above 0"):
        EstimatedCountPaginator(Outcome.objects.none(), 50, cap=cap)


def test_search_by_fingerprint_prefix_and_exact_task_id(journal: str, processor: str) -> None:
    # Given two rows
    one, two = put(journal, processor), put(journal, processor)
    client = client_for(make_user(superuser=True))

    def search(term: str) -> list[bool]:
        resp = client.get(URL, {"q": term, "processor": processor})
        assert resp.status_code == 200
        return listed(resp.content.decode(), one, two)

    # When searching a fingerprint prefix (any case) / Then that row is found
    assert search(one.fingerprint[:8]) == [True, False]
    assert search(two.fingerprint[:8].upper()) == [False, True]
    assert search(one.fingerprint) == [True, False]
    # And a task id matches exactly, never by part
    assert search(two.task_id) == [False, True]
    assert search(two.task_id[:-3]) == [False, False]


def test_a_duplicate_delivery_is_found_and_counted_apart(journal: str, processor: str) -> None:
    # Given a completed row that answered one duplicate delivery and one redelivery of its
    # own task id, after a takeover (so its first claim is older than its attempt)
    row = put(journal, processor, status="in_flight")
    store = get_store(journal)
    Outcome.objects.using(journal).filter(pk=row.pk).update(
        started_at=F("started_at") - timedelta(seconds=120),
        stale_at=F("stale_at") - timedelta(seconds=120),
        first_claimed_at=F("first_claimed_at") - timedelta(seconds=120),
    )

    def claim(task_id: str, token: str | None = None) -> Kind:
        return store.claim(ClaimRequest(
            processor_id=processor, fingerprint=row.fingerprint, task_name="tests.effect",
            task_id=task_id, token=token or uuid.uuid4().hex, worker="w:2", args_repr="(1,)",
            max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
        )).kind  # fmt: skip

    token = uuid.uuid4().hex
    assert claim(row.task_id, token) is Kind.TAKEOVER  # its own redelivery takes over
    assert store.finish(processor, row.fingerprint, token, Completion("completed", b"1",
                        "application/json;utf-8"))  # fmt: skip
    dup = f"dup-{uuid.uuid4().hex}"
    assert claim(dup) is Kind.COMPLETED
    client = client_for(make_user(superuser=True))
    # When the admin searches the duplicate's task id / Then the row is listed
    resp = client.get(URL, {"q": dup, "processor": processor})
    assert listed(resp.content.decode(), row) == [True]
    # And its detail page shows both times and the duplicate apart from the redelivery
    html = client.get(f"{URL}{row.pk}/change/").content.decode()
    assert "<th>first claim</th>" in html and "<th>started</th>" in html
    assert "1 duplicate(s), 1 redelivery(ies) or requeue(s)" in html


def test_a_settled_record_shows_no_claim_deadline_nor_token(journal: str, processor: str) -> None:
    client = client_for(make_user(superuser=True))
    # Given a completed record and a claim in flight
    done, flying = put(journal, processor), put(journal, processor, status="in_flight")
    # When their detail pages are shown
    settled = client.get(f"{URL}{done.pk}/change/").content.decode()
    live = client.get(f"{URL}{flying.pk}/change/").content.decode()
    # Then only the claim in flight shows when it turns stale and its token
    assert "field-stale_at" not in settled and "field-claim_token" not in settled
    assert "field-stale_at" in live and "field-claim_token" in live


def test_a_memo_with_a_lone_surrogate_is_shown_escaped(journal: str, processor: str) -> None:
    """A JSON memo holding a lone surrogate (a value from ``json.loads`` of a form's
    input, stored by kombu as its escape) was decoded and written into the page as it
    is: the response could not be encoded, a server error (a review)."""
    # Given a completed record whose memo has "\ud800" in a string
    row = put(journal, processor, result=b'{"v": "x\\ud800y"}')
    # When its detail page is shown / Then it is, the surrogate as its escape
    resp = client_for(make_user(superuser=True)).get(f"{URL}{row.pk}/change/")
    assert resp.status_code == 200 and "x\\ud800y" in resp.content.decode()


def test_a_task_id_with_an_emoji_is_found_by_its_own_text(journal: str, processor: str) -> None:
    from celery_grousset.claim import ClaimRequest

    # Given a row whose task id has an emoji (SQLite stores it as it is)
    fp = uuid.uuid4().hex + uuid.uuid4().hex
    get_store(journal).claim(ClaimRequest(
        processor_id=processor, fingerprint=fp, task_name="tests.emoji", task_id="t-\U0001f600",
        token="tok", worker="w", args_repr="()", max_processing_time=60.0,
        expires_after=3600.0, max_takeovers=3,
    ))  # fmt: skip
    # When it is searched for / Then it is found (the MySQL escape is for utf8mb3 only)
    page = client_for(make_user(superuser=True)).get(URL, {"q": "t-\U0001f600"})
    assert page.status_code == 200 and fp[:12] in page.content.decode()


@pytest.mark.parametrize(
    "term",
    ["%", "_", "%%_", "\x00", "ab\x00cd", "a" * 10_000, "f" * 10_000, "ünïcødé ☃ 🦆",
     "' OR 1=1 --", "\\", "é" * 300],
)  # fmt: skip
def test_hostile_search_terms_answer_200(journal: str, processor: str, term: str) -> None:
    # Given a row
    row = put(journal, processor)
    # When a hostile term is searched
    resp = client_for(make_user(superuser=True)).get(URL, {"q": term, "processor": processor})
    # Then the page answers and wildcards are not wildcards (Django's search form refuses a
    # term with NUL bytes: the list is then shown unsearched)
    assert resp.status_code == 200
    assert (row.fingerprint in resp.content.decode()) is ("\x00" in term)


def test_hostile_filter_values_and_unknown_lookups(journal: str, processor: str) -> None:
    # Given a superuser
    client = client_for(make_user(superuser=True))
    # When filter values carry NUL bytes or long strings / Then the page answers
    for params in ({"status": "\x00"}, {"task": "x\x00" * 5000}, {"processor": "%"},
                   {"started": "\x00"}, {"p": "\x00"}, {"o": "\x00"}):  # fmt: skip
        assert client.get(URL, params).status_code == 200, params
    # And ad-hoc field lookups are refused as bad requests, not server errors
    assert client.get(URL, {"task_id": "x"}).status_code == 400
    assert client.get(URL, {"fingerprint__regex": "("}).status_code == 400


def test_detail_page_pretty_prints_the_memo(journal: str, processor: str) -> None:
    # Given a completed row with a JSON memo
    row = put(journal, processor, result=b'{"id": 7, "items": ["a", "b"]}')
    # When its detail page is opened
    resp = client_for(make_user(superuser=True)).get(f"{URL}{row.pk}/change/")
    html = resp.content.decode()
    # Then the memo is decoded and indented, the timeline and the record are shown
    assert resp.status_code == 200
    assert '<pre class="grousset-memo">{\n  &quot;id&quot;: 7,\n  &quot;items&quot;: [' in html
    assert "grousset-timeline" in html
    assert f"fence {row.fence}, 0 takeover(s), 1 delivery(ies)" in html
    assert row.fingerprint in html and row.task_id in html and "(1,)" in html
    # And there is nothing to save
    assert 'name="_save"' not in html

def shown_by_admin_and_inspect(row: Outcome, journal: str) -> tuple[str, str]:
    """What a superuser's detail page and ``grousset_inspect --json`` show of ``row``."""
    from io import StringIO

    from django.core.management import call_command

    html = client_for(make_user(superuser=True)).get(f"{URL}{row.pk}/change/").content.decode()
    out = StringIO()
    call_command("grousset_inspect", row.task_id, "--json", database=journal, stdout=out)
    return html, out.getvalue()



def test_a_memo_is_shown_redacted_and_kept_whole_for_duplicates(
    journal: str, processor: str
) -> None:
    from celery_grousset import memo

    # Given a completed row whose memo holds a token under a sensitive name and a
    # password in a string (a task that returned its provider's answer)
    memo_json = (b'{"id": 7, "api_token": "sk_live_RETURNED123", '
                 b'"note": "password=RetHunter2 ok"}')  # fmt: skip
    row = put(journal, processor, result=memo_json)
    # When the admin's detail page and grousset_inspect show it
    # Then neither shows the secrets; the rest of the value is there
    for shown in shown_by_admin_and_inspect(row, journal):
        assert "sk_live_RETURNED123" not in shown and "RetHunter2" not in shown, shown
        assert "***" in shown and "password=" in shown and "7" in shown
    # And what a duplicate gets is the value as returned
    row.refresh_from_db(using=journal)
    value = memo.decode(bytes(row.result), row.result_encoding, row.error, row.fingerprint)
    assert value["api_token"] == "sk_live_RETURNED123"


def test_memo_secrets_in_numbers_pairs_and_keys_are_not_shown(
    journal: str, processor: str
) -> None:
    # Given a memo whose secrets are not under a sensitive name: a card number as a
    # JSON number, a header list's ["Password", value] pair, a DSN password in a key
    memo_json = (b'{"charged_to": 4111111111111111, "amount": 1250, '
                 b'"headers": [["X-Password", "PairHunter2"], ["Accept", "json"]], '
                 b'"by_dsn": {"postgres://app:KeyHunter2@db/x": 1}}')  # fmt: skip
    row = put(journal, processor, result=memo_json)
    # When the admin's detail page and grousset_inspect show it
    # Then none of the secrets is shown; the harmless values are
    for shown in shown_by_admin_and_inspect(row, journal):
        for secret in ("4111111111111111", "PairHunter2", "KeyHunter2"):
            assert secret not in shown, (secret, shown)
        assert "1250" in shown and "Accept" in shown and "X-Password" in shown
    # ... nor a secret in a pair's name
    from celery_grousset.shown import shown_json

    assert shown_json(["password=PairName2", "x"], DEFAULT_REDACT_KEYS) == ["password=***", "***"]


def test_memo_secrets_in_bytes_and_decimals_are_not_shown(journal: str, processor: str) -> None:
    # Given a JSON memo holding values kombu decodes to other types than str: bytes with
    # a DSN password and an API key, a card number as a Decimal, a pair's value as bytes
    from kombu.utils.json import dumps

    memo = {"note": b"postgres://app:BytesHunter2@db/x", "k": b"sk_live_abcdefghijklmnop1234",
            "card": Decimal("4111111111111111"), "total": Decimal("12.50"),
            "pair": [b"password", b"PairBytes42"], "echo": b"said PairBytes42 twice",
            "raw": b"\xff\xfe plain"}  # fmt: skip
    row = put(journal, processor, result=dumps(memo).encode())
    # When the admin's detail page and grousset_inspect show it
    # Then none of the secrets is shown; the harmless values are
    for shown in shown_by_admin_and_inspect(row, journal):
        for secret in ("BytesHunter2", "sk_live_abcdefghijklmnop1234", "4111111111111111",
                       "PairBytes42"):  # fmt: skip
            assert secret not in shown, (secret, shown)
        assert "12.50" in shown and "postgres://app:" in shown and "plain" in shown, shown


def test_a_memo_value_under_a_sensitive_name_is_masked_where_another_string_quotes_it(
    journal: str, processor: str
) -> None:
    # Given a memo that holds a password and a token and quotes both elsewhere
    memo_json = (b'{"password": "hunter2secretPW2", "echo": "pw hunter2secretPW2 ok", '
                 b'"auth": {"token": "tokSECRET67890"}, '
                 b'"log": ["sent with tokSECRET67890"]}')  # fmt: skip
    row = put(journal, processor, result=memo_json)
    # When the admin's detail page and grousset_inspect show it
    # Then neither secret is shown anywhere; the text around them is
    for shown in shown_by_admin_and_inspect(row, journal):
        for secret in ("hunter2secretPW2", "tokSECRET67890"):
            assert secret not in shown, (secret, shown)
        assert "sent with ***" in shown and "echo" in shown


@pytest.mark.parametrize(
    ("encoding", "result", "error", "shown"),
    [
        (ENC_EXCEPTION, b'{"exc_type": "ValueError", "exc_module": "builtins", '
                        b'"exc_message": "card declined"}', "ValueError: card declined",
         "ValueError: card declined"),
        (ENC_NOT_STORED, None, "result not stored: too big", "ResultNotStored"),
        ("application/x-python-serialize;binary", b"\x80\x04K\x01.", "",
         "not decoded in the admin"),
    ],
)  # fmt: skip
def test_detail_page_explains_a_memo_it_cannot_show(
    journal: str, processor: str, encoding: str, result: bytes | None, error: str, shown: str
) -> None:
    # Given a row whose memo is a replayed failure, missing, or pickled
    row = put(journal, processor, status="failed" if encoding == ENC_EXCEPTION else "completed",
              result=result or b"", encoding=encoding, error=error)  # fmt: skip
    # When its detail page is opened
    resp = client_for(make_user(superuser=True)).get(f"{URL}{row.pk}/change/")
    # Then the page explains what duplicates get instead of a value
    assert resp.status_code == 200
    assert shown in resp.content.decode()


def test_detail_page_of_an_expired_record_says_its_memo_is_no_longer_answered(
    journal: str, processor: str
) -> None:
    # Given a completed row whose retention window has ended
    row = put(journal, processor, result=b'{"id": 7}')
    Outcome.objects.using(journal).filter(pk=row.pk).update(
        expires_on=_db_now(journal) - timedelta(minutes=5))  # fmt: skip
    # When its detail page is opened
    html = client_for(make_user(superuser=True)).get(f"{URL}{row.pk}/change/").content.decode()
    # Then it does not show a memo a duplicate would receive: a duplicate runs again
    assert "expired" in html and "runs the task again" in html
    assert '<pre class="grousset-memo">' not in html


def test_the_detail_page_shows_every_time_in_the_admins_time_zone_with_its_name(
    journal: str, processor: str
) -> None:
    """The timeline and the memo's text showed UTC, the fields local time, unlabelled
    (an admin review): an operator in New York misread a deadline by five hours."""
    import re
    from zoneinfo import ZoneInfo

    # Given a row that expired 5 minutes ago, and an admin in New York
    row = put(journal, processor, result=b'{"id": 7}')
    Outcome.objects.using(journal).filter(pk=row.pk).update(
        expires_on=_db_now(journal) - timedelta(minutes=5))  # fmt: skip
    row.refresh_from_db()
    with override_settings(TIME_ZONE="America/New_York"):
        # When its detail page is opened
        html = client_for(make_user(superuser=True)).get(f"{URL}{row.pk}/change/").content.decode()
    # Then the timeline and the memo's text give New York's time, named
    local = row.expires_on.astimezone(ZoneInfo("America/New_York"))
    text = f"{local:%Y-%m-%d %H:%M:%S} {local:%Z}"
    assert f"expired at {text}" in html
    assert re.search(rf"expires</th>\s*<td>{re.escape(text)}", html), html[:200]
    assert f"{row.expires_on.astimezone(ZoneInfo('UTC')):%Y-%m-%d %H:%M:%S}" not in html


def test_bidirectional_overrides_in_stored_text_are_shown_escaped(
    journal: str, processor: str
) -> None:
    """A right-to-left override in an error or the arguments reordered what followed it
    on the page ("…RTL" read as "LTR…"): text a publisher controls could spoof what an
    operator reads (an admin review); the commands already escaped it."""
    spoof = "declined \u202eexe.jpg\u202c done"
    # Given a failed row whose error and arguments carry a right-to-left override
    row = put(journal, processor, status="failed", result=None, encoding="", error=spoof)
    Outcome.objects.using(journal).filter(pk=row.pk).update(args_repr=f"('{spoof}',)")
    # When its detail page is opened
    html = client_for(make_user(superuser=True)).get(f"{URL}{row.pk}/change/").content.decode()
    # Then the override is shown as its escape, never sent as itself
    assert "\u202e" not in html and "\u202c" not in html
    assert html.count("declined \\u202eexe.jpg\\u202c done") == 2, html.count("declined")


def test_add_change_and_delete_are_forbidden(journal: str, processor: str) -> None:
    # Given a row and a superuser
    row = put(journal, processor)
    client = client_for(make_user(superuser=True))
    # When adding, editing or deleting / Then the admin refuses
    assert client.get(f"{URL}add/").status_code == 403
    assert client.post(f"{URL}{row.pk}/change/", {"status": "failed"}).status_code == 403
    assert client.get(f"{URL}{row.pk}/delete/").status_code == 403
    assert client.post(f"{URL}{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Outcome.objects.using(journal).get(pk=row.pk).status == "completed"


def _log_messages(user: User, row: Outcome) -> list[str]:
    entries = LogEntry.objects.using("default").filter(
        user=user, object_id=str(row.pk), action_flag=CHANGE
    )
    return [entry.change_message for entry in entries]


def confirmation(client: Client, url: str, form: dict[str, Any]) -> dict[str, list[str]]:
    """What an action's confirmation page posts back when confirmed (its hidden inputs)."""
    import html as markup
    import re

    page = client.post(url, form).content.decode()
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page):
        if name != "csrfmiddlewaretoken":
            fields.setdefault(name, []).append(markup.unescape(value))
    assert fields.get("post") == ["yes"], page[:2000]
    return fields


def test_release_action_confirms_then_frees_the_claim(journal: str, processor: str) -> None:
    # Given a stale in-flight claim (past its own stale_at), a completed row, a superuser
    flying, done = put(journal, processor, status="in_flight"), put(journal, processor)
    Outcome.objects.using(journal).filter(pk=flying.pk).update(
        started_at=F("started_at") - timedelta(seconds=61),
        stale_at=F("stale_at") - timedelta(seconds=61),
    )
    flying.refresh_from_db(using=journal)
    user = make_user(superuser=True)
    client = client_for(user)
    form = {"action": "release_stale_claims", "_selected_action": [flying.pk, done.pk]}
    # When the action is chosen
    resp = client.post(URL, form)
    html = resp.content.decode()
    # Then a confirmation page lists both rows, and nothing has changed yet
    assert resp.status_code == 200 and "grousset-confirm-rows" in html
    assert html.count("grousset-will-change") == 1 and html.count("grousset-skipped") == 1
    assert 'name="post" value="yes"' in html
    assert Outcome.objects.using(journal).get(pk=flying.pk).status == "in_flight"
    # When it is confirmed
    resp = client.post(URL, confirmation(client, URL, form), follow=True)
    # Then the claim is released (failed, no memo: the next delivery runs) and logged
    rec = Outcome.objects.using(journal).get(pk=flying.pk)
    assert (rec.status, rec.result_encoding) == ("failed", "")
    assert rec.error.startswith("released")
    assert Outcome.objects.using(journal).get(pk=done.pk).status == "completed"
    started = f"{flying.started_at:%Y-%m-%d %H:%M:%S} UTC"
    said = f"Released the claim of fence {flying.fence} (started {started})."
    assert _log_messages(user, flying) in ([said], [f"{said} (journal database {journal!r})"])
    # (the history names the row as it is now, not as it was: a review saw "(in_flight)")
    entry = LogEntry.objects.using("default").get(user=user, object_id=str(flying.pk))
    assert entry.object_repr.endswith("(failed)"), entry.object_repr
    assert _log_messages(user, done) == []
    assert "Released 1 claim(s); 1 left as they were." in resp.content.decode()
    # And the next delivery of that message claims it again
    claim = get_store(journal).claim(ClaimRequest(
        processor_id=processor, fingerprint=flying.fingerprint, task_name="tests.effect",
        task_id="again", token=uuid.uuid4().hex, worker="w:2", args_repr="(1,)",
        max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
    ))  # fmt: skip
    assert claim.kind is Kind.RECLAIM


def test_release_uses_each_claims_own_deadline_not_the_global_setting(
    journal: str, processor: str
) -> None:
    # Given claims of a task with max_processing_time=60 s: one 2 s old, one 2 minutes old,
    # and a global MAX_PROCESSING_TIME (1 s) lower than the task's own
    fresh, stale = (put(journal, processor, status="in_flight") for _ in range(2))
    for row, seconds in ((fresh, 2), (stale, 120)):
        Outcome.objects.using(journal).filter(pk=row.pk).update(
            started_at=F("started_at") - timedelta(seconds=seconds),
            stale_at=F("stale_at") - timedelta(seconds=seconds),
        )
    client = client_for(make_user(superuser=True))
    form = {"action": "release_stale_claims", "_selected_action": [fresh.pk, stale.pk]}
    # When both are released
    with override_settings(GROUSSET={**settings.GROUSSET, "DATABASE": journal,
                                     "MAX_PROCESSING_TIME": 1}):  # fmt: skip
        client.post(URL, confirmation(client, URL, form))
    # Then only the one past its own deadline is: the live attempt keeps its claim
    statuses = dict(Outcome.objects.using(journal).filter(pk__in=[fresh.pk, stale.pk])
                    .values_list("pk", "status"))  # fmt: skip
    assert statuses == {fresh.pk: "in_flight", stale.pk: "failed"}


def test_forget_action_lets_the_next_delivery_run_again(
    journal: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a completed row remembered for an hour, an in-flight one, and a superuser
    done, flying = put(journal, processor), put(journal, processor, status="in_flight")
    user = make_user(superuser=True)
    client = client_for(user)
    form = {"action": "forget_outcomes", "_selected_action": [done.pk, flying.pk]}
    # When the action is chosen / Then a confirmation page comes first
    first = client.post(URL, form).content.decode()
    assert "grousset-confirm-rows" in first and "grousset_release --force" in first
    assert "in flight, fresh (its attempt may be running)" in first
    assert Outcome.objects.using(journal).get(pk=done.pk).expires_on == done.expires_on
    # When it is confirmed
    with caplog.at_level(logging.WARNING, logger="celery_grousset"):
        client.post(URL, confirmation(client, URL, form))
    # Then the completed row expires now, the in-flight one is untouched, and it is logged
    # (in the admin's history, and a line in the log: a review found none)
    forgotten = [m for m in caplog.messages if m.startswith("grousset.forgotten")]
    assert forgotten == [
        f"grousset.forgotten fingerprint={done.fingerprint} task=tests.effect "
        f"task_id={done.task_id} processor={processor} database={journal} fence={done.fence} "
        f"status=completed was_kept_until={done.expires_on.isoformat()}"
    ], caplog.messages
    rec = Outcome.objects.using(journal).get(pk=done.pk)
    assert rec.expires_on <= _db_now(journal) and rec.status == "completed"
    assert Outcome.objects.using(journal).get(pk=flying.pk).expires_on == flying.expires_on
    assert len(_log_messages(user, done)) == 1 and _log_messages(user, flying) == []
    # And the next delivery re-claims it, with the fence still growing
    claim = get_store(journal).claim(ClaimRequest(
        processor_id=processor, fingerprint=done.fingerprint, task_name="tests.effect",
        task_id="again", token=uuid.uuid4().hex, worker="w:2", args_repr="(1,)",
        max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
    ))  # fmt: skip
    assert claim.kind is Kind.EXPIRED and claim.fence > done.fence


def test_a_confirmed_action_changes_only_the_rows_its_page_showed_as_they_were(
    journal: str, processor: str
) -> None:
    """The confirmed post ran the action again on the selection: with "select all" a row
    completed after the page was shown was forgotten too (a review: 3 forgotten for 2
    listed), and a row's state was read anew."""
    # Given two completed rows, all of a processor's rows selected ("select all") for Forget
    first, second = put(journal, processor), put(journal, processor)
    client = client_for(make_user(superuser=True))
    url = f"{URL}?processor={processor}"
    form = {"action": "forget_outcomes", "_selected_action": [first.pk], "select_across": "1",
            "index": "0"}  # fmt: skip
    confirmed = confirmation(client, url, form)
    # When, before the operator confirms, a third row of that processor completes, and the
    # second row is forgotten and claimed again by a new delivery (its state moved on)
    third = put(journal, processor)
    Outcome.objects.using(journal).filter(pk=second.pk).update(fence=F("fence") + 1)
    resp = client.post(url, confirmed, follow=True)
    # Then only the first row, as the page showed it, is forgotten
    now = _db_now(journal)
    kept = {r.pk: r.expires_on <= now for r in Outcome.objects.using(journal).filter(
        pk__in=[first.pk, second.pk, third.pk])}  # fmt: skip
    assert kept == {first.pk: True, second.pk: False, third.pk: False}, kept
    assert "Forgot 1 outcome(s)" in resp.content.decode()
    assert "1 had changed since the confirmation page" in resp.content.decode()


def test_view_only_staff_sees_no_actions_and_is_refused(journal: str, processor: str) -> None:
    # Given an in-flight row and a staff user who may only view the journal
    flying = put(journal, processor, status="in_flight")
    client = client_for(make_user("view_outcome"))
    # When they open the list and the detail page / Then both are shown, without actions
    html = client.get(URL, {"processor": processor}).content.decode()
    assert flying.fingerprint in html
    assert "release_stale_claims" not in html and "forget_outcomes" not in html
    assert client.get(f"{URL}{flying.pk}/change/").status_code == 200
    # When they post the actions anyway (as a superuser's confirmation page would) / Then
    # nothing changes
    Outcome.objects.using(journal).filter(pk=flying.pk).update(
        stale_at=F("stale_at") - timedelta(seconds=120))  # fmt: skip
    admin_client = client_for(make_user(superuser=True))
    for action in ("release_stale_claims", "forget_outcomes"):
        form = {"action": action, "_selected_action": [flying.pk]}
        client.post(URL, confirmation(admin_client, URL, form))
    assert Outcome.objects.using(journal).get(pk=flying.pk).status == "in_flight"


def test_each_action_needs_its_own_permission(journal: str, processor: str) -> None:
    # Given a user who may view and release, but not forget
    client = client_for(make_user("view_outcome", "release_outcome"))
    # When they open the list / Then only the release action is offered
    html = client.get(URL).content.decode()
    assert "release_stale_claims" in html and "forget_outcomes" not in html
    # And a staff user without any journal permission is refused the list
    assert client_for(make_user()).get(URL).status_code == 403


def test_fingerprint_prefix_range_is_exact() -> None:
    # Given prefixes ending in f and 9 / Then the range bounds stay inside the hex alphabet
    assert ("fingerprint__lt", "aba") in fingerprint_prefix("ab9").children
    assert ("fingerprint__lt", "ac") in fingerprint_prefix("abff").children
    assert "fingerprint__lt" not in str(fingerprint_prefix("fff"))


@pytest.fixture
def pg() -> Iterator[str]:
    """PostgreSQL journal: estimated count, loose index scan, a server that rejects NUL."""
    services.require_database("postgresql")
    services.require_database("default")  # users and sessions
    with journal_on("postgresql"):
        yield "postgresql"


def test_unfiltered_count_uses_the_planner_estimate_on_postgresql(pg: str, processor: str) -> None:
    # Given 12,000 rows, analysed, then 5 more the statistics do not know about
    with connections[pg].cursor() as cur:
        cur.execute(
            "INSERT INTO celery_grousset_outcome (processor_id, fingerprint, task_name, task_id,"
            " status, fence, claim_token, started_at, stale_at, expires_on, deliveries, takeovers,"
            " result_encoding, error, worker, args_repr) SELECT %s, md5(i::text) || md5(i::text),"
            " 'tests.bulk', 't' || i, 'completed', 1, 'x', now(), now(),"
            " now() + interval '1 hour', 1, 0,"
            " '', '', '', '' FROM generate_series(1, 12000) AS i", [processor],
        )  # fmt: skip
        cur.execute("ANALYZE celery_grousset_outcome")
        cur.execute("SELECT reltuples FROM pg_class WHERE relname = 'celery_grousset_outcome'")
        estimate = int(cur.fetchone()[0])
    try:
        for _ in range(5):
            put(pg, processor)
        qs = Outcome.objects.using(pg).all()
        # When the paginator counts the unfiltered and a filtered journal
        # Then the first is the estimate (no COUNT), the second the exact count
        assert EstimatedCountPaginator(qs, 50).count == estimate != qs.count()
        assert EstimatedCountPaginator(qs.filter(processor_id=processor), 50).count == 12_005
        # And the task filter's choices come from the loose index scan, in order
        names = get_store(pg).distinct_values("task_name", 200)
        assert names == sorted(set(qs.values_list("task_name", flat=True)))[:200]
        assert "tests.bulk" in names
        # And the changelist answers, filtered or not
        client = client_for(make_user(superuser=True))
        assert client.get(URL).status_code == 200
        assert client.get(URL, {"task": "tests.bulk", "q": "0"}).status_code == 200
    finally:
        Outcome.objects.using(pg).filter(processor_id=processor).delete()


@pytest.mark.parametrize("params", [{"q": "ab\x00cd"}, {"q": "\x00" * 10_000},
                                    {"task": "x\x00y"}, {"processor": "\x00"}])  # fmt: skip
def test_nul_bytes_never_reach_postgresql(pg: str, params: dict[str, str]) -> None:
    # Given a superuser / When NUL bytes are searched or filtered on
    resp = client_for(make_user(superuser=True)).get(URL, params)
    # Then PostgreSQL (which rejects NUL in text) is never sent one: the page answers
    assert resp.status_code == 200


# -- the outbox admin ------------------------------------------------------------------------

OUTBOX_URL = "/admin/celery_grousset/outboxmessage/"


def test_outbox_detail_redacts_positional_secrets_and_option_headers(journal: str) -> None:
    from celery import chain

    from celery_grousset import outbox
    from celery_grousset.models import OutboxMessage
    from tests.tasks import login

    # Given a pending message of a registered task whose password is passed positionally,
    # with an Authorization header, and one of a task this app does not know
    queue = f"adm-{uuid.uuid4().hex[:8]}"
    known = outbox.enqueue(
        login, ("alice-7f2c", "Tr0ub4dor-pw-61"), using=journal, queue=queue,
        headers={"Authorization": "Token tk-9b1e77aa", "X-Request-Id": "req-5d0c"},
        link=[login.s("carol-4d2a", "LinkPw-98765"),
              chain(login.s("dave-1b2c", "ChainPw-4321"), login.s("erin-9f8e", "ChainPw-8765"))],
        chain=[login.s("frank-5c6d", "ChainOptPw-5555")],
    )  # fmt: skip
    unknown = outbox.enqueue(
        "elsewhere.login", ("bob-3e1a",), {"password": "Hunter2-pw-88"}, using=journal,
        queue=queue,
    )  # fmt: skip
    client = client_for(make_user(superuser=True))
    try:
        # When their detail pages are opened
        pages = [client.get(f"{OUTBOX_URL}{row.pk}/change/") for row in (known, unknown)]
        html = [page.content.decode() for page in pages]
        # Then the positional password (bound by name to login's signature) and the header's
        # credentials are not shown; the other values are
        assert [page.status_code for page in pages] == [200, 200]
        assert "Tr0ub4dor-pw-61" not in html[0] and "tk-9b1e77aa" not in html[0]
        assert "password=&#x27;***&#x27;" in html[0] and "alice-7f2c" in html[0]
        assert "req-5d0c" in html[0] and queue in html[0]
        # ... nor a linked signature's positional password (bound to its task the same way)
        assert "LinkPw-98765" not in html[0] and "carol-4d2a" in html[0]
        assert "ChainPw-4321" not in html[0] and "ChainPw-8765" not in html[0]  # (in a chain)
        assert "dave-1b2c" in html[0]
        # ... nor that of a signature in the chain= option (shown raw, a review found)
        assert "ChainOptPw-5555" not in html[0] and "frank-5c6d" in html[0]
        # ... and an unregistered task's keyword arguments are redacted by name, its
        # positional ones (no name to judge them by) not shown at all
        assert "Hunter2-pw-88" not in html[1] and "bob-3e1a" not in html[1]
        assert "positional arguments not shown" in html[1]
    finally:
        OutboxMessage.objects.using(journal).filter(pk__in=[known.pk, unknown.pk]).delete()


WEB_PROCESS = """
import os, sys
import django
django.setup()
from celery import Celery
from django.urls import get_script_prefix, set_script_prefix
app = Celery("web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.imports = ("tests.tasks",)  # imported by a worker, not by a web process
app.autodiscover_tasks()  # lazy, as in a project's celery.py
app.set_current()
app.set_default()
assert "tests.tasks" not in sys.modules
set_script_prefix("/sub/")  # as a request under a sub-path has it
from celery_grousset.models import OutboxMessage
from celery_grousset.outbox_admin import arguments_text
print(arguments_text(OutboxMessage(task_name="tests.tasks.login",
      args=["alice-7f2c", "Tr0ub4dor-pw-61"], kwargs={}, status="pending")))
print(get_script_prefix())  # Celery's import_default_modules() ran django.setup() again
"""


def test_outbox_arguments_are_bound_in_a_web_process_that_never_imported_the_tasks() -> None:
    """Celery autodiscovers task modules in a worker and in beat, not in a web process: a
    positional password of a task the admin had not imported was shown in the clear."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    # Given a web process whose Celery app discovers its tasks lazily (none imported)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(root)}
    # When the outbox admin shows a pending row's arguments there
    out = subprocess.run([sys.executable, "-c", WEB_PROCESS], env=env, cwd=root,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    # Then they are bound by name to the task's signature: the password is masked
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["user='alice-7f2c',", "password='***'", "/sub/"]


def test_outbox_list_refuses_lookups_that_would_probe_raw_arguments(journal: str) -> None:
    from celery_grousset import outbox
    from celery_grousset.models import OutboxMessage

    # Given a pending message (its raw arguments wait in the row) and a view-only user
    row = outbox.enqueue("elsewhere.login", ("4111111111111111",), {"password": "OutboxPw123"},
                         using=journal, headers={"Authorization": "Bearer OPTBEARER"})  # fmt: skip
    client = client_for(make_user("view_outboxmessage"))
    try:
        # When the list is asked to filter on the arguments, headers or error by value
        probes = [{"kwargs__password__startswith": "Outbox"}, {"args__0": "4111111111111111"},
                  {"options__headers__Authorization": "Bearer OPTBEARER"},
                  {"last_error__contains": "x"}, {"task_id": row.task_id}]  # fmt: skip
        # Then each is refused as a bad request (no row confirms a guessed secret)
        assert [client.get(OUTBOX_URL, p).status_code for p in probes] == [400] * len(probes)
        # ... while its own filter and search still work
        assert client.get(OUTBOX_URL, {"status": "pending"}).status_code == 200
        assert client.get(OUTBOX_URL, {"q": row.task_id}).status_code == 200
    finally:
        OutboxMessage.objects.using(journal).filter(pk=row.pk).delete()


@pytest.mark.parametrize("url", [URL, OUTBOX_URL])
def test_no_list_offers_facet_counts_of_the_whole_table(journal: str, url: str) -> None:
    """Django's facet counts ("Show counts", ``?_facets``) count the whole table per
    filter choice, with no cap: the outbox's list offered them (a review)."""
    from django.contrib import admin

    if not hasattr(admin, "ShowFacets"):
        pytest.skip("Django 4.2 has no facets")
    client = client_for(make_user("view_outcome", "view_outboxmessage"))
    # When a list is asked for its facets
    page = client.get(url, {"_facets": "True"})
    # Then it is served without them: no count per filter choice, no link to them
    assert page.status_code == 200
    assert page.context["cl"].add_facets is False
    body = page.content.decode()
    assert "Show counts" not in body and "Hide counts" not in body


def test_changelist_columns_stay_narrow_and_the_copy_control_is_a_glyph(
    journal: str, processor: str
) -> None:
    # Given a completed row and one in flight, of a task with a long dotted name
    done = put(journal, processor, task="shop.billing.tasks.send_invoice_reminder")
    flying = put(journal, processor, status="in_flight")
    # When a superuser opens the journal
    resp = client_for(make_user(superuser=True)).get(URL, {"processor": processor})
    html = resp.content.decode()
    assert resp.status_code == 200
    # Then the copy control is an icon with a label, not the word "copy"
    assert html.count('<svg class="grousset-copy-icon"') == 2
    assert 'aria-label="Copy the full fingerprint"' in html and ">copy<" not in html
    # And the times are two short lines (date over time) with the full value on hover
    started = done.started_at
    assert (f'<time class="grousset-when" datetime="{started.isoformat()}" '
            f'title="{started:%Y-%m-%d %H:%M:%S} UTC">{started:%Y-%m-%d}<br>'
            f"{started:%H:%M:%S}</time>") in html  # fmt: skip
    # And a dotted task name may wrap after each dot; the stylesheet sizes the columns
    assert "shop.<wbr>billing.<wbr>tasks.<wbr>send_invoice_reminder" in html
    assert "celery_grousset/admin.css" in html
    # And the compact columns still sort by their fields
    from celery_grousset.admin import OutcomeAdmin

    for name, field in (("started", "started_at"), ("completed", "completed_at"),
                        ("delivery_count", "deliveries"), ("takeover_count", "takeovers"),
                        ("task", "task_name")):  # fmt: skip
        assert f"sortable column-{name}" in html, name
        assert getattr(OutcomeAdmin, name).admin_order_field == field
    assert flying.fingerprint[:12] in html


def test_the_age_column_reads_the_journal_clock_whatever_the_session_time_zone() -> None:
    from django.contrib.admin.sites import site
    from django.test import RequestFactory

    from celery_grousset.admin import OutcomeAdmin
    from tests.test_checks import database

    services.require_database("mysql")
    base = connections.settings["mysql"]
    options = {**base["OPTIONS"], "init_command": "SET time_zone='+02:00'"}
    processor = f"tz-{uuid.uuid4().hex[:8]}"
    # Given a MySQL journal whose sessions run at +02:00 (a server whose default zone is
    # local time), and a claim made a moment ago
    with database("mysql_tz", **{**base, "OPTIONS": options}), override_settings(
        GROUSSET={"DATABASE": "mysql_tz"}
    ):
        get_store("mysql_tz").claim(ClaimRequest(
            processor_id=processor, fingerprint=uuid.uuid4().hex * 2, task_name="tests.tz",
            task_id="t-tz", token=uuid.uuid4().hex, worker="w", args_repr="()",
            max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
        ))  # fmt: skip
        # When the changelist's queryset computes its age column
        request = RequestFactory().get("/admin/celery_grousset/outcome/")
        rows = OutcomeAdmin(Outcome, site).get_queryset(request).filter(processor_id=processor)
        age = rows.get().grousset_age
        rows.delete()
        get_store("mysql_tz").close()
    # Then it is seconds, not two hours (or nothing) off
    assert timedelta(0) <= age < timedelta(minutes=1), age


def test_another_journal_database_is_picked_by_its_filter(journal: str, processor: str) -> None:
    from urllib.parse import urlencode

    import tests.tasks  # noqa: F401  (registers a task journaled on "mysql")

    services.require_database("mysql")
    # Given GROUSSET["DATABASE"] on "default" and a task routing its journal to "mysql",
    # a stale claim in each
    rows = {}
    for alias in ("default", "mysql"):
        rows[alias] = put(alias, processor, status="in_flight")
        Outcome.objects.using(alias).filter(pk=rows[alias].pk).update(
            started_at=F("started_at") - timedelta(seconds=61),
            stale_at=F("stale_at") - timedelta(seconds=61),
        )
    user = make_user(superuser=True)
    client = client_for(user)
    # When the journal is listed without and with the journal database filter
    plain = client.get(URL, {"processor": processor}).content.decode()
    other = client.get(URL, {"processor": processor, "db": "mysql"}).content.decode()
    # Then each list shows its own database's row, and the filter offers both databases
    assert listed(plain, rows["default"], rows["mysql"]) == [True, False]
    assert listed(other, rows["default"], rows["mysql"]) == [False, True]
    assert "By journal database" in plain and "?db=mysql" in plain.replace("&amp;", "&")
    # ... the detail page, opened from that list, reads the same database
    kept = urlencode({"_changelist_filters": urlencode({"db": "mysql"})})
    detail = client.get(f"{URL}{rows['mysql'].pk}/change/?{kept}")
    assert detail.status_code == 200 and rows["mysql"].fingerprint in detail.content.decode()
    # ... a name that is not a journal database shows the default one
    bogus = client.get(URL, {"processor": processor, "db": "postgresql"}).content.decode()
    assert listed(bogus, rows["default"], rows["mysql"]) == [True, False]
    # When the release action runs on the list of the other database
    form = {"action": "release_stale_claims", "_selected_action": [rows["mysql"].pk]}
    on_mysql = f"{URL}?db=mysql&processor={processor}"
    client.post(on_mysql, confirmation(client, on_mysql, form))
    # Then it released that database's claim, and the default one's is untouched
    assert Outcome.objects.using("mysql").get(pk=rows["mysql"].pk).status == "failed"
    assert Outcome.objects.using("default").get(pk=rows["default"].pk).status == "in_flight"
    # And the admin's history names the database (its entry has only the row's pk, which
    # may be another row's on the default database: a review)
    assert [m.endswith("(journal database 'mysql')") for m in _log_messages(user, rows["mysql"])
            ] == [True]  # fmt: skip


def test_memo_display_masks_sensitive_keys_secret_keys_and_deep_values() -> None:
    from celery_grousset.shown import shown_json, shown_text

    # A value of any type under a sensitive name is ***, not only strings long enough to mask
    shown = shown_json({"pin": "123", "password": 3.5, "token": None, "secret": ["ab"]},
                       DEFAULT_REDACT_KEYS)  # fmt: skip
    assert shown == {"pin": "***", "password": "***", "token": "***", "secret": "***"}
    # A secret in a key is redacted, and a sensitive value quoted as a nested key is masked
    assert "abcdefghij" not in repr(shown_json({"Bearer abcdefghijklmnopqrstuvwxyz0123": 1},
                                               DEFAULT_REDACT_KEYS))  # fmt: skip
    quoted = shown_json({"password": "hunter22", "by": {"hunter22": 1}}, DEFAULT_REDACT_KEYS)
    assert "hunter22" not in repr(quoted), quoted
    # A memo nested past the display's depth is cut there, not shown raw
    deep: object = {"password": "deep-secret-1"}
    for _ in range(21):
        deep = [deep]
    assert "deep-secret-1" not in repr(shown_json(deep, DEFAULT_REDACT_KEYS))
    # protect()'s key text is redacted as stored
    text = shown_text("key: ", "password=hunter2 Bearer abcdefghijklmnopqrstuvwxyz",
                      DEFAULT_REDACT_KEYS, 200)  # fmt: skip
    assert "hunter2" not in text and "abcdefghij" not in text, text


def test_a_journal_database_that_cannot_be_read_gets_a_page_that_says_so(
    journal: str, processor: str
) -> None:
    """The list of a journal database that could not be reached ended in a server error
    (500, an unhandled OperationalError; a review, with ``?db=`` on a database that was
    down)."""
    import socket

    from django.db import OperationalError, connections

    import tests.tasks  # noqa: F401  (registers a task journaled on "mysql")

    services.require_database("mysql")
    row = put("default", processor)
    client = client_for(make_user(superuser=True))
    viewer = client_for(make_user("view_outcome"))
    conn = connections["mysql"]
    port = conn.settings_dict["PORT"]
    with socket.socket() as sock:  # a port nothing listens on: the connect is refused
        sock.bind(("127.0.0.1", 0))
        closed = str(sock.getsockname()[1])
    conn.close()
    conn.settings_dict["PORT"] = closed
    try:
        # When the list of the "mysql" journal is asked for while it cannot be reached
        resp = client.get(URL, {"db": "mysql", "processor": processor})
        # (and a row's page, and its history: an alert's link ended in a bare 500)
        pages = [client.get(f"{URL}{row.pk}/{page}/", {"db": "mysql"})
                 for page in ("change", "history")]  # fmt: skip
        viewed = viewer.get(URL, {"db": "mysql", "processor": processor})
        # (an action's error is not dressed up: it may have changed rows already)
        form = {"action": "forget_outcomes", "_selected_action": [row.pk], "post": "yes"}
        with pytest.raises(OperationalError):
            client.post(f"{URL}?db=mysql", form)
    finally:
        conn.close()
        conn.settings_dict["PORT"] = port
    # Then the page says which database cannot be read and why, and offers the others
    assert resp.status_code == 503
    body = resp.content.decode()
    assert 'data-grousset-unavailable="mysql"' in body and "OperationalError" in body, body
    assert "?db=default" in body
    for page in pages:
        text = page.content.decode()
        assert page.status_code == 503 and 'data-grousset-unavailable="mysql"' in text
    # And a user who may only view is told that, not the driver's text (its host, port,
    # user name): that is in the server's log
    text = viewed.content.decode()
    assert viewed.status_code == 503 and 'data-grousset-unavailable="mysql"' in text
    assert "OperationalError" not in text and closed not in text, text
    assert "in the server's log" in text
    # And the default journal's list is still shown
    assert row.fingerprint[:12] in client.get(URL, {"processor": processor}).content.decode()
