"""The management commands and the beat task, on PostgreSQL, SQLite and MariaDB.

Journal rows are written by the real claim store (claim, duplicate claims,
finish); ageing moves timestamps back instead of sleeping.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import F
from django.test import override_settings

from celery_grousset import journal, memo
from celery_grousset.claim import ClaimRequest, Kind
from celery_grousset.journal import now as _db_now
from celery_grousset.models import Outcome
from celery_grousset.store.base import Completion, Store
from tests import services

ROOT = Path(__file__).resolve().parent.parent


def req(processor: str, fp: str, **over: Any) -> ClaimRequest:
    values: dict[str, Any] = dict(
        processor_id=processor,
        fingerprint=fp,
        task_name="tests.ops.send_receipt",
        task_id=f"task-{uuid.uuid4().hex}",
        token=uuid.uuid4().hex,
        worker="host:1",
        args_repr="(order_id=42)",
        max_processing_time=60.0,
        expires_after=3600.0,
        max_takeovers=3,
    )
    values.update(over)
    return ClaimRequest(**values)


def new_fp() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


def completed(
    store: Store,
    processor: str,
    fp: str | None = None,
    *,
    value: Any = None,
    duplicates: int = 0,
    **over: Any,
) -> ClaimRequest:
    """A completed entry (memo ``value``) that ``duplicates`` later deliveries asked for."""
    first = req(processor, fp or new_fp(), **over)
    assert store.claim(first).kind is Kind.NEW
    result, enc, error = memo.encode(
        value if value is not None else {"provider_id": "abc"},
        serializer="json",
        memoize=True,
        max_bytes=65536,
    )
    assert store.finish(
        processor, first.fingerprint, first.token, Completion("completed", result, enc, error)
    )
    for _ in range(duplicates):
        assert store.claim(req(processor, first.fingerprint, **over)).kind is Kind.COMPLETED
    return first


def in_flight(store: Store, processor: str, fp: str | None = None, **over: Any) -> ClaimRequest:
    first = req(processor, fp or new_fp(), **over)
    assert store.claim(first).kind is Kind.NEW
    return first


def rows(alias: str, processor: str) -> Any:
    return Outcome.objects.using(alias).filter(processor_id=processor)


def expire(alias: str, processor: str, fp: str, ago: timedelta) -> None:
    rows(alias, processor).filter(fingerprint=fp).update(expires_on=_db_now(alias) - ago)


def run(*args: Any, **options: Any) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def purge_everything_expired(alias: str) -> None:
    """Start from a journal without expired rows (other tests share the database)."""
    journal.purge_expired(alias)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


# -- grousset_purge -----------------------------------------------------------------------


def test_purge_deletes_only_expired_rows(store: Store, alias: str, processor: str) -> None:
    # Given expired completed and failed rows, an unexpired row, and an in-flight row
    # whose retention time has passed (its attempt still holds it)
    purge_everything_expired(alias)
    old_done = completed(store, processor)
    old_failed = in_flight(store, processor)
    store.finish(
        processor,
        old_failed.fingerprint,
        old_failed.token,
        Completion("failed", None, "", "ValueError: boom"),
    )
    fresh = completed(store, processor)
    running = in_flight(store, processor)
    for r in (old_done, old_failed, running):
        expire(alias, processor, r.fingerprint, timedelta(minutes=5))
    # When purged in batches of one
    out = run("grousset_purge", database=alias, batch_size=1)
    # Then only the two expired terminal rows are gone, and the summary says so
    left = set(rows(alias, processor).values_list("fingerprint", flat=True))
    assert left == {fresh.fingerprint, running.fingerprint}
    assert out.startswith(f"purged 2 expired journal entries from {alias!r} in ")


def age(alias: str, processor: str, fp: str, by: timedelta) -> None:
    """Move a claim back in time as a whole (started_at, stale_at, expires_on)."""
    cols = ("started_at", "stale_at", "expires_on")
    rows(alias, processor).filter(fingerprint=fp).update(**{c: F(c) - by for c in cols})


def _purge_with(how: str, alias: str) -> None:
    if how == "journal":
        journal.purge_expired(alias, batch_size=1)
    elif how == "command":
        run("grousset_purge", database=alias, batch_size=1, no_outbox=True)
    else:
        from celery_grousset.tasks import purge_expired

        purge_expired.apply(kwargs={"database": alias, "batch_size": 1, "outbox": False}).get()


@pytest.mark.parametrize("how", ["journal", "command", "beat"])
def test_purge_deletes_abandoned_claims_never_live_ones(
    store: Store, alias: str, processor: str, how: str
) -> None:
    # Given claims (max_processing_time 60 s, expires_after 1 h) whose attempts died:
    # one past expires_on + its max_processing_time, one stale and past expires_on but
    # not yet past expires_on + max_processing_time
    purge_everything_expired(alias)
    abandoned = in_flight(store, processor)
    age(alias, processor, abandoned.fingerprint, timedelta(seconds=3600 + 60 + 5))
    recent = in_flight(store, processor)
    age(alias, processor, recent.fingerprint, timedelta(seconds=3600 + 30))
    # And a live claim whose expires_on was pushed a day back (it is still fresh)
    live = in_flight(store, processor)
    expire(alias, processor, live.fingerprint, timedelta(days=1))
    # Then the dry run counts only the abandoned one
    assert "would purge 1 expired" in run("grousset_purge", database=alias, dry_run=True)
    # When the purge runs (journal.purge_expired, grousset_purge or the beat task)
    _purge_with(how, alias)
    # Then only the abandoned claim is gone
    left = set(rows(alias, processor).values_list("fingerprint", flat=True))
    assert left == {recent.fingerprint, live.fingerprint}
    # And the live attempt still completes its own claim
    assert store.finish(processor, live.fingerprint, live.token, Completion("completed"))


def test_purge_dry_run_deletes_nothing(store: Store, alias: str, processor: str) -> None:
    # Given two expired rows
    purge_everything_expired(alias)
    for _ in range(2):
        expire(alias, processor, completed(store, processor).fingerprint, timedelta(hours=1))
    # When a dry run is asked for
    out = run("grousset_purge", database=alias, dry_run=True)
    # Then it counts them and deletes nothing
    assert "would purge 2 expired journal entries" in out and "dry run" in out
    assert rows(alias, processor).count() == 2


def test_purge_older_than(store: Store, alias: str, processor: str) -> None:
    # Given one row expired two hours ago and one expired ten minutes ago
    purge_everything_expired(alias)
    long_ago, recently = completed(store, processor), completed(store, processor)
    expire(alias, processor, long_ago.fingerprint, timedelta(hours=2))
    expire(alias, processor, recently.fingerprint, timedelta(minutes=10))
    # When purging rows that expired at least an hour ago (parsed like the command line)
    out = run("grousset_purge", "--older-than", "1h", database=alias)
    # Then only the old one is gone
    assert list(rows(alias, processor).values_list("fingerprint", flat=True)) == [
        recently.fingerprint
    ]
    assert out.startswith(f"purged 1 expired journal entry from {alias!r} in")
    # And a bare number means seconds
    run("grousset_purge", older_than="300", database=alias)
    assert rows(alias, processor).count() == 0


def test_purge_shows_progress_on_a_tty(store: Store, alias: str, processor: str) -> None:
    # Given three expired rows
    purge_everything_expired(alias)
    for _ in range(3):
        expire(alias, processor, completed(store, processor).fingerprint, timedelta(hours=1))
    # When purged in batches of two with stderr on a terminal
    tty, out = Tty(), io.StringIO()
    call_command("grousset_purge", database=alias, batch_size=2, stdout=out, stderr=tty)
    # Then a \r progress line counts up to the total, and the summary follows
    progress = tty.getvalue()
    assert "\rpurging [" in progress and "2/3" in progress and "3/3 (100%)" in progress
    assert out.getvalue().startswith("purged 3 expired")


def test_purge_without_database_purges_every_journal_database(processor: str) -> None:
    import tests.tasks  # noqa: F401  (registers a task journaled on "mysql")
    from celery_grousset.store import get_store

    services.require_database("default")
    services.require_database("mysql")
    # Given GROUSSET["DATABASE"] on "default", a task routing its journal to "mysql",
    # and an expired record in each
    expired = {}
    for alias in ("default", "mysql"):
        purge_everything_expired(alias)
        expired[alias] = completed(get_store(alias), processor)
        expire(alias, processor, expired[alias].fingerprint, timedelta(hours=1))
    with override_settings(GROUSSET={"DATABASE": "default"}):
        # When the command runs without --database (as from cron)
        dry = run("grousset_purge", dry_run=True)
        out = run("grousset_purge")
        stats = run("grousset_stats")
    # Then the dry run counted, and the purge deleted, the record of each journal database,
    # each line naming its database (it purged "default" only, and did not say which)
    assert "would purge 1 expired journal entry from 'default'" in dry
    assert "would purge 1 expired journal entry from 'mysql'" in dry
    assert "purged 1 expired journal entry from 'default' in " in out
    assert "purged 1 expired journal entry from 'mysql' in " in out
    assert not rows("default", processor).exists() and not rows("mysql", processor).exists()
    # And grousset_stats, which reads one journal database, names the others
    assert "other journal databases: 'mysql' (pass --database)" in stats, stats


def test_purge_of_every_journal_names_a_tasks_database_missing_from_databases(
    processor: str, temp_task: Any
) -> None:
    from celery_grousset.store import get_store

    services.require_database("default")
    # Given an expired record on "default", and a guarded task whose journal database is
    # not in DATABASES (what check E003 reports; call_command skips the checks)
    purge_everything_expired("default")
    record = completed(get_store("default"), processor)
    expire("default", processor, record.fingerprint, timedelta(hours=1))
    def ghost_task() -> None:
        pass

    temp_task(ghost_task, max_processing_time=30, database="ghost")
    # When the command purges every journal database
    with override_settings(GROUSSET={"DATABASE": "default"}), \
            pytest.raises(CommandError, match="unknown database alias 'ghost'"):
        run("grousset_purge")
    # Then it purged "default" and named the missing one (it stopped on a traceback)
    assert not rows("default", processor).exists()


def test_purge_dry_run_on_a_journal_behind_its_migrations_names_migrate(tmp_path: Path) -> None:
    # Given a journal database migrated only to 0003 (a new SQLite file)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        "GROUSSET_TEST_SQLITE": str(tmp_path / "behind.sqlite3"),
    }
    django = [sys.executable, "-m", "django"]
    subprocess.run([*django, "migrate", "celery_grousset", "0003", "--database", "default"],
                   cwd=ROOT, env=env, capture_output=True, timeout=120, check=True)  # fmt: skip
    # When the dry run checks it (before a deploy)
    proc = subprocess.run(
        [*django, "grousset_purge", "--dry-run", "--database", "default"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    # Then it fails as the real run would, and names the fix (it said "would purge 0")
    assert proc.returncode == 1, proc.stdout
    assert "would purge" not in proc.stdout
    assert "0004" in proc.stderr and "migrate celery_grousset" in proc.stderr, proc.stderr


def test_purge_reports_a_bad_argument_with_exit_code_2() -> None:
    # Given an unknown database alias / When the command runs as a process
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "django", "grousset_purge", "--database", "nope"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then it fails with exit code 2 (a bad argument, as its help says) and says why
    assert proc.returncode == 2
    assert "unknown database alias 'nope'" in proc.stderr
    # And a bad duration is refused too
    with pytest.raises(CommandError, match="invalid duration"):
        run("grousset_purge", older_than="soon")


@pytest.mark.parametrize(
    "argv",
    [
        ["grousset_inspect", "abcdef12"],
        ["grousset_release", "abcdef12"],
        ["grousset_stats"],
        ["grousset_purge", "--dry-run"],
        ["grousset_relay", "--once", "--app", "tests.celeryapp"],
        ["grousset_relay", "--app", "tests.celeryapp"],  # running: must not wait forever
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_commands_on_an_unmigrated_journal_name_migrate(tmp_path: Path, argv: list[str]) -> None:
    # Given a project whose database has never been migrated (a new SQLite file)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        "GROUSSET_TEST_SQLITE": str(tmp_path / "never-migrated.sqlite3"),
    }
    # When a command runs as a process
    proc = subprocess.run(
        [sys.executable, "-m", "django", *argv, "--database", "default"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    # Then it fails with exit code 1 and names the fix, not the driver's traceback
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "tables do not exist: run `manage.py migrate celery_grousset`" in proc.stderr


@pytest.mark.parametrize("action", ["status", "create-ahead", "convert"])
def test_partition_commands_on_an_unmigrated_journal_name_migrate(action: str) -> None:
    from django.db import connections

    from tests.test_checks import database

    services.require_database("postgresql")
    # Given a PostgreSQL database where `migrate` has not run
    name = f"grousset_unmigrated_{uuid.uuid4().hex[:8]}"
    admin = services.pg_connect(host="127.0.0.1", user="postgres", dbname="postgres")
    admin.execute(f"CREATE DATABASE {name}")
    try:
        # When a partition command runs there / Then it names migrate, not "convert"
        with (
            database("unmigrated_pg", **{**connections.settings["postgresql"], "NAME": name}),
            pytest.raises(CommandError, match="migrate celery_grousset --database"),
        ):
            run("grousset_partition", action, database="unmigrated_pg")
    finally:
        services.drop_database("postgresql", name)
        admin.close()


def test_relay_once_with_the_database_down_is_a_clean_error() -> None:
    # Given the outbox's database unreachable (the alias pointed at a closed port)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
           "GROUSSET_TEST_PG_PORT": "1"}  # fmt: skip
    # When `grousset_relay --once` runs
    proc = subprocess.run(
        [sys.executable, "-m", "django", "grousset_relay", "--once", "--app", "tests.celeryapp",
         "--database", "postgresql"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    # Then it exits 1 with one line naming the database, not a traceback
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "could not publish the outbox on 'postgresql'" in proc.stderr


def test_a_project_without_the_app_is_told_to_add_it(tmp_path: Path) -> None:
    # Given a project that guards tasks but left celery_grousset out of INSTALLED_APPS
    # (``manage.py check`` cannot say it: the app's checks are not registered)
    script = f"""
import django
from django.conf import settings
settings.configure(INSTALLED_APPS=[], USE_TZ=True, DATABASES={{"default": {{
    "ENGINE": "django.db.backends.sqlite3", "NAME": {str(tmp_path / "db.sqlite3")!r}}}}})
django.setup()
from celery_grousset.claim import ClaimRequest
from celery_grousset.exceptions import StoreUnavailable
from celery_grousset.store import get_store
req = ClaimRequest("p", "ab" * 32, "t", "id", "tok", "w", "", 60.0, 3600.0, 3)
try:
    get_store("default").claim(req)
except StoreUnavailable as exc:
    print(exc)
"""
    # When a claim meets the missing table
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    # Then the error names INSTALLED_APPS first, then migrate (which alone would fail)
    assert (
        "add 'celery_grousset' to INSTALLED_APPS, then run `manage.py migrate celery_grousset`"
        in proc.stdout
    ), proc.stdout + proc.stderr


def test_beat_task_purges_and_returns_the_count(store: Store, alias: str, processor: str) -> None:
    from celery_grousset.tasks import purge_expired

    # Given two expired rows and one unexpired row
    purge_everything_expired(alias)
    for _ in range(2):
        expire(alias, processor, completed(store, processor).fingerprint, timedelta(hours=1))
    keep = completed(store, processor)
    # When the periodic task runs
    count = purge_expired.apply(kwargs={"database": alias, "batch_size": 1}).get()
    # Then it returns how many it deleted and left the unexpired row alone
    assert count == 2
    assert list(rows(alias, processor).values_list("fingerprint", flat=True)) == [keep.fingerprint]


def test_beat_task_without_a_database_purges_every_journal_database(processor: str) -> None:
    from celery_grousset.checks import journal_databases
    from celery_grousset.store import get_store
    from celery_grousset.tasks import purge_expired

    # Given a task routed to its own journal database (tests.tasks.effect_on_mysql)
    # and an expired row there and in GROUSSET["DATABASE"]
    services.require_database("mysql")
    default = str(settings.GROUSSET["DATABASE"])
    services.require_database(default)
    assert {default, "mysql"} <= set(journal_databases())
    for db in {default, "mysql"}:
        fp = completed(get_store(db), processor).fingerprint
        expire(db, processor, fp, timedelta(hours=1))
    # When the beat task runs as the docs schedule it (no database)
    purge_expired.apply(kwargs={"batch_size": 100}).get()
    # Then both journals were purged
    assert [db for db in {default, "mysql"} if rows(db, processor).exists()] == []


# -- grousset_inspect ---------------------------------------------------------------------


def test_inspect_says_a_completion_without_a_stored_value_as_it_is(
    store: Store, alias: str, processor: str
) -> None:
    """A completed record whose value could not be stored was told as "duplicates get the
    memo below", then "memo (none: ResultNotStored…)" (a review)."""
    # Given a completion whose value JSON cannot encode (a set)
    first = req(processor, new_fp())
    assert store.claim(first).kind is Kind.NEW
    result, enc, error = memo.encode({1, 2}, serializer="json", memoize=True, max_bytes=65536)
    assert store.finish(processor, first.fingerprint, first.token,
                        Completion("completed", result, enc, error))  # fmt: skip
    # When inspected / Then it says the effect ran and what duplicates get instead
    out = run("grousset_inspect", first.task_id, database=alias)
    assert "the effect ran, but its value could not be stored" in out, out
    assert "duplicates raise ResultNotStored" in out and "get the memo below" not in out


def test_inspect_by_task_id_tells_the_story(store: Store, alias: str, processor: str) -> None:
    # Given a completed entry that two duplicate deliveries asked for
    first = completed(store, processor, value={"provider_id": "re_123", "n": 2}, duplicates=2)
    # When inspected by the task id that completed it
    out = run("grousset_inspect", first.task_id, database=alias)
    # Then the story names the fingerprint, status, counts and the memo pretty-printed
    assert f"Journal entry {first.fingerprint}" in out
    assert "completed — duplicates get the memo below" in out
    assert "3 deliveries (2 duplicates, 0 redeliveries or requeues)" in out
    assert re.search(rf"processor +{processor}\n", out)
    assert "(order_id=42)" in out and "host:1" in out
    assert '"provider_id": "re_123"' in out and "\n" in out.split("memo", 1)[1]


def test_inspect_shows_control_characters_as_escapes(
    store: Store, alias: str, processor: str
) -> None:
    # Given an entry whose task id and error text, both from whoever published the call,
    # carry terminal escape sequences (recolour, retitle, move up and clear a line)
    evil = "\x1b[31mred\x1b]0;TITLE\x07\x1b[1A\x1b[2Kstatus completed\r\u202e"
    fp = new_fp()
    for owner in (processor, processor + "-b"):
        first = req(owner, fp, task_id="t-1\nstatus    completed")
        assert store.claim(first).kind is Kind.NEW
        assert store.finish(owner, fp, first.token,
                            Completion("failed", None, "", f"boom {evil}"))  # fmt: skip
    # When inspected (one entry, and the list of both)
    out = run("grousset_inspect", fp, processor_id=processor, database=alias)
    listed = run("grousset_inspect", fp, database=alias)
    # Then no control character reaches the terminal: each shows as its escape
    for text in (out, listed):
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", text), repr(text)
    assert "boom \\x1b[31mred\\x1b]0;TITLE\\x07\\x1b[1A\\x1b[2Kstatus completed\\r\\u202e" in out
    assert re.search(r"task id +t-1\\nstatus    completed\n", out)


def test_release_stats_and_inspect_json_show_control_characters_as_escapes(
    store: Store, alias: str, processor: str
) -> None:
    """grousset_release and grousset_stats printed a worker's or a task's name raw (an
    escape sequence retitled and cleared the terminal); inspect --json a bidi override."""
    evil = "\x1b]0;PWNED\x07\x1b[2J\u202e"
    # Given an entry in flight, its worker and task names carrying escape sequences
    fp = new_fp()
    assert store.claim(req(processor, fp, worker=f"celery@host{evil}",
                           task_name=f"tests.ops.evil{evil}")).owned  # fmt: skip
    # When it is released without --force (refused, naming the holder), counted, inspected
    with pytest.raises(CommandError) as refused:
        run("grousset_release", fp, database=alias)
    stats = run("grousset_stats", processor_id=processor, database=alias)
    as_json = run("grousset_inspect", fp, json=True, database=alias)
    # Then no control character reaches the terminal: each shows as its escape
    for text in (str(refused.value), stats, as_json):
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", text), repr(text)
    assert "celery@host\\x1b]0;PWNED\\x07" in str(refused.value)
    assert "tests.ops.evil\\x1b]0;PWNED" in stats
    assert json.loads(as_json)["worker"] == f"celery@host{evil}"  # (still the JSON of it)


def test_inspect_finds_a_delivery_answered_as_a_duplicate(
    store: Store, alias: str, processor: str
) -> None:
    # Given a completed entry, redelivered once (its own task id), then answered to a
    # duplicate delivery (another task id)
    first = completed(store, processor)
    assert store.claim(req(processor, first.fingerprint, task_id=first.task_id)).kind is (
        Kind.COMPLETED
    )
    dup = req(processor, first.fingerprint)
    assert store.claim(dup).kind is Kind.COMPLETED
    # When inspected by the duplicate's task id (not the row's)
    out = run("grousset_inspect", dup.task_id, database=alias)
    # Then the entry is found, with what happened to that delivery and the counts apart
    assert f"Journal entry {first.fingerprint}" in out
    assert f"this delivery  {dup.task_id}: a duplicate, answered from the memo" in out
    assert "3 deliveries (1 duplicate, 1 redelivery or requeue)" in out
    data = json.loads(run("grousset_inspect", dup.task_id, "--json", database=alias))
    assert data["task_id"] == first.task_id and data["duplicates"] == 1
    assert [d["task_id"] for d in data["this_delivery"]] == [dup.task_id]


def test_inspect_by_prefix_as_json(store: Store, alias: str, processor: str) -> None:
    # Given a completed entry
    first = completed(store, processor, value=[1, "two"], duplicates=1)
    # When inspected by a 10-character fingerprint prefix, as JSON
    data = json.loads(
        run("grousset_inspect", first.fingerprint[:10].upper(), "--json", database=alias)
    )
    # Then the JSON object carries the decoded memo and the counters
    assert data["fingerprint"] == first.fingerprint and data["task_id"] == first.task_id
    assert data["memo"] == [1, "two"] and data["memo_error"] is None
    assert (data["deliveries"], data["duplicates"]) == (2, 1)
    assert data["fence"] == rows(alias, processor).get(fingerprint=first.fingerprint).fence
    assert data["status"] == "completed" and data["expired"] is False


def test_inspect_in_flight_and_unknown(store: Store, alias: str, processor: str) -> None:
    # Given an in-flight entry
    running = in_flight(store, processor)
    # When inspected as JSON / Then there is no memo, and the reason is given
    data = json.loads(run("grousset_inspect", running.fingerprint, json=True, database=alias))
    assert data["memo"] is None and "in flight" in data["memo_error"]
    # And an unknown id or a too-short prefix is an error (exit code 1)
    with pytest.raises(CommandError, match="no journal entry matches") as missing:
        run("grousset_inspect", "no-such-task", database=alias)
    # (naming the other journal databases: tests.tasks.effect_on_mysql has its own)
    assert "other journal databases: " in str(missing.value)
    assert "'mysql'" in str(missing.value) or alias == "mysql"
    with pytest.raises(CommandError, match="at least 8 hex"):
        run("grousset_inspect", running.fingerprint[:6], database=alias)
    # (a pasted log line, however long, is quoted cut, not echoed whole)
    with pytest.raises(CommandError, match="no journal entry matches") as pasted:
        run("grousset_inspect", "x" * 100_000, database=alias)
    assert len(str(pasted.value)) < 1_000 and "chars)" in str(pasted.value)


def test_inspect_lists_several_matches(store: Store, alias: str, processor: str) -> None:
    # Given the same fingerprint completed by two processors
    fp = new_fp()
    completed(store, processor, fp)
    completed(store, processor + "-b", fp)
    # When inspected by fingerprint
    out = run("grousset_inspect", fp, database=alias)
    # Then both are listed; --processor-id picks one
    assert "2 journal entries match" in out
    assert f"processor={processor} " in out and f"processor={processor}-b " in out
    picked = json.loads(
        run("grousset_inspect", fp, json=True, processor_id=processor + "-b", database=alias)
    )
    assert picked["processor_id"] == processor + "-b"
    # And a processor id that matches none is named in the refusal (not "no entry matches")
    with pytest.raises(CommandError, match=rf"in {alias!r} for processor 'nope'"):
        run("grousset_inspect", fp, processor_id="nope", database=alias)


# -- grousset_release ---------------------------------------------------------------------


def test_release_of_a_task_id_points_at_inspect(alias: str, processor: str) -> None:
    # When a task id (not a fingerprint) is given to grousset_release / Then the error
    # says where the fingerprint comes from
    with pytest.raises(CommandError, match=r"not a fingerprint.*grousset_inspect <task id>"):
        run("grousset_release", "0b6d2c1e-9a1f-4c3e-8d2a-1f0e9c8b7a6d", processor_id=processor,
            database=alias)  # fmt: skip


@pytest.mark.parametrize("needle", ["", "   ", "0b6d2c1"])
def test_release_of_an_empty_or_short_fingerprint_touches_nothing(
    store: Store, alias: str, processor: str, needle: str
) -> None:
    """``grousset_release "$FP" --force`` with FP empty forgot a protect() outcome (its task
    id is empty, and every fingerprint starts with ""): the invoice was sent again."""
    # Given a completed protect() outcome (no task id)
    done = completed(store, processor)
    rows(alias, processor).update(task_id="")
    before = rows(alias, processor).get()
    # When grousset_release is given an empty, blank or short fingerprint, forced
    with pytest.raises(CommandError, match=r"not a fingerprint.*8 to 64 hex"):
        run("grousset_release", needle, processor_id=processor, force=True, database=alias)
    # Then nothing was forgotten: a duplicate still gets the memo
    assert rows(alias, processor).get().expires_on == before.expires_on
    assert store.claim(req(processor, done.fingerprint)).kind is Kind.COMPLETED
    # And grousset_inspect finds nothing for an empty needle either
    with pytest.raises(CommandError):
        run("grousset_inspect", needle.strip() or " ", processor_id=processor, database=alias)


def test_release_refuses_a_fresh_claim_without_force(
    store: Store, alias: str, processor: str
) -> None:
    # Given an attempt that holds a fresh claim: it may well be running
    running = in_flight(store, processor)
    before = rows(alias, processor).get(fingerprint=running.fingerprint)
    # When released without --force
    with pytest.raises(CommandError, match=r"may still be running.*--force"):
        run("grousset_release", running.fingerprint, database=alias)
    # Then the claim still holds: a duplicate is told it is in flight, not run
    after = rows(alias, processor).get(fingerprint=running.fingerprint)
    assert (after.status, after.fence, after.claim_token) == ("in_flight", before.fence,
                                                              before.claim_token)  # fmt: skip
    assert store.claim(req(processor, running.fingerprint)).kind is Kind.IN_FLIGHT


def test_release_in_flight_lets_the_next_delivery_run(
    store: Store, alias: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an attempt that holds a fresh claim (it would block duplicates for 60 s), and
    # one whose claim is stale (its worker is gone)
    running = in_flight(store, processor)
    dead = in_flight(store, processor)
    rows(alias, processor).filter(fingerprint=dead.fingerprint).update(
        stale_at=_db_now(alias) - timedelta(seconds=1))  # fmt: skip
    # When the stale one is released, and the fresh one with --force
    with caplog.at_level(logging.WARNING, logger="celery_grousset"):
        assert "was stale" in run("grousset_release", dead.fingerprint, database=alias)
        out = run("grousset_release", running.fingerprint, force=True, database=alias)
    # Then each release left a line in the log (it left none: a review)
    lines = [m for m in caplog.messages if m.startswith("grousset.released ")]
    assert [f"fingerprint={fp}" in m for fp, m in zip(
        (dead.fingerprint, running.fingerprint), lines, strict=True)] == [True, True], lines
    assert all(f"processor={processor} database={alias}" in m for m in lines), lines
    assert store.claim(req(processor, dead.fingerprint)).owned
    # Then the next delivery owns the record at once, with a higher fence
    assert "released the in-flight claim" in out and "still fresh" in out
    fence = rows(alias, processor).get(fingerprint=running.fingerprint).fence
    res = store.claim(req(processor, running.fingerprint))
    assert res.owned and res.kind is Kind.RECLAIM and res.fence > fence
    # And the old holder's completion is refused (fenced out)
    assert not store.finish(
        processor,
        running.fingerprint,
        running.token,
        Completion("completed", b"1", "application/json;utf-8"),
    )


def test_release_leaves_a_stale_claim_its_holder_renewed_after_the_plan(
    store: Store, alias: str, processor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan saw the claim stale, its holder renewed it (a WORKER_CLAIM pre-claim
    starting late), then the release freed it by token alone: the next delivery ran the
    effect beside the holder."""
    from celery_grousset import journal

    # Given a stale claim whose holder renews it right after the command has planned
    late = in_flight(store, processor)
    rows(alias, processor).filter(fingerprint=late.fingerprint).update(
        stale_at=_db_now(alias) - timedelta(seconds=1))  # fmt: skip
    plan = journal.release_plan

    def plan_then_renewed(rec: Any, at: Any) -> tuple[bool, str]:
        planned = plan(rec, at)
        assert store.renew(late)  # (the holder's renewal: same token, fresh again)
        return planned

    monkeypatch.setattr(journal, "release_plan", plan_then_renewed)
    # When it is released without --force / Then the command refuses, naming the renewal
    with pytest.raises(CommandError, match=r"renewed by its attempt meanwhile"):
        run("grousset_release", late.fingerprint, database=alias)
    # And the claim still holds: a duplicate is told it is in flight, not run
    after = rows(alias, processor).get(fingerprint=late.fingerprint)
    assert (after.status, after.claim_token) == ("in_flight", late.token)
    assert store.claim(req(processor, late.fingerprint)).kind is Kind.IN_FLIGHT


def test_release_says_a_holders_completion_before_any_new_claim_is_recorded(
    store: Store, alias: str, processor: str
) -> None:
    # Given a stale claim whose holder is still running after all
    slow = in_flight(store, processor)
    rows(alias, processor).filter(fingerprint=slow.fingerprint).update(
        stale_at=_db_now(alias) - timedelta(seconds=1))  # fmt: skip
    # When it is released / Then the command says what becomes of the holder's completion
    # (it said "will be refused", whatever came next)
    out = run("grousset_release", slow.fingerprint, database=alias)
    assert "refused once a delivery has claimed the call again" in out, out
    assert "before that, it is recorded" in out, out
    # And so it is: completing before any new claim records it, and a duplicate gets it
    done = Completion("completed", b"7", "application/json;utf-8")
    assert store.finish(processor, slow.fingerprint, slow.token, done)
    assert store.claim(req(processor, slow.fingerprint)).kind is Kind.COMPLETED


def test_release_refuses_completed_without_force(store: Store, alias: str, processor: str) -> None:
    # Given a completed entry
    done = completed(store, processor)
    before = rows(alias, processor).get()
    # When released without --force
    with pytest.raises(CommandError, match="Pass --force"):
        run("grousset_release", done.fingerprint, database=alias)
    # Then nothing changed: a duplicate still gets the memo
    assert rows(alias, processor).get().expires_on == before.expires_on
    assert store.claim(req(processor, done.fingerprint)).kind is Kind.COMPLETED
    # When forced
    out = run("grousset_release", done.fingerprint, force=True, database=alias)
    # Then it is forgotten: the next delivery runs again, with a higher fence
    assert "forgot the completed outcome" in out
    assert "completed it was acknowledged" in out and "a failed delivery" not in out, out
    res = store.claim(req(processor, done.fingerprint))
    assert res.owned and res.kind is Kind.EXPIRED and res.fence > before.fence


def test_forget_leaves_a_given_up_row_its_attempt_completed_since_it_was_read(
    store: Store, alias: str, processor: str
) -> None:
    """A given-up row's holder may still complete it; a forget based on a read of the
    given-up row wiped that completed outcome (a second charge once published again)."""
    from celery_grousset import journal as ops

    # Given a claim taken over max_takeovers (0) times: the duplicate gave up on it
    fp = new_fp()
    slow = req(processor, fp, max_takeovers=0)
    assert store.claim(slow).owned
    rows(alias, processor).update(stale_at=_db_now(alias) - timedelta(seconds=1))
    assert store.claim(req(processor, fp, max_takeovers=0)).kind is Kind.GAVE_UP
    read = rows(alias, processor).get()
    # When its attempt, only slow, completes before the operator's forget lands
    done = Completion("completed", b'"charged"', "application/json;utf-8")
    assert store.finish(processor, fp, slow.token, done)
    # Then the forget of the row as read leaves it: the completed outcome stands
    assert ops.forget(read, alias) is None
    after = rows(alias, processor).get()
    assert (after.status, after.expires_on) == ("completed", read.expires_on)
    assert store.claim(req(processor, fp)).kind is Kind.COMPLETED


def test_release_needs_processor_when_several_hold_it(
    store: Store, alias: str, processor: str
) -> None:
    # Given one fingerprint in flight for two processors
    fp = new_fp()
    in_flight(store, processor, fp)
    in_flight(store, processor + "-b", fp)
    # When released without --processor-id / Then it refuses and lists both
    with pytest.raises(CommandError, match="Pass --processor-id") as err:
        run("grousset_release", fp, database=alias)
    assert processor in str(err.value) and f"{processor}-b" in str(err.value)
    # When a processor is named / Then only its record is released
    run("grousset_release", fp, processor_id=processor, force=True, database=alias)
    statuses = dict(
        Outcome.objects.using(alias).filter(fingerprint=fp).values_list("processor_id", "status")
    )
    assert statuses == {processor: "failed", f"{processor}-b": "in_flight"}


# -- grousset_stats -----------------------------------------------------------------------


def test_stats_numbers(store: Store, alias: str, processor: str) -> None:
    # Given: 2 completed (one with 3 duplicates), 1 failed, 1 stale and 1 fresh claim,
    # and 1 entry taken over once
    completed(store, processor, duplicates=3)
    completed(store, processor, task_name="tests.ops.other")
    failed = in_flight(store, processor)
    store.finish(
        processor, failed.fingerprint, failed.token, Completion("failed", None, "", "ValueError: x")
    )
    stale = in_flight(store, processor)
    rows(alias, processor).filter(fingerprint=stale.fingerprint).update(
        started_at=F("started_at") - timedelta(hours=2),
        stale_at=F("stale_at") - timedelta(hours=2),
    )
    in_flight(store, processor)
    taken = in_flight(store, processor, task_name="tests.ops.other")
    rows(alias, processor).filter(fingerprint=taken.fingerprint).update(
        started_at=F("started_at") - timedelta(seconds=61),
        stale_at=F("stale_at") - timedelta(seconds=61),
    )
    assert (
        store.claim(req(processor, taken.fingerprint, task_name="tests.ops.other")).kind
        is Kind.TAKEOVER
    )
    # When the stats are asked for, as JSON, for this processor
    data = json.loads(run("grousset_stats", json=True, processor_id=processor, database=alias))
    # Then the numbers add up (stale: past the claim's own max_processing_time)
    assert data["entries"] == 6
    assert data["by_status"] == {"in_flight": 3, "completed": 2, "failed": 1}
    # (the takeover by another delivery is neither a duplicate nor the row's first claim)
    assert data["deliveries"] == 10 and (data["duplicates"], data["redeliveries"]) == (3, 1)
    assert data["takeovers"] == 1 and data["entries_taken_over"] == 1
    assert data["stale_claims"] == 1 and data["stale_after_seconds"] is None
    by_task = {t["task_name"]: t for t in data["by_task"]}
    assert by_task["tests.ops.send_receipt"]["entries"] == 4
    assert by_task["tests.ops.send_receipt"]["duplicates"] == 3
    assert by_task["tests.ops.other"]["takeovers"] == 1
    # And --stale-after overrides the threshold: nothing is in flight for 3 hours
    assert (
        json.loads(
            run(
                "grousset_stats",
                "--stale-after",
                "10800",
                json=True,
                processor_id=processor,
                database=alias,
            )
        )["stale_claims"]
        == 0
    )
    # And the text report carries the same numbers
    text = run("grousset_stats", processor_id=processor, database=alias)
    assert "entries      6 (in_flight 3, completed 2, failed 1)" in text
    assert "deliveries   10 (3 duplicates answered or deferred; 1 redelivery, requeue" in text
    assert "stale claims 1 in the counted entries" in text
    # And a list by age (--stale-after 1s: fresh claims too) does not tell the operator
    # that grousset_release frees each of them (it refuses a fresh one without --force)
    young = run("grousset_stats", "--stale-after", "1", processor_id=processor, database=alias)
    assert "frees only those past their own deadline" in young, young
    assert "frees one" not in young and "frees one" in text, young
    # And the grousset_release it names reads the journal database the report read:
    # --database when it is not GROUSSET["DATABASE"] (a review: pasted as shown, it
    # looked in the other one)
    other = "postgresql" if alias == "default" else "default"
    for journal_db, cmd in ((alias, "grousset_release"),
                            (other, f"grousset_release --database {alias}")):  # fmt: skip
        with override_settings(GROUSSET={"DATABASE": journal_db}):
            shown = run("grousset_stats", processor_id=processor, database=alias)
        assert f"  {cmd} <fingerprint> frees one" in shown.replace(";", " "), shown


def test_every_command_accepts_skip_checks(alias: str) -> None:
    # Given a deploy script that passes --skip-checks to every management command
    for name in ("grousset_stats", "grousset_purge"):
        out = io.StringIO()
        # When it runs the package's commands / Then each accepts it
        call_command(name, "--skip-checks", "--database", alias, stdout=out)
        assert out.getvalue(), name


def test_an_unknown_journal_database_names_where_it_came_from(alias: str) -> None:
    from celery_grousset.exceptions import ConfigurationError
    from celery_grousset.store import get_store

    # Given a database argument naming no alias, GROUSSET['DATABASE'] a good one
    with pytest.raises(ConfigurationError) as refused:
        get_store("nope")
    # Then the error names the alias and where it came from, not the setting
    text = str(refused.value)
    assert "the journal database 'nope' (a task's database option" in text, text
    assert "GROUSSET['DATABASE'] is" not in text, text


def test_stats_count_the_last_day_unless_asked_for_more(
    store: Store, alias: str, processor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_grousset.management.commands import grousset_stats

    # Given an entry started now, one started 2 days ago and two started 10 days ago
    # that expired 3 days ago
    completed(store, processor)
    old = completed(store, processor)
    rows(alias, processor).filter(fingerprint=old.fingerprint).update(
        started_at=F("started_at") - timedelta(days=2)
    )
    for _ in range(2):
        gone = completed(store, processor)
        rows(alias, processor).filter(fingerprint=gone.fingerprint).update(
            started_at=F("started_at") - timedelta(days=10)
        )
        expire(alias, processor, gone.fingerprint, timedelta(days=3))

    def stats(*argv: str) -> dict[str, Any]:
        return dict(json.loads(run("grousset_stats", *argv, json=True, processor_id=processor,
                                   database=alias)))  # fmt: skip

    # When the stats are asked for without a window / Then only the last day's entry counts
    day = stats()
    assert day["entries"] == 1
    assert day["since_seconds"] == 86400.0 and day["since"]
    assert day["by_status"]["completed"] == 1 and day["by_task"][0]["entries"] == 1
    # And the expired entries are those of the whole journal
    assert (day["expired"], day["expired_capped"]) == (2, False)
    # And --since widens the window, --all counts every entry
    assert stats("--since", "3d")["entries"] == 2
    every = stats("--all")
    assert (every["entries"], every["since"], every["since_seconds"]) == (4, None, None)
    # And the text says what it counted
    text = run("grousset_stats", processor_id=processor, database=alias)
    assert "counted      the entries started in the last 1 d (since " in text
    assert "entries      1 (in_flight 0, completed 1, failed 0)" in text
    all_text = run("grousset_stats", "--all", processor_id=processor, database=alias)
    assert "counted      every entry (--all)" in all_text and "entries      4 (" in all_text
    # And without --all the expired count stops at its cap, and says so
    monkeypatch.setattr(grousset_stats, "EXPIRED_CAP", 1)
    assert (stats()["expired"], stats()["expired_capped"]) == (1, True)
    assert "expired      1+ (in the whole journal" in run(
        "grousset_stats", processor_id=processor, database=alias
    )
    assert (stats("--all")["expired"], stats("--all")["expired_capped"]) == (2, False)


def test_stats_list_the_stale_claims_started_before_the_window(
    store: Store, alias: str, processor: str
) -> None:
    # Given a claim stuck for 3 days (its worker died), older than the default window
    stuck = in_flight(store, processor)
    rows(alias, processor).filter(fingerprint=stuck.fingerprint).update(
        started_at=F("started_at") - timedelta(days=3), stale_at=F("stale_at") - timedelta(days=3)
    )
    in_flight(store, processor)  # and a fresh claim, in the window
    # When the stats are asked for (the default: the last day)
    data = json.loads(run("grousset_stats", json=True, processor_id=processor, database=alias))
    # Then the window counts no stale claim, and the journal's stale claim is listed
    assert data["stale_claims"] == 0
    assert [r["fingerprint"] for r in data["stale"]] == [stuck.fingerprint]
    text = run("grousset_stats", processor_id=processor, database=alias)
    assert "stale now    in the whole journal (all 1;" in text
    assert f"    {stuck.fingerprint[:16]}  {stuck.task_name}  started " in text
    # And when there is none, it says so
    run("grousset_release", stuck.fingerprint, processor_id=processor, database=alias)
    again = run("grousset_stats", processor_id=processor, database=alias)
    assert "stale now    none in the whole journal" in again


def test_stats_with_a_bad_setting_is_a_clear_command_error(migrated_default: str) -> None:
    # Given a GROUSSET setting out of range (grousset_stats skips the system checks)
    # When the stats are asked for / Then a command error names it, not a traceback
    with (
        override_settings(GROUSSET={"STORE_TIMEOUT": -3}),
        pytest.raises(CommandError, match="STORE_TIMEOUT must be a duration above 0"),
    ):
        run("grousset_stats", database=migrated_default)


def test_stats_answer_on_a_project_whose_system_checks_fail(migrated_default: str) -> None:
    from django.core import checks

    from celery_grousset.management.commands.grousset_stats import Command

    def broken(**kwargs: Any) -> list[checks.CheckMessage]:
        return [checks.Error("a broken project", id="tests.E999")]

    # Given a project whose system checks report an error (and take their time to)
    checks.register(broken)
    try:
        # When the read-only report is asked for, as `manage.py grousset_stats` runs it
        out, command = io.StringIO(), Command(stdout=io.StringIO())
        parser = command.create_parser("manage.py", "grousset_stats")
        options = vars(parser.parse_args(["--database", migrated_default]))
        command.execute(**options | {"stdout": out, "skip_checks": False})
        text = out.getvalue()
    finally:
        checks.registry.registry.registered_checks.discard(broken)
    # Then it answers: a journal report does not run the project's checks first
    assert "celery-grousset journal on 'default'" in text


# -- argument validation (issue 16, defect 12) --------------------------------------------


@pytest.fixture
def migrated_default() -> str:
    """The SQLite journal, migrated: a refused argument must not be mistaken for a
    missing table."""
    services.require_database("default")
    return "default"


@pytest.mark.parametrize(
    ("argv", "options", "option"),
    [
        (["--older-than", "999999d"], {}, "--older-than"),
        (["--older-than", "99999999999d"], {}, "--older-than"),
        (["--older-than", "9" * 400], {}, "--older-than"),
        ([], {"older_than": "99999999999d"}, "--older-than"),
        ([], {"older_than": -5}, "--older-than"),
        ([], {"older_than": float("nan")}, "--older-than"),
        ([], {"older_than": float("inf")}, "--older-than"),
        ([], {"older_than": timedelta(days=-1)}, "--older-than"),
        (["--batch-size", "0"], {}, "--batch-size"),
        (["--batch-size", "-3"], {}, "--batch-size"),
        (["--outbox-only", "--batch-size", "0"], {}, "--batch-size"),
        (["--outbox-only"], {"batch_size": 0}, "--batch-size"),
        (["--outbox-only", "--dry-run"], {"batch_size": -1}, "--batch-size"),
        (["--batch-size", "10000000000"], {}, "--batch-size"),
    ],
)
def test_purge_refuses_bad_arguments_with_what_is_allowed(
    migrated_default: str, argv: list[str], options: dict[str, Any], option: str
) -> None:
    # Given an out-of-range argument, on the command line or through call_command
    # When the purge runs / Then it is a CommandError naming the option and the range
    with pytest.raises(CommandError) as info:
        run("grousset_purge", *argv, database=migrated_default, **options)
    message = str(info.value)
    assert option in message and "must be" in message, message


@pytest.mark.parametrize(
    ("argv", "options", "option", "needle"),
    [
        (["--stale-after", "nan"], {}, "--stale-after", "must be"),
        (["--stale-after", "inf"], {}, "--stale-after", "must be"),
        (["--stale-after", "-1"], {}, "--stale-after", "must be"),
        (["--stale-after", "0"], {}, "--stale-after", "must be"),
        (["--stale-after", "1e400"], {}, "--stale-after", "must be"),
        (["--stale-after", "soon"], {}, "--stale-after", "must be"),
        ([], {"stale_after": float("nan")}, "--stale-after", "must be"),
        ([], {"stale_after": "inf"}, "--stale-after", "must be"),
        ([], {"stale_after": 10**12}, "--stale-after", "must be"),
        (["--since", "0"], {}, "--since", "must be"),
        (["--since", "soon"], {}, "--since", "must be"),
        (["--since", "99999999999d"], {}, "--since", "must be"),
        ([], {"since": float("nan")}, "--since", "must be"),
        (["--since", "1h", "--all"], {}, "--since", "exclude each other"),
    ],
)
def test_stats_refuses_bad_durations_with_what_is_allowed(
    migrated_default: str, argv: list[str], options: dict[str, Any], option: str, needle: str
) -> None:
    with pytest.raises(CommandError) as info:
        run("grousset_stats", *argv, database=migrated_default, **options)
    message = str(info.value)
    assert option in message and needle in message, message


def test_good_arguments_still_work(migrated_default: str) -> None:
    # Given arguments at the edges of what is allowed / Then they are accepted
    assert "would purge" in run(
        "grousset_purge", "--older-than", "36500d", "--dry-run", database=migrated_default
    )
    assert "would purge" in run(
        "grousset_purge", "--older-than", "0", "--dry-run", "--batch-size", "1",
        database=migrated_default,
    )  # fmt: skip
    assert "stale claims" in run(
        "grousset_stats", "--stale-after", "0.5", database=migrated_default
    )
    assert "stale claims" in run("grousset_stats", stale_after="2h", database=migrated_default)


def test_the_tools_read_the_journal_under_use_tz_false(
    store: Store, alias: str, processor: str
) -> None:
    """USE_TZ = False with TIME_ZONE = "UTC" (which E012 accepts): the database clock came
    back aware and the ORM's times naive, so inspect, release and the gauges raised
    TypeError, and on MySQL the purge and the stats raised ValueError."""
    # Given a fresh claim, read by a project that keeps naive datetimes (in UTC)
    running = in_flight(store, processor)
    with override_settings(USE_TZ=False, TIME_ZONE="UTC"):
        # Then the database clock is naive as the ORM's times are, and every tool reads
        assert journal.now(alias).tzinfo is None
        data = json.loads(run("grousset_inspect", running.fingerprint, json=True, database=alias))
        assert "in flight" in data["memo_error"]
        with pytest.raises(CommandError, match="fresh"):  # not released without --force
            run("grousset_release", running.fingerprint, database=alias)
        assert journal.gauges(alias)["grousset_stale_claims"] >= 0
        run("grousset_purge", database=alias)
        assert "in_flight" in run("grousset_stats", database=alias)
    assert rows(alias, processor).get().status == "in_flight"


def test_stats_refuse_a_naive_clock_in_another_zone_as_the_purge_does(alias: str) -> None:
    """grousset_stats runs none of the other system checks (a read-only report); under
    E012 it printed expiry and stale figures off by the UTC offset, where grousset_purge
    and the workers refuse to start."""
    # Given a project that keeps naive datetimes in a zone other than UTC
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        # When the report runs with its checks (as from the shell; call_command skips them)
        # Then it refuses, naming the check and the fix
        with pytest.raises(CommandError, match=r"USE_TZ is False.*USE_TZ = True.*E012"):
            run("grousset_stats", database=alias, skip_checks=False)
        # and --skip-checks skips it, as Django's own option does
        assert "celery-grousset journal" in run("grousset_stats", database=alias)


def test_a_time_in_another_zone_is_printed_in_utc() -> None:
    """A PostgreSQL alias with its own TIME_ZONE hands the ORM aware times in that zone:
    grousset_inspect printed them with their local digits and a "UTC" label."""
    from datetime import datetime, timezone
    from zoneinfo import ZoneInfo

    from celery_grousset.management import timestamp

    at = datetime(2026, 12, 4, 19, 31, 40, 739000, tzinfo=ZoneInfo("Asia/Kolkata"))
    assert timestamp(at) == "2026-12-04 14:01:40.739 UTC"
    assert timestamp(at.astimezone(timezone.utc).replace(tzinfo=None)) == timestamp(at)
