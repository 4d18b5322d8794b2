"""System checks (``manage.py check``): each one fires on a misconfigured setup and
stays silent on a good one.

Task checks look at every active Celery app. The misconfigured apps here are made
inside each test (without the Django fixup) and must be gone afterwards, or their
errors would leak into any other test that runs the checks.
"""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import subprocess
import sys
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from django.core import checks
from django.test import override_settings

from celery_grousset import GroussetTask
from celery_grousset.exceptions import GroussetError
from tests import services
from tests.services import extra_database as database

ROOT = Path(__file__).resolve().parent.parent
TAG = "celery_grousset"


@pytest.fixture(autouse=True)
def no_nested_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test app's Django fixup runs the system checks whenever its task modules are
    imported, which the task checks do: skip that nested run."""
    monkeypatch.setenv("CELERY_SKIP_CHECKS", "1")


@pytest.fixture
def make_app() -> Iterator[Callable[..., Celery]]:
    """Celery apps for one test; they must not outlive it (asserted)."""
    apps: list[Celery] = []
    refs: list[weakref.ref[Celery]] = []

    def make(task_cls: type | None = None, **conf: Any) -> Celery:
        app = Celery(f"grousset-checks-{uuid.uuid4().hex[:8]}", set_as_current=False, fixups=[],
                     **({"task_cls": task_cls} if task_cls else {}))  # fmt: skip
        app.conf.update(
            {
                "broker_url": "memory://",
                "task_acks_late": True,
                "task_reject_on_worker_lost": True,
                **conf,
            }
        )
        apps.append(app)
        refs.append(weakref.ref(app))
        return app

    yield make
    from celery import _state

    from celery_grousset.task import reset_resolved_options

    for app in apps:  # a logged traceback may still hold one: make sure none stays active
        _state._apps.discard(app)  # type: ignore[attr-defined]
    apps.clear()
    reset_resolved_options()  # resolved tasks are remembered until settings change
    gc.collect()
    active = {id(app) for app in _state._get_active_apps()}  # type: ignore[attr-defined]
    assert not any(ref() is not None and id(ref()) in active for ref in refs)


def guarded(app: Celery, **options: Any) -> str:
    """Register a guarded task on ``app`` (on no other app); return its name."""
    name = f"checks.{uuid.uuid4().hex[:8]}"

    def body() -> None:
        """A task body that is never run."""

    app.task(base=GroussetTask, shared=False, name=name, **options)(body)
    return name


def ids(obj: str | None = None, **kwargs: Any) -> set[str]:
    """Ids of the celery_grousset messages about ``obj`` (None: not about a task)."""
    return {
        m.id
        for m in checks.run_checks(tags=[TAG], **kwargs)
        if m.id and m.id.startswith(TAG) and m.obj == obj
    }


# -- task checks --------------------------------------------------------------------------


def test_good_task_is_silent(make_app: Callable[..., Celery]) -> None:
    # Given a guarded task configured as documented (Redis visibility above its claim)
    app = make_app(
        broker_url="redis://127.0.0.1:6379/13",
        broker_transport_options={"visibility_timeout": 3600},
    )
    name = guarded(app, max_processing_time=60, time_limit=30)
    # When the checks run / Then nothing is said about it
    assert ids(name) == set()


def test_missing_max_processing_time_is_E001(make_app: Callable[..., Celery]) -> None:
    # Given a guarded task without max_processing_time (and no GROUSSET default)
    name = guarded(make_app())
    # When the checks run / Then it is an error whose fix is the decorator's option
    assert ids(name) == {"celery_grousset.E001"}
    [e001] = [m for m in checks.run_checks(tags=[TAG]) if m.obj == name]
    assert "the task decorator (max_processing_time=<seconds>)" in (e001.hint or "")
    # ... not the worker flag, which sets it only in its own worker (checks, migrate and
    # a web process never see it)
    assert "--grousset-max-processing-time" not in e001.msg
    assert "only inside that worker" in (e001.hint or "")
    # And a GROUSSET default satisfies it
    with override_settings(GROUSSET={"MAX_PROCESSING_TIME": 30}):
        assert ids(name) == set()


def test_time_limit_not_below_max_processing_time_is_E002(
    make_app: Callable[..., Celery],
) -> None:
    # Given tasks whose hard time limit is not below their claim (task / app level)
    at_limit = guarded(make_app(), max_processing_time=60, time_limit=60)
    app_level = guarded(make_app(task_time_limit=120), max_processing_time=60)
    below = guarded(make_app(), max_processing_time=60, time_limit=59)
    # When the checks run / Then both are errors; a limit below the claim is fine
    assert ids(at_limit) == {"celery_grousset.E002"}
    assert ids(app_level) == {"celery_grousset.E002"}
    assert ids(below) == set()


def test_visibility_timeout_below_max_processing_time_is_W001(
    make_app: Callable[..., Celery],
) -> None:
    # Given a Redis broker that redelivers after 10 s
    app = make_app(
        broker_url="redis://127.0.0.1:6379/13", broker_transport_options={"visibility_timeout": 10}
    )
    long_claim = guarded(app, max_processing_time=60)
    short_claim = guarded(app, max_processing_time=5)
    # When the checks run / Then only the task whose claim outlasts it is warned about
    assert ids(long_claim) == {"celery_grousset.W001"}
    assert ids(short_claim) == set()


@pytest.mark.parametrize(
    ("broker_url", "options"),
    [("sqs://", {}),  # kombu's SQS default is 1800 s, not Redis's 3600 s
     (["redis://127.0.0.1:6379/13", "redis://127.0.0.1:6380/13"], {"visibility_timeout": 10}),
     ("redis://127.0.0.1:6379/13;redis://127.0.0.1:6380/13", {"visibility_timeout": 10}),
     ("redis+socket:///tmp/redis.sock", {"visibility_timeout": 10})],  # (kombu: redis)
)  # fmt: skip
def test_w001_reads_sqs_default_and_failover_urls(
    make_app: Callable[..., Celery], broker_url: Any, options: dict[str, Any]
) -> None:
    # Given an SQS broker with its default visibility timeout, or failover Redis URLs
    app = make_app(broker_url=broker_url, broker_transport_options=options)
    # When a task's claim outlasts it / Then W001 says so
    assert ids(guarded(app, max_processing_time=3000)) == {"celery_grousset.W001"}


def test_acks_late_off_is_W002(make_app: Callable[..., Celery]) -> None:
    # Given a guarded task that acknowledges before running (app default), on a Redis
    # broker whose visibility_timeout is shorter than its claim
    app = make_app(
        task_acks_late=False,
        broker_url="redis://127.0.0.1:6379/13",
        broker_transport_options={"visibility_timeout": 10},
    )
    name = guarded(app, max_processing_time=60)
    # When the checks run / Then it is a warning; W003 does not apply without acks_late,
    # and W001 neither: a message acked as its body starts is not redelivered while it runs
    assert ids(name) == {"celery_grousset.W002"}


def test_W002_names_a_namespace_that_hides_the_acks_late_setting(
    make_app: Callable[..., Celery],
) -> None:
    """With CELERY_TASK_ACKS_LATE = True in the settings and an app configured under
    another namespace, W002's hint said to set CELERY_TASK_ACKS_LATE: already done."""
    from django.test import override_settings

    # Given the settings' CELERY_TASK_ACKS_LATE, and an app reading another namespace
    app = make_app(task_acks_late=False)
    app.namespace = "CELERYX"
    name = guarded(app, max_processing_time=60)
    with override_settings(CELERY_TASK_ACKS_LATE=True):
        found = [m for m in checks.run_checks(tags=[TAG]) if m.obj == name]
    # When the checks run / Then W002's hint names the namespace, not the setting
    hint = next(m.hint for m in found if m.id == "celery_grousset.W002")
    assert "does not read it" in (hint or "") and "'CELERYX'" in (hint or ""), hint
    assert "namespace='CELERY'" in (hint or ""), hint
    # (and without the setting, the usual fix)
    with override_settings(CELERY_TASK_ACKS_LATE=False):
        again = [m for m in checks.run_checks(tags=[TAG]) if m.obj == name]
    assert next(m.hint for m in again if m.id == "celery_grousset.W002") == (
        "Set acks_late=True on the task or CELERY_TASK_ACKS_LATE = True."
    )


def test_reject_on_worker_lost_off_is_W003(make_app: Callable[..., Celery]) -> None:
    # Given a late-acking task whose killed child's message would be acked as failed
    name = guarded(make_app(), max_processing_time=60, reject_on_worker_lost=False)
    # When the checks run / Then it is a warning
    assert ids(name) == {"celery_grousset.W003"}


# -- settings and database checks ---------------------------------------------------------


def test_beat_task_whose_key_cannot_vary_is_W008(make_app: Callable[..., Celery]) -> None:
    from celery.schedules import BaseSchedule, crontab

    class Opaque(BaseSchedule):  # no remaining_estimate: beat cannot name a slot
        def is_due(self, last_run_at: Any) -> Any:
            return False, 60.0

    app = make_app()
    slot_off = guarded(app, max_processing_time=60, periodic_slot=False)
    opaque = guarded(app, max_processing_time=60)
    daily = guarded(app, max_processing_time=60)
    not_scheduled = guarded(app, max_processing_time=60, periodic_slot=False)
    # Given beat entries: a task keyed by its arguments alone, a schedule without a due
    # time, and a crontab task with the default periodic_slot (good)
    app.conf.beat_schedule = {
        "report": {"task": slot_off, "schedule": 60.0, "args": ("all",)},
        "opaque": {"task": opaque, "schedule": Opaque()},
        "daily": {"task": daily, "schedule": crontab(hour=6, minute=0), "args": ("x",)},
    }
    # When the checks run / Then W008 names the two whose runs would all share one key
    assert ids(slot_off) == ids(opaque) == {"celery_grousset.W008"}
    assert ids(daily) == ids(not_scheduled) == set()
    [message] = [m for m in checks.run_checks(tags=[TAG]) if m.obj == slot_off]
    assert "'report'" in message.msg and "periodic_slot" in message.msg


def test_a_beat_entry_whose_schedule_is_not_one_leaves_the_other_checks_running(
    make_app: Callable[..., Celery],
) -> None:
    """``"schedule": "crontab(hour=6)"`` (a str) turned every task check into one E014
    that named neither the entry nor the setting."""
    app = make_app(task_acks_late=False)
    name = guarded(app, max_processing_time=60)
    # Given a beat entry of a guarded task whose schedule is a str
    app.conf.beat_schedule = {"report": {"task": name, "schedule": "crontab(hour=6)"}}
    # When the checks run / Then the task's own checks still do (W002), and no E014
    found = {m.id for m in checks.run_checks(tags=[TAG])}
    assert "celery_grousset.W002" in ids(name) and "celery_grousset.E014" not in found


def test_a_beat_entry_left_with_celery_once_options_is_E022(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()
    left, clean = (guarded(app, max_processing_time=60) for _ in "ab")
    # Given an entry that still sends celery-once's per-call option (refused at publish)
    app.conf.beat_schedule = {
        "left": {"task": left, "schedule": 60.0, "options": {"once": {"graceful": True}}},
        "clean": {"task": clean, "schedule": 60.0, "options": {"queue": "q"}},
    }
    # Then the checks name it, before beat fails to send each run
    assert (ids(left), ids(clean)) == ({"celery_grousset.E022"}, set())
    [message] = [m for m in checks.run_checks(tags=[TAG]) if m.obj == left]
    assert "'left'" in message.msg and "Remove 'once'" in (message.hint or "")


def test_beat_task_with_arguments_evaluated_per_run_is_not_W008(
    make_app: Callable[..., Celery],
) -> None:
    from celery.beat import BeatLazyFunc

    app = make_app()
    lazy, fixed = (guarded(app, max_processing_time=60, periodic_slot=False) for _ in "ab")
    # Given an entry whose argument beat evaluates anew at each run, and one whose not
    app.conf.beat_schedule = {
        "lazy": {"task": lazy, "schedule": 5.0, "args": (BeatLazyFunc(str),)},
        "fixed": {"task": fixed, "schedule": 5.0, "kwargs": {"n": 1}},
    }
    # Then only the fixed one's key cannot vary
    assert (ids(lazy), ids(fixed)) == (set(), {"celery_grousset.W008"})


_PERIODIC_TASKS = """
import django, json, sys
django.setup()
import tests.celeryapp  # the app whose guarded tasks the checks see
from django.core import checks
from django.core.management import call_command

def w008():
    found = checks.run_checks(databases=["default"], tags=[checks.Tags.database])
    wanted = ("celery_grousset.W008", "celery_grousset.E014")  # E014: a check that raised
    return sorted([m.id, m.obj] for m in found if m.id in wanted)

before = w008()  # django-celery-beat installed, its tables not created yet
call_command("migrate", "django_celery_beat", verbosity=0)
from django_celery_beat.models import CrontabSchedule, PeriodicTask
daily = CrontabSchedule.objects.create(minute="0", hour="6")
PeriodicTask.objects.create(name="nightly", task="tests.tasks.effect", crontab=daily)
PeriodicTask.objects.create(name="off", task="tests.tasks.login", crontab=daily, enabled=False)
PeriodicTask.objects.create(name="plain", task="celery.backend_cleanup", crontab=daily)
json.dump({"before": before, "after": w008()}, sys.stdout)
"""


def test_django_celery_beat_rows_whose_key_cannot_vary_are_W008(tmp_path: Path) -> None:
    try:
        import django_celery_beat  # noqa: F401  (in the dev extra)
    except ImportError:
        services.unavailable("django-celery-beat", "it is not installed (pip install -e .[dev])")
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "CELERY_SKIP_CHECKS": "1",
        "DJANGO_SETTINGS_MODULE": "tests.beat_db_settings",
        "GROUSSET_TEST_SQLITE": str(tmp_path / "beat.sqlite3"),
    }  # fmt: skip
    # Given django-celery-beat installed, PERIODIC_SLOT off, and (once migrated) enabled
    # rows for a guarded task and a plain one, and a disabled row for a guarded one
    proc = subprocess.run(
        [sys.executable, "-c", _PERIODIC_TASKS], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Then before its tables exist the check is silent (and queries nothing missing), and
    # afterwards W008 names the guarded task of the enabled row only
    assert json.loads(proc.stdout) == {
        "before": [], "after": [["celery_grousset.W008", "tests.tasks.effect"]]
    }


def test_test_settings_are_silent() -> None:
    # Given the test settings (GROUSSET valid, journal on a supported database)
    # When the checks run / Then no settings or database message
    assert ids(None) == set()


def test_grousset_not_a_dict_is_E004() -> None:
    # Given settings.GROUSSET that is not a dict
    with override_settings(GROUSSET=["DATABASE", "default"]):
        # When the checks run
        messages = checks.run_checks(tags=[TAG])
    # Then it is the one error reported
    assert [m.id for m in messages] == ["celery_grousset.E004"]
    assert "must be a dict" in messages[0].msg


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ON_IN_FLIGHT", "sometimes"),
        ("CLAIM_COMMIT", "sometimes"),
        ("EXPIRES_AFTER", None),
        ("EXPIRES_AFTER", -1),
        ("BYPASS", "false"),
        ("REDACT_KEYS", "pin_code"),
        ("MAX_RESULT_BYTES", "256KB"),
        ("MAX_PROCESSING_TIME", "abc"),
        ("MAX_PROCESSING_TIME", -60),
        ("STORE_TIMEOUT", "x"),
        ("STORE_TIMEOUT", 0),
    ],
)
def test_invalid_grousset_value_is_E010(name: str, value: object) -> None:
    # Given a bad value in settings.GROUSSET
    with override_settings(GROUSSET={name: value}):
        # When the checks run (the database check too: it reads GROUSSET["DATABASE"])
        messages = checks.run_checks(tags=[TAG])
        db_messages = checks.run_checks(databases=["default"], tags=[checks.Tags.database])
    # Then it is the one error reported, under its own id, naming the setting and the fix
    assert [m.id for m in messages] == ["celery_grousset.E010"], [m.msg for m in messages]
    assert name in messages[0].msg and messages[0].hint
    # And the database check does not crash (it leaves the report to E010)
    assert not [m for m in db_messages if (m.id or "").startswith(TAG)]


def test_unknown_grousset_key_is_E011_naming_the_closest_key() -> None:
    # Given a misspelt key
    with override_settings(GROUSSET={"MAX_PROCESING_TIME": 60}):
        # When the checks run
        messages = checks.run_checks(tags=[TAG])
        db_messages = checks.run_checks(databases=["default"], tags=[checks.Tags.database])
    # Then it is an error under its own id that names the key that was meant
    assert [m.id for m in messages] == ["celery_grousset.E011"]
    assert "'MAX_PROCESING_TIME'" in messages[0].msg
    assert "MAX_PROCESSING_TIME" in (messages[0].hint or "")
    # And the database check does not crash on it (it used to raise)
    assert not [m for m in db_messages if (m.id or "").startswith(TAG)]


@pytest.mark.parametrize("time_zone", ["Asia/Tokyo", "America/New_York", "Europe/London", None])
def test_naive_local_datetimes_are_E012(time_zone: str | None) -> None:
    # Given USE_TZ = False with a time zone other than UTC
    with override_settings(USE_TZ=False, TIME_ZONE=time_zone):
        # When the checks run
        messages = [m for m in checks.run_checks(tags=[TAG]) if m.id == "celery_grousset.E012"]
    # Then it is an error that says why and how to fix it
    assert len(messages) == 1
    assert "USE_TZ" in messages[0].msg and "expir" in messages[0].msg
    assert "USE_TZ = True" in (messages[0].hint or "")


@pytest.mark.parametrize(
    ("alias", "zone", "refused"),
    [("default", "Asia/Kolkata", True), ("mysql", "America/New_York", True),
     ("postgresql", "Asia/Kolkata", False), ("mysql", "UTC", False)],
)  # fmt: skip
def test_a_journal_database_storing_local_times_is_E016(
    alias: str, zone: str, refused: bool
) -> None:
    """A MySQL or SQLite journal database with its own TIME_ZONE: the store wrote UTC,
    Django read local times, and the purge deleted a record completed seconds before."""
    from django.db import connections

    # Given the journal database's DATABASES entry names a time zone
    entry = connections.settings[alias]
    before = entry.get("TIME_ZONE")
    entry["TIME_ZONE"] = zone
    try:
        with override_settings(GROUSSET={"DATABASE": alias}):
            messages = [m for m in checks.run_checks(tags=[TAG]) if m.id == "celery_grousset.E016"]
    finally:
        entry["TIME_ZONE"] = before
    # Then a MySQL/SQLite journal storing local times is refused, naming the fix;
    # PostgreSQL (time zones stored) and UTC are not
    assert len(messages) == int(refused)
    if refused:
        assert zone in messages[0].msg and "purge" in messages[0].msg
        assert f"Remove TIME_ZONE from DATABASES[{alias!r}]" in (messages[0].hint or "")


@pytest.mark.parametrize(
    ("use_tz", "time_zone"), [(False, "UTC"), (True, "Asia/Tokyo"), (True, "UTC")]
)
def test_aware_or_utc_datetimes_are_not_E012(use_tz: bool, time_zone: str) -> None:
    with override_settings(USE_TZ=use_tz, TIME_ZONE=time_zone):
        assert "celery_grousset.E012" not in ids(None)


@pytest.mark.parametrize(
    "options",
    [
        {"expires_after": -1},
        {"expires_after": "7d"},
        {"on_in_flight": "sometimes"},
        {"on_failure": "forget"},
        {"max_processing_time": float("nan")},
        {"max_processing_time": "abc"},
        {"max_processing_time": 10**12},
        {"transactional": "false"},  # a str: "false" would have turned it on
        {"memoize": 0},
        {"max_result_bytes": -5},
        {"max_takeovers": -1},
        {"processor_id": ""},
        {"database": ""},
    ],
)
def test_invalid_task_option_is_E013_not_E001(
    make_app: Callable[..., Celery], options: dict[str, Any]
) -> None:
    # Given a guarded task with a bad option (max_processing_time set, or bad itself)
    name = guarded(make_app(), **{"max_processing_time": 60, **options})
    # When the checks run / Then it is reported as an invalid option, not a missing one
    messages = [m for m in checks.run_checks(tags=[TAG]) if m.obj == name]
    assert [m.id for m in messages] == ["celery_grousset.E013"], [m.msg for m in messages]
    assert next(iter(options)) in messages[0].msg


def test_every_invalid_option_of_a_task_is_named_at_once(
    make_app: Callable[..., Celery]
) -> None:
    # Given a guarded task with three bad options
    name = guarded(make_app(), max_processing_time=60, memoize=0, max_takeovers=-1,
                   on_failure="forget")  # fmt: skip
    # When the checks run
    messages = [m for m in checks.run_checks(tags=[TAG]) if m.obj == name]
    # Then one E013 names all three (not one per `check` run, fix after fix)
    assert [m.id for m in messages] == ["celery_grousset.E013"], [m.msg for m in messages]
    for option in ("memoize", "max_takeovers", "on_failure"):
        assert option in messages[0].msg, messages[0].msg


def test_unreadable_sqlite_journal_is_W007_not_a_crash(tmp_path: Path) -> None:
    # Given a SQLite journal whose file cannot be opened
    path = tmp_path / "missing-dir" / "journal.sqlite3"
    with (
        database("unreadable", ENGINE="django.db.backends.sqlite3", NAME=str(path)),
        override_settings(GROUSSET={"DATABASE": "unreadable"}),
    ):
        # When the database checks run on it
        messages = checks.run_checks(databases=["unreadable"], tags=[checks.Tags.database])
    # Then a warning says the journal could not be inspected (no traceback)
    found = [m for m in messages if (m.id or "").startswith(TAG)]
    assert [m.id for m in found] == ["celery_grousset.W007"]
    assert "unreadable" in found[0].msg


@contextmanager
def sqlite_journal(path: Path, alias: str, **overrides: Any) -> Iterator[None]:
    """A journal alias of the test's own on the SQLite file ``path`` (made, in WAL mode,
    when missing), set as ``GROUSSET["DATABASE"]``; ``overrides``: more settings."""
    if not path.exists():
        sqlite3.connect(path).execute("PRAGMA journal_mode=WAL").close()
    with (
        database(alias, ENGINE="django.db.backends.sqlite3", NAME=str(path)),
        override_settings(GROUSSET={"DATABASE": alias}, **overrides),
    ):
        yield


def test_a_journal_database_without_its_table_is_W009_until_migrate(tmp_path: Path) -> None:
    from django.core.management import call_command

    # Given a journal database where `migrate` has not run
    with sqlite_journal(tmp_path / "journal.sqlite3", "unmigrated"):
        # When its database checks run (`check --database unmigrated`)
        found = checks.run_checks(databases=["unmigrated"], tags=[checks.Tags.database])
        # Then a warning names the missing table and the command that creates it
        [w009] = [m for m in found if m.id == "celery_grousset.W009"]
        assert "celery_grousset_outcome" in w009.msg and "'unmigrated'" in w009.msg
        assert "migrate celery_grousset --database unmigrated" in (w009.hint or "")
        # And it is a warning, so `migrate` (which runs these checks first) is not stopped
        call_command("migrate", "celery_grousset", database="unmigrated", verbosity=0)
        again = checks.run_checks(databases=["unmigrated"], tags=[checks.Tags.database])
    assert "celery_grousset.W009" not in {m.id for m in again}


def test_migrate_on_another_database_names_the_journal_left_unmigrated(
    tmp_path: Path,
) -> None:
    import io

    from django.core.management import call_command

    # Given a journal on its own database, and `migrate` run without --database
    with sqlite_journal(tmp_path / "journal.sqlite3", "left"):
        out = io.StringIO()
        call_command("migrate", "celery_grousset", verbosity=1, stdout=out)
        # Then it names the journal database and the command that creates its tables
        assert "the journal database 'left'" in out.getvalue(), out.getvalue()
        assert "migrate celery_grousset --database left" in out.getvalue()
        # And once that ran, it says nothing more (nor with --verbosity 0)
        call_command("migrate", "celery_grousset", database="left", verbosity=0)
        again = io.StringIO()
        call_command("migrate", "celery_grousset", verbosity=1, stdout=again)
    assert "journal database" not in again.getvalue(), again.getvalue()


class ForgetfulRouter:
    """Sends nothing anywhere, and lets ``migrate`` create tables on ``default`` only (a
    project's router that forgot the journal's app)."""

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == "default"


def test_a_router_that_refuses_the_journal_s_migrations_is_named_with_the_fix(
    tmp_path: Path,
) -> None:
    from django.core.management import call_command

    # Given a journal database on which a router refuses the journal's migrations: the
    # very `migrate` that W009 names records them without creating the tables
    path = tmp_path / "journal.sqlite3"
    with sqlite_journal(path, "routed", DATABASE_ROUTERS=[f"{__name__}.ForgetfulRouter"]):
        call_command("migrate", "celery_grousset", database="routed", verbosity=0)
        # When its database checks run
        found = checks.run_checks(databases=["routed"], tags=[checks.Tags.database])
        # Then W009 names the router, and the steps that recover from what it recorded
        [w009] = [m for m in found if m.id == "celery_grousset.W009"]
        hint = w009.hint or ""
        assert "allow_migrate() refuses app 'celery_grousset' on 'routed'" in hint
        assert "migrate celery_grousset zero --fake --database routed" in hint
        # (and the other way out, where the router means the journal to live: "default")
        assert "set GROUSSET['DATABASE'] = 'default'" in hint, hint
        # (and does not say that `migrate` is about to fix it: under this router it is not)
        assert "about to fix it" not in hint, hint
    # And those steps, once the router allows it, create the tables: W009 goes
    with sqlite_journal(path, "routed", DATABASE_ROUTERS=[]):
        call_command("migrate", "celery_grousset", "zero", fake=True, database="routed",
                     verbosity=0)  # fmt: skip
        call_command("migrate", "celery_grousset", database="routed", verbosity=0)
        again = checks.run_checks(databases=["routed"], tags=[checks.Tags.database])
    assert "celery_grousset.W009" not in {m.id for m in again}


def test_a_task_given_guard_options_without_the_guard_is_W011(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()
    # Given a plain task given guard options (base=GroussetTask forgotten), a plain task
    # without them, and a guarded one
    forgot, plain = f"checks.{uuid.uuid4().hex[:8]}", f"checks.{uuid.uuid4().hex[:8]}"


    def body() -> None:
        """A task body that is never run."""

    app.task(shared=False, name=forgot, max_processing_time=30, transactional=True)(body)
    app.task(shared=False, name=plain, acks_late=True)(body)
    ok = guarded(app, max_processing_time=30, transactional=True)
    # When the checks run / Then only the first is a warning naming its options and the fix
    assert ids(forgot) == {"celery_grousset.W011"}
    [message] = [m for m in checks.run_checks(tags=[TAG]) if m.obj == forgot]
    assert "max_processing_time, transactional" in message.msg
    assert "base=GroussetTask" in (message.hint or "") and "GROUSSET['TASKS']" in message.hint
    assert ids(plain) == set() and ids(ok) == set()
    # And naming it in GROUSSET["TASKS"] guards it: the warning goes
    with override_settings(GROUSSET={"TASKS": {forgot: {}}}):
        assert ids(forgot) == set()


def test_an_app_whose_own_tasks_are_guarded_is_E023(make_app: Callable[..., Celery]) -> None:
    # Given an app whose task class is a guarded class (Celery makes its own tasks,
    # celery.chord_unlock among them, from it), and one that guards its tasks by base=
    everything = make_app(task_cls=type("Everything", (GroussetTask,), {"max_processing_time": 30}))
    mine = make_app()
    guarded(mine, max_processing_time=30)
    for app in (everything, mine):
        app.finalize()  # (Celery's own tasks are registered)
    # When the checks run
    found = [m for m in checks.run_checks(tags=[TAG]) if m.id == "celery_grousset.E023"]
    # Then the first app is an error naming its own tasks it guards and the fix; not the other
    assert [m.msg.split("'")[1] for m in found] == [everything.main], found
    assert "celery.chord_unlock" in found[0].msg or "celery.backend_cleanup" in found[0].msg
    assert "task_cls" in found[0].msg and "base=GroussetTask" in (found[0].hint or "")
    # And none for an app that names one of Celery's tasks in GROUSSET["TASKS"] (guarded
    # on purpose, as the settings allow)
    with override_settings(GROUSSET={"MAX_PROCESSING_TIME": 30,
                                     "TASKS": {"celery.backend_cleanup": {}}}):  # fmt: skip
        again = [m for m in checks.run_checks(tags=[TAG]) if m.id == "celery_grousset.E023"]
    assert [m.msg.split("'")[1] for m in again] == [everything.main], again


def test_a_base_that_takes_calls_around_the_guard_is_E024_or_W022(
    make_app: Callable[..., Celery],
) -> None:
    from celery import Task

    app = make_app()

    class Timed(Task):  # a project's base: runs the body itself (Celery allows it)
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self.run(*args, **kwargs)

    class Careful(Task):  # runs the body itself, naming the package's error only
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return self.run(*args, **kwargs)
            except GroussetError:
                raise

    class Routed(Task):  # publishes through send_task, with its own routing
        def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
            return self.app.send_task(self.name, args, kwargs, **options)

    def wrapped(method: Any) -> Any:  # a decorator without functools.wraps
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        return wrapper

    class Passing(Task):  # passes the call on, from inside a wrapper and a lambda
        @wrapped
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return super().__call__(*args, **kwargs)

        def apply_async(self, *args: Any, **kwargs: Any) -> Any:
            send = lambda: super(Passing, self).apply_async(*args, **kwargs)  # noqa: E731
            return send()

    def task_on(*bases: type) -> str:
        name = f"checks.{uuid.uuid4().hex[:8]}"

        def body() -> None:
            """A task body that is never run."""

        base = type("Base", bases, {"max_processing_time": 30})
        app.task(base=base, shared=False, name=name, acks_late=True)(body)
        return name

    class Project(GroussetTask):  # a project's guarded base, and one that calls it by name
        pass

    class Named(Project):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return Project.__call__(self, *args, **kwargs)

    import types

    from celery_grousset import conf

    GroussetBases = bases = types.ModuleType("bases")  # a module of bases, imported as
    bases.Project = Project  # type: ignore[attr-defined]

    class Aliased(Task):  # calls a guarded class through a module (import … as …)
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return GroussetBases.Project.__call__(self, *args, **kwargs)

    class Moduled(Task):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return bases.Project.__call__(self, *args, **kwargs)

    class Settled(Task):  # runs the body itself; names a Grousset… error of a module's
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return self.run(*args, **kwargs)
            except conf.GroussetSettingsError:
                raise

    class Mentions(Task):  # runs the body itself; only mentions a guarded class
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(self, GroussetTask):
                raise TypeError("not guarded")
            return self.run(*args, **kwargs)

    pkg = types.ModuleType("pkg")  # a package whose bases module holds the guarded class
    pkg.bases = bases  # type: ignore[attr-defined]

    class Deep(Task):  # calls a guarded class two modules deep
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return pkg.bases.Project.__call__(self, *args, **kwargs)

    class Mixin(Task):  # passes the call on
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return super().__call__(*args, **kwargs)

    class Inherits(Mixin):  # Mixin's __call__, inherited
        pass

    class Heir(Task):  # calls the __call__ Inherits inherits: on, if Inherits is before
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return Inherits.__call__(self, *args, **kwargs)

    Shortcut = type("Shortcut", (Timed, GroussetTask), {})  # guarded, but Timed's __call__

    class Cutter(Task):  # calls a guarded class by name whose __call__ skips the guard
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return Shortcut.__call__(self, *args, **kwargs)

    class Gets(Task):  # passes the call on, the method got by its name
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(super(), "__call__")(*args, **kwargs)  # noqa: B004, B009

    class Caller(Task):  # calls Mixin's by name: on to the guard if Mixin comes before it
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return Mixin.__call__(self, *args, **kwargs)

    # Given guarded tasks whose bases put those classes before the guard, or after it
    timed, routed = task_on(Timed, GroussetTask), task_on(Routed, GroussetTask)
    careful, settled = task_on(Careful, GroussetTask), task_on(Settled, GroussetTask)
    mentions, skips = task_on(Mentions, GroussetTask), task_on(Caller, GroussetTask, Mixin)
    cutter = task_on(Cutter, GroussetTask)
    fine = [task_on(GroussetTask, Timed), task_on(GroussetTask, Routed),
            task_on(Passing, GroussetTask), task_on(Named),
            task_on(Aliased, GroussetTask), task_on(Moduled, GroussetTask),
            task_on(Deep, GroussetTask), task_on(Caller, Mixin, GroussetTask),
            task_on(Gets, GroussetTask), task_on(Heir, Inherits, GroussetTask)]  # fmt: skip
    # When the checks run / Then a __call__ that runs the body around the guard is an
    # error (the worker does not start), an apply_async that drops the key a warning,
    # each naming the class, the method and the fix
    assert ids(timed) == {"celery_grousset.E024"} and ids(routed) == {"celery_grousset.W022"}
    # (a Grousset… name that is not a guarded class is not a call on)
    assert ids(careful) == ids(settled) == {"celery_grousset.E024"}
    # (nor is a mention of one, a call by name of a base that passes it on but comes
    # after the guard — its super() is the guard's next class —, or of a guarded class
    # whose __call__ is a base's that skips the guard)
    assert ids(mentions) == ids(skips) == ids(cutter) == {"celery_grousset.E024"}
    found = {m.obj: m for m in checks.run_checks(tags=[TAG]) if m.obj in (timed, routed)}
    assert "Timed.__call__ comes before the guard" in found[timed].msg
    assert "unguarded" in found[timed].msg and "list GroussetTask first" in found[timed].hint
    assert "Routed.apply_async" in found[routed].msg and "idempotency_key" in found[routed].msg
    # And none for the same classes listed after the guard, or that pass the call on
    assert [ids(name) for name in fine] == [set()] * 10


def test_a_tasks_entry_that_selects_no_task_is_W017_naming_the_task_meant(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()
    prefix = f"checks{uuid.uuid4().hex[:8]}"

    def body() -> None:
        """A task body that is never run."""

    # Given registered tasks and GROUSSET["TASKS"] entries: one misspells a task's name
    # (that task runs unguarded), one is a pattern that selects nothing, two select tasks
    app.task(shared=False, name=f"{prefix}.send_receipt", acks_late=True)(body)
    app.task(shared=False, name=f"{prefix}.refund", acks_late=True)(body)
    tasks = {f"{prefix}.send_reciept": {}, f"{prefix}.mail.*": {}, f"{prefix}.refund": {},
             f"{prefix}.ref*": {}, "celery.*": {}}  # fmt: skip
    with override_settings(GROUSSET={"MAX_PROCESSING_TIME": 30, "TASKS": tasks}):
        # When the checks run
        found = [m for m in checks.run_checks(tags=[TAG]) if m.id == "celery_grousset.W017"]
    # Then each entry that selects nothing is a warning, the typo naming the task meant
    by_entry = {m.obj: m for m in found}
    assert set(by_entry) == {f"GROUSSET['TASKS'][{prefix + '.send_reciept'!r}]",
                             f"GROUSSET['TASKS'][{prefix + '.mail.*'!r}]",
                             "GROUSSET['TASKS']['celery.*']"}  # fmt: skip
    # ... a pattern over Celery's own tasks says that patterns never select them
    assert "never selects Celery's" in by_entry["GROUSSET['TASKS']['celery.*']"].msg
    typo = by_entry[f"GROUSSET['TASKS'][{prefix + '.send_reciept'!r}]"]
    assert f"Did you mean {prefix + '.send_receipt'!r}?" in typo.msg
    assert "runs unguarded" in typo.msg and "inspect registered" in (typo.hint or "")
    assert "Did you mean" not in by_entry[f"GROUSSET['TASKS'][{prefix + '.mail.*'!r}]"].msg


def test_a_task_whose_signature_a_decorator_hid_is_W018(make_app: Callable[..., Celery]) -> None:
    import functools

    app = make_app()

    def logged(fn: Callable[..., Any], keep: bool) -> Callable[..., Any]:
        def inner(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return functools.wraps(fn)(inner) if keep else inner

    def charge(order_id: int, amount: int = 10) -> None:
        """Never run."""

    def register(fn: Callable[..., Any], **options: Any) -> str:
        name = f"checks.{uuid.uuid4().hex[:8]}"
        app.task(base=GroussetTask, shared=False, name=name, max_processing_time=60,
                 **options)(fn)  # fmt: skip
        return name

    # Given a task behind a decorator without functools.wraps, one with it, and one keyed
    hidden, kept = register(logged(charge, False)), register(logged(charge, True))
    keyed = register(logged(charge, False), grousset_key=lambda bound: str(bound))
    # Then only the first is W018: f(1) and f(order_id=1) would be two calls
    assert ids(hidden) == {"celery_grousset.W018"}
    assert ids(kept) == set() and ids(keyed) == set()


def test_a_default_the_fingerprint_cannot_encode_is_W020(make_app: Callable[..., Celery]) -> None:
    app = make_app()
    unset = object()

    def charge(order_id: int, gateway: object = unset, note: str = "") -> None:
        """Never run."""

    def plain(order_id: int, note: str = "", cents: int | None = None) -> None:
        """Never run."""

    names = []
    for fn in (charge, plain):
        names.append(f"checks.{uuid.uuid4().hex[:8]}")
        app.task(base=GroussetTask, shared=False, name=names[-1], max_processing_time=60)(fn)
    # Then a sentinel default is W020 (every call that leaves it out would be refused)
    [message] = [m for m in checks.run_checks(tags=[TAG]) if m.obj == names[0]]
    assert message.id == "celery_grousset.W020" and "'gateway'" in message.msg
    assert ids(names[1]) == set()


class _LedgerTo:
    """A router that writes the test project's models to one database."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return self.alias


def test_a_transactional_task_whose_journal_its_models_miss_is_W019(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()
    # Given transactional tasks journaled on "postgresql" and on "default", while the
    # project's models are written to "default" (no router)
    away = guarded(app, max_processing_time=60, transactional=True, database="postgresql")
    guarded(app, max_processing_time=60, transactional=True, database="default")

    def w019() -> list[checks.CheckMessage]:
        return [m for m in checks.run_checks(tags=[TAG]) if m.id == "celery_grousset.W019"]

    # Then W019 names the journal database their writes miss, and the task
    [message] = w019()
    assert message.obj == "postgresql" and away in message.msg and "'default'" in message.msg
    # And none once a router writes the models where the journal is
    with override_settings(DATABASE_ROUTERS=[_LedgerTo("postgresql")]):
        found = w019()
    assert [m.obj for m in found] == ["default"]
    # And a router that raises outside a request (a tenant router) is no check error
    with override_settings(DATABASE_ROUTERS=[_Tenant()]):
        messages = checks.run_checks(tags=[TAG])
    assert not [m for m in messages if m.id in ("celery_grousset.E014", "celery_grousset.W019")]


class _Tenant:
    """A router that needs a request's tenant."""

    def db_for_write(self, model: Any, **hints: Any) -> str:
        raise RuntimeError("no tenant selected")


def test_expires_after_not_above_max_processing_time_is_W014(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()
    # Given a task whose record's window (from its claim) is shorter than an attempt may
    # run, a unit slip in GROUSSET (7 meant as days), and a task with a sound window
    short = guarded(app, max_processing_time=30, expires_after=2)
    slip = guarded(app, max_processing_time=60)
    sound = guarded(app, max_processing_time=30, expires_after=31)
    with override_settings(GROUSSET={"EXPIRES_AFTER": 7}):
        # When the checks run / Then the first two are warned about, naming both values
        assert ids(short) == {"celery_grousset.W014"} and ids(slip) == {"celery_grousset.W014"}
        [message] = [m for m in checks.run_checks(tags=[TAG]) if m.obj == short]
        assert "expires_after (2s)" in message.msg and "max_processing_time (30s)" in message.msg
        assert ids(sound) == set()


def test_a_misspelt_task_option_is_E022_naming_the_option(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()
    # Given guarded tasks whose decorators misspell an option: Celery keeps the keyword as
    # a class attribute nobody reads (here GROUSSET's MAX_PROCESSING_TIME would apply)
    with override_settings(GROUSSET={"MAX_PROCESSING_TIME": 2}):
        slow = guarded(app, max_procesing_time=600)
        keyed = guarded(app, max_processing_time=30, grousset_keys=("order_id",))
        # ... and tasks with attributes of their own that read like no option
        own = guarded(app, max_processing_time=30, processor="stripe", transaction=None,
                      max_retries=5, processing_time=5, in_flight=0, grousset_kye=len)  # fmt: skip
        # When the checks run / Then each misspelling is an error naming what was meant
        # (the worker does not start with a weaker guard than the task asks for)
        assert ids(slow) == {"celery_grousset.E022"}
        assert ids(keyed) == {"celery_grousset.E022"}
        messages = {m.obj: m for m in checks.run_checks(tags=[TAG]) if m.obj in (slow, keyed)}
        assert all(m.is_serious() for m in messages.values())
        assert "'max_procesing_time'" in messages[slow].msg
        assert "did you mean 'max_processing_time'" in messages[slow].msg
        assert "'grousset_key'" in (messages[keyed].hint or "")
        assert ids(own) == set()
        # Given the options of the libraries a project moves from, left on a guarded task
        once = guarded(app, once={"keys": ["order_id"], "timeout": 600})
        single = guarded(app, unique_on=["order_id"], lock_expiry=600, raise_on_duplicate=True)
        # Then each is an error naming what replaces it
        msgs = [m for m in checks.run_checks(tags=[TAG]) if m.obj in (once, single)]
        assert {m.id for m in msgs} == {"celery_grousset.E022"} and len(msgs) == 4
        assert all(m.is_serious() for m in msgs)
        text = " | ".join(m.msg + " " + (m.hint or "") for m in msgs)
        for attr, ours in (("once", "Replace 'once' with grousset_key"),
                           ("unique_on", "Replace 'unique_on' with grousset_key"),
                           ("lock_expiry", "Replace 'lock_expiry' with max_processing_time"),
                           ("raise_on_duplicate", "Remove 'raise_on_duplicate': nothing "
                            "replaces it")):  # fmt: skip
            assert f"given {attr!r}, an option of celery-once / celery-singleton" in text
            assert ours in text, text
        # And none of them claims a default max_processing_time the task does not have
        # (each task here sets its own: a review)
        assert "default max_processing_time" not in text, text
        assert "a duplicate's delivery gets the first call's result" in text, text
        assert "max_processing_time (its timeout)" in text, text  # (once's timeout too)
        # And a task half moved (its grousset_key set beside once=) is told the key it has
        half = guarded(app, once={"keys": ["order_id"]}, grousset_key=("order_id",))
        [message] = [m for m in checks.run_checks(tags=[TAG])
                     if m.obj == half and m.id == "celery_grousset.E022"]  # fmt: skip
        assert "keyed by the task's grousset_key" in message.msg, message.msg
        assert "all its arguments" not in message.msg, message.msg
        # Given a misspelling beside the option it meant: the task's own value is said
        both = guarded(app, max_procesing_time=60, max_processing_time=30)
        [message] = [m for m in checks.run_checks(tags=[TAG]) if m.obj == both]
        assert "would run with the task's own 'max_processing_time'" in message.msg


def test_unknown_or_unsupported_journal_database_is_E003() -> None:
    # Given GROUSSET["DATABASE"] naming no alias
    with override_settings(GROUSSET={"DATABASE": "nope"}):
        # When the checks run / Then it is an error
        assert ids(None) == {"celery_grousset.E003"}
        # And it is said once, however many guarded tasks the project has
        found = [m.id for m in checks.run_checks(tags=[TAG]) if m.id == "celery_grousset.E003"]
        assert found == ["celery_grousset.E003"]
    # Given an alias on an engine the claim store does not support
    with (
        database("oracle_journal", ENGINE="django.db.backends.oracle", NAME="x"),
        override_settings(GROUSSET={"DATABASE": "oracle_journal"}),
    ):
        # Then it is an error too
        assert ids(None) == {"celery_grousset.E003"}


def test_a_task_journal_database_not_in_databases_is_E003(
    make_app: Callable[..., Celery],
) -> None:
    # Given a guarded task whose own journal database names no alias
    name = guarded(make_app(), max_processing_time=60, database="nope")
    # When the checks run / Then it is an error about that task, naming the alias
    messages = [m for m in checks.run_checks(tags=[TAG]) if m.obj == name]
    assert [m.id for m in messages] == ["celery_grousset.E003"], [m.msg for m in messages]
    assert "'nope'" in messages[0].msg


def test_a_silenced_error_does_not_stop_the_worker(
    make_app: Callable[..., Celery], monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_grousset import checks as grousset_checks
    from celery_grousset.worker import refuse_configuration_errors

    # Given a guarded task whose hard time limit is not below its max_processing_time
    # (and only its messages: other tests' tasks may be registered in this process)
    name = guarded(make_app(), max_processing_time=10, time_limit=20)
    every = grousset_checks.check_tasks
    monkeypatch.setattr(grousset_checks, "check_tasks",
                        lambda: [m for m in every() if m.obj == name])  # fmt: skip
    # When a worker starts / Then it refuses, unless the project silenced that check
    with pytest.raises(SystemExit):
        refuse_configuration_errors()
    with override_settings(SILENCED_SYSTEM_CHECKS=["celery_grousset.E002"]):
        refuse_configuration_errors()


def test_mysql_repeatable_read_is_W004() -> None:
    from django.db import connections

    mysql = connections.settings["mysql"]
    # Given a MySQL journal at REPEATABLE READ
    rr = {**mysql, "OPTIONS": {**mysql["OPTIONS"], "isolation_level": "repeatable read"}}
    with database("mysql_rr", **rr), override_settings(GROUSSET={"DATABASE": "mysql_rr"}):
        # When the checks run / Then it is a warning
        assert ids(None) == {"celery_grousset.W004"}
    # ... and so is None, which leaves the server's default (REPEATABLE READ) in force
    server = {**mysql, "OPTIONS": {**mysql["OPTIONS"], "isolation_level": None}}
    with database("mysql_rr", **server), override_settings(GROUSSET={"DATABASE": "mysql_rr"}):
        assert ids(None) == {"celery_grousset.W004"}
    # And the test settings' READ COMMITTED is fine
    with override_settings(GROUSSET={"DATABASE": "mysql"}):
        assert ids(None) == set()


def test_a_task_journal_database_at_repeatable_read_is_W004_too() -> None:
    from django.db import connections

    import tests.tasks  # noqa: F401  (effect_on_mysql: database="mysql")

    mysql = connections.settings["mysql"]
    rr = {**mysql, "OPTIONS": {**mysql["OPTIONS"], "isolation_level": "repeatable read"}}
    # Given GROUSSET["DATABASE"] elsewhere, and a task whose own journal database (its
    # `database` option) runs at REPEATABLE READ
    with database("mysql", **rr), override_settings(GROUSSET={"DATABASE": "default"}):
        # When the checks run / Then that database is warned about
        found = [m for m in checks.run_checks(tags=[TAG]) if m.id == "celery_grousset.W004"]
    assert [m.msg.split(":")[0] for m in found] == [
        "The journal database 'mysql' runs at REPEATABLE READ"
    ]


def test_async_claim_commit_outside_postgresql_is_W006() -> None:
    # Given the opt-in async claim commit on journals that cannot honour it
    for alias in ("default", "mysql"):
        with override_settings(GROUSSET={"DATABASE": alias, "CLAIM_COMMIT": "async"}):
            # When the checks run / Then a warning says it has no effect
            assert ids(None) == {"celery_grousset.W006"}, alias
    # And on PostgreSQL, where it acts, the checks are silent
    with override_settings(GROUSSET={"DATABASE": "postgresql", "CLAIM_COMMIT": "async"}):
        assert ids(None) == set()


def test_sqlite_without_wal_is_W005(tmp_path: Path) -> None:
    # Given a SQLite journal file in the default (rollback) journal mode
    path = tmp_path / "journal.sqlite3"
    sqlite3.connect(path).execute("PRAGMA journal_mode=DELETE").close()
    with (
        database("nowal", ENGINE="django.db.backends.sqlite3", NAME=str(path)),
        override_settings(GROUSSET={"DATABASE": "nowal"}),
    ):
        # When the database checks run on it (`check --database nowal`)
        found = ids(None, databases=["nowal"], include_deployment_checks=False)
        db_ids = {m.id for m in checks.run_checks(databases=["nowal"], tags=[checks.Tags.database])}
    # Then it is a warning
    assert "celery_grousset.W005" in db_ids and "celery_grousset.W005" not in found
    # And the WAL test journal is fine
    services.require_database("default")
    clean = {m.id for m in checks.run_checks(databases=["default"], tags=[checks.Tags.database])}
    assert "celery_grousset.W005" not in clean


def test_an_in_memory_sqlite_journal_is_not_W005() -> None:
    """``manage.py test`` on SQLite (an in-memory test database, which has no file and
    cannot use WAL) printed W005 on every run, with a hint no one could follow."""
    from django.core.management import call_command

    # Given an in-memory SQLite journal, as Django's test runner creates one
    name = f"file:grousset_mem_{uuid.uuid4().hex[:8]}?mode=memory&cache=shared"
    with (
        database("memjournal", ENGINE="django.db.backends.sqlite3", NAME=name),
        override_settings(GROUSSET={"DATABASE": "memjournal"}),
    ):
        call_command("migrate", "celery_grousset", database="memjournal", verbosity=0)
        # When its database checks run
        found = {m.id for m in checks.run_checks(databases=["memjournal"],
                                                 tags=[checks.Tags.database])}  # fmt: skip
    # Then none says it is not in WAL mode
    assert "celery_grousset.W005" not in found, found


def test_a_migrated_sqlite_journal_is_checked_in_the_mode_the_store_leaves_it(
    tmp_path: Path,
) -> None:
    from django.core.management import call_command

    # Given a migrated SQLite journal left in the rollback journal mode
    path = tmp_path / "journal.sqlite3"
    with database("rollback", ENGINE="django.db.backends.sqlite3", NAME=str(path)):
        call_command("migrate", "celery_grousset", database="rollback", verbosity=0)
    sqlite3.connect(path).execute("PRAGMA journal_mode=DELETE").close()
    with (
        database("rollback", ENGINE="django.db.backends.sqlite3", NAME=str(path)),
        override_settings(GROUSSET={"DATABASE": "rollback"}),
    ):
        # When its database checks run: their probe of the store's own connection turns
        # WAL on, as the store's first claim does
        found = {m.id for m in checks.run_checks(databases=["rollback"],
                                                 tags=[checks.Tags.database])}  # fmt: skip
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    # Then what they say is the state they leave: WAL, and no W005 (it said "not WAL")
    assert mode == "wal" and "celery_grousset.W005" not in found


def test_checks_do_not_re_enter_through_the_django_fixup(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.celeryapp import app

    # Given the test app (Django fixup installed) and the nested check run allowed
    monkeypatch.delenv("CELERY_SKIP_CHECKS", raising=False)
    calls = []
    original = app.loader.import_default_modules

    def counting() -> Any:
        calls.append(1)
        return original()

    monkeypatch.setattr(app.loader, "import_default_modules", counting)
    # When the checks run once
    checks.run_checks(tags=[TAG])
    # Then the task modules were imported once, not once per nested check run
    assert len(calls) == 1


# -- manage.py check ----------------------------------------------------------------------


def test_manage_py_check_reports_every_misconfiguration() -> None:
    # Given settings with misconfigured guarded tasks and a REPEATABLE READ journal
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    # When `manage.py check` runs
    proc = subprocess.run(
        [sys.executable, "-m", "django", "check", "--settings", "tests.checks_settings"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    # Then it fails (errors present) and names each problem on its task
    assert proc.returncode == 1, out
    for obj, check_id in [
        ("badapp.no_max_processing_time", "E001"),
        ("badapp.hard_limit", "E002"),
        ("badapp.longer_than_visibility", "W001"),
        ("badapp.early_ack", "W002"),
        ("badapp.lost_on_kill", "W003"),
        ("?", "W004"),
    ]:
        assert f"{obj}: (celery_grousset.{check_id})" in out, out


def test_manage_py_check_of_a_project_without_the_app_is_E020() -> None:
    """Without 'celery_grousset' in INSTALLED_APPS none of its checks ran: `manage.py
    check` said nothing, and GROUSSET['TASKS'] guarded nothing in the web process or
    under CELERY_TASK_ALWAYS_EAGER (only a worker refused to start)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    # Given a project whose celery.py calls install(app) (Celery's Django recipe imports it
    # with the settings) and whose INSTALLED_APPS leaves the app out
    script = ("import tests.celeryapp\n"
              "from django.core.management import execute_from_command_line\n"
              "execute_from_command_line(['manage.py', 'check'])\n")  # fmt: skip
    for without, code in [("1", 1), ("", 0)]:
        # When `manage.py check` runs / Then it fails on E020, naming the fix
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                              env={**env, "GROUSSET_TEST_WITHOUT_APP": without}, text=True,
                              timeout=120, check=False)  # fmt: skip
        out = proc.stdout + proc.stderr
        assert proc.returncode == code, out
        assert ("(celery_grousset.E020)" in out) is bool(without), out
        assert ("Add 'celery_grousset' to INSTALLED_APPS" in out) is bool(without), out


def manage_py_check(grousset: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GROUSSET_CHECKS_GROUSSET": repr(grousset)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "-m", "django", "check", "--settings", "tests.checks_settings", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_chaos_suites_fault_injection_left_set_is_W021() -> None:
    # Given the chaos suite's fault injection left in a process's environment
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GROUSSET_FAULT": "after_claim:kill"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    plain = {k: v for k, v in env.items() if not k.startswith("GROUSSET_FAULT")}
    command = [sys.executable, "manage.py", "check"]
    # When `manage.py check` runs in the example project / Then it warns, saying what it does
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "(celery_grousset.W021) GROUSSET_FAULT='after_claim:kill' is set" in out, out
    assert "kills, stops or disconnects" in out and "Unset GROUSSET_FAULT" in out, out
    # And without it there is no such warning
    proc = subprocess.run(command, cwd=ROOT, env=plain, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0 and "W021" not in proc.stdout + proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("grousset", "check_id", "needle"),
    [
        ({"MAX_PROCESING_TIME": 60}, "E011", "MAX_PROCESSING_TIME"),
        ({"MAX_RESULT_BYTES": "256KB"}, "E010", "MAX_RESULT_BYTES"),
        ({"STORE_TIMEOUT": "x"}, "E010", "STORE_TIMEOUT"),
    ],
)
def test_manage_py_check_reports_bad_settings_without_a_traceback(
    grousset: dict[str, Any], check_id: str, needle: str
) -> None:
    # Given a bad GROUSSET / When a plain `manage.py check` runs (and one with --database)
    for extra in ((), ("--database", "default")):
        proc = manage_py_check({"DATABASE": "default", **grousset}, *extra)
        out = proc.stdout + proc.stderr
        # Then it exits 1 with the error under its id, naming the setting; no traceback
        assert proc.returncode == 1, out
        assert "Traceback" not in out, out
        assert f"(celery_grousset.{check_id})" in out and needle in out, out


def test_task_modules_that_do_not_import_are_W016_not_a_green_check(
    make_app: Callable[..., Celery],
) -> None:
    # Given a Celery app whose task modules fail to import (its worker would not start)
    app = make_app(imports=("tests.no_such_tasks_module",))
    # When the checks run / Then they say so, naming the app and the error, instead of
    # skipping its tasks in silence (a warning: a web process may lack a worker's imports)
    found = [m for m in checks.run_checks(tags=[TAG]) if m.id == "celery_grousset.W016"]
    assert any(app.main in m.msg and "no_such_tasks_module" in m.msg for m in found), found


@pytest.mark.parametrize("name", ["GROUSET", "CELERY_GROUSSET", "GROUSSETT"])
def test_a_misspelt_grousset_setting_is_E018(name: str) -> None:
    # Given celery-grousset's settings under a name it does not read
    with override_settings(**{name: {"DATABASE": "postgresql", "MAX_PROCESSING_TIME": 30}}):
        # When the checks run / Then it is an error naming the setting and the fix
        assert ids(name) == {"celery_grousset.E018"}
        [message] = [m for m in checks.run_checks(tags=[TAG]) if m.obj == name]
        assert "Rename it to GROUSSET" in (message.hint or "")
    # And the project's own settings are not taken for one
    assert not [m for m in checks.run_checks(tags=[TAG]) if m.id == "celery_grousset.E018"]


@pytest.mark.parametrize(
    ("name", "key"),
    [("GROUSSET_TASKS", "TASKS"), ("GROUSSET_DATABASE", "DATABASE"),
     ("CELERY_GROUSSET_TASKS", "TASKS"), ("GROUSSET_PROCESOR_ID", "PROCESSOR_ID")],
)  # fmt: skip
def test_a_grousset_setting_written_flat_is_E018_naming_its_key(name: str, key: str) -> None:
    """GROUSSET_TASKS = {...} (as CELERY_* settings are written) was ignored in silence:
    the tasks it named ran unguarded."""
    # Given one of celery-grousset's settings written as a setting of its own
    with override_settings(**{name: {"tests.tasks.effect": {"max_processing_time": 30}}}):
        # When the checks run / Then it is an error naming the key of GROUSSET it belongs in
        [message] = [m for m in checks.run_checks(tags=[TAG]) if m.obj == name]
        assert message.id == "celery_grousset.E018"
        assert f"GROUSSET[{key!r}]" in (message.hint or ""), message
    # And a setting of the project's own that starts so is not taken for one
    with override_settings(GROUSSET_DASHBOARD_URL="/x/"):
        assert not [m for m in checks.run_checks(tags=[TAG]) if m.id == "celery_grousset.E018"]


_FALLBACK_APP = """
import json, sys
import celery
if sys.argv[1] == "green":  # as gevent's and eventlet's monkey-patching does at start,
    held = celery.current_app._get_current_object()  # before `-A` is imported: Celery's
    # fallback app is made (and kept, as the worker's process keeps it)
from tests.celeryapp import app  # the project's app: acks_late, reject_on_worker_lost
app.set_default()  # as the worker does (the fallback is no longer Celery's default then)
import django
django.setup()
import tests.tasks
from celery_grousset.checks import check_tasks
print(json.dumps(sorted({m.id for m in check_tasks()})))
"""


def test_the_fallback_app_a_green_pool_makes_is_not_checked() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}

    def ids(mode: str) -> list[str]:
        proc = subprocess.run(
            [sys.executable, "-c", _FALLBACK_APP, mode], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        return list(json.loads(proc.stdout.strip().splitlines()[-1]))

    # Given the project's app, whose guarded tasks take acks_late from its configuration
    # When the checks run in a process where Celery's fallback app was made first (a
    # gevent or eventlet worker's start) / Then they find what they find without it:
    # the fallback's copies of the shared tasks (an empty configuration) are not checked
    assert ids("green") == ids("plain") == []


def test_fingerprints_without_a_key_are_W023_on_deploy_only() -> None:
    """Unkeyed fingerprints let whoever reads one confirm a guessed card number or PIN
    (docs/guarantee.md); the admin shows them to anyone with view_outcome (a review:
    a card found from its receipt digits in 5 s)."""
    key = "k" * 32

    def w023(**kwargs: Any) -> list[checks.CheckMessage]:
        return [m for m in checks.run_checks(**kwargs) if m.id == "celery_grousset.W023"]

    # Given no FINGERPRINT_KEY / Then `check --deploy` warns, naming the setting and the fix
    with override_settings(GROUSSET={"DATABASE": "default"}):
        [message] = w023(include_deployment_checks=True)
        assert "FINGERPRINT_KEY" in message.msg and "32 bytes" in str(message.hint)
        # and a plain `check` (a worker's start, runserver) does not
        assert w023() == []
    # And with a key set, no warning
    with override_settings(GROUSSET={"DATABASE": "default", "FINGERPRINT_KEY": key}):
        assert w023(include_deployment_checks=True) == []
