"""``GROUSSET["TASKS"]``: guard tasks a project does not own, by name or fnmatch pattern,
without touching their code (issue 17, item 3).

In-process tests use Celery apps of their own (no Django fixup), gone after each test;
the worker test runs ``celery -A tests.plainapp worker`` — an app without any
celery-grousset code — on ``tests.tasks_settings``, and counts effects in the ledger.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from django.conf import settings
from django.core import checks
from django.test import override_settings

from celery_grousset import GroussetTask
from celery_grousset.conf import GroussetSettingsError, grousset_settings
from celery_grousset.exceptions import ConfigurationError
from celery_grousset.models import Outcome
from celery_grousset.task import GroussetTaskMixin
from tests import services
from tests.ledger.models import Effect
from tests.workers import workers

TAG = "celery_grousset"


@pytest.fixture(autouse=True)
def no_nested_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test app's Django fixup would re-run the checks inside the task checks."""
    monkeypatch.setenv("CELERY_SKIP_CHECKS", "1")


@pytest.fixture
def journal() -> str:
    services.require_database("default")
    return "default"


@pytest.fixture
def make_app() -> Iterator[Callable[[], Celery]]:
    """Celery apps for one test (active while it runs, as a project's app is)."""
    apps: list[Celery] = []

    def make() -> Celery:
        app = Celery(f"grousset-tasks-{uuid.uuid4().hex[:8]}", set_as_current=False, fixups=[])
        app.conf.update(
            broker_url="memory://", task_acks_late=True, task_reject_on_worker_lost=True
        )
        apps.append(app)
        return app

    yield make
    from celery import _state

    from celery_grousset.task import reset_resolved_options

    for app in apps:
        _state._apps.discard(app)  # type: ignore[attr-defined]
    apps.clear()
    reset_resolved_options()
    gc.collect()


@pytest.fixture
def prefix() -> str:
    """A task-name prefix of this test's own."""
    return f"t{uuid.uuid4().hex[:8]}"


def plain(app: Celery, name: str, **options: Any) -> Any:
    """A plain ``@app.task`` (no GroussetTask) whose effect is a ledger row."""

    def body(key: str, note: str = "") -> str:
        Effect.objects.using(grousset_settings.DATABASE).create(key=key, value=note)
        return uuid.uuid4().hex  # no second run returns the same value

    return app.task(name=name, shared=False, **options)(body)


def grousset(tasks: Any, **more: Any) -> Any:
    return override_settings(GROUSSET={"DATABASE": "default", "TASKS": tasks, **more})


def effects(key: str) -> int:
    return Effect.objects.using("default").filter(key=key).count()


def twice(task: Any, key: str, **kwargs: Any) -> tuple[Any, Any]:
    """The same call applied twice (Celery's eager tracer, as a worker child traces it)."""
    return task.apply((key,), kwargs).get(), task.apply((key,), kwargs).get()


# -- which tasks get the guard ------------------------------------------------------------


def test_plain_tasks_matched_by_name_and_by_pattern_are_guarded_with_their_options(
    make_app: Callable[[], Celery], prefix: str, journal: str
) -> None:
    # Given plain tasks, one listed by its name and one matched by a pattern
    app = make_app()
    exact = plain(app, f"{prefix}.receipts.send")
    bulk = plain(app, f"{prefix}.bulk.mail")
    tasks = {
        f"{prefix}.receipts.send": {"max_processing_time": 60, "expires_after": 120},
        f"{prefix}.bulk.*": {"max_processing_time": timedelta(seconds=30), "on_in_flight": "wait"},
    }
    # When GROUSSET["TASKS"] lists them
    with grousset(tasks):
        # Then both are guarded, with the options given
        assert isinstance(exact, GroussetTaskMixin) and isinstance(bulk, GroussetTaskMixin)
        opts = exact.grousset_options()
        assert (opts.max_processing_time, opts.expires_after) == (60.0, 120.0)
        opts = bulk.grousset_options()
        assert (opts.max_processing_time, opts.on_in_flight) == (30.0, "wait")
        assert opts.expires_after == 7 * 24 * 3600.0  # unset: GROUSSET's default
        # And the same call runs once; the duplicate receives the memo
        for task in (exact, bulk):
            key = f"{task.name}-{uuid.uuid4().hex[:8]}"
            first, second = twice(task, key)
            assert effects(key) == 1 and first == second
            rec = Outcome.objects.using(journal).get(
                task_name=task.name, fingerprint=task.grousset_fingerprint((key,), {})
            )
            assert rec.status == "completed" and rec.deliveries == 2


def test_an_unmatched_task_is_untouched(
    make_app: Callable[[], Celery], prefix: str, journal: str
) -> None:
    # Given a plain task that no entry matches (a pattern close to its name)
    app = make_app()
    other = plain(app, f"{prefix}.other.send")
    cls = other.__class__
    with grousset({f"{prefix}.receipts.*": {"max_processing_time": 60}}):
        # Then it keeps its class and runs on every delivery
        assert other.__class__ is cls and not isinstance(other, GroussetTaskMixin)
        key = f"other-{uuid.uuid4().hex[:8]}"
        first, second = twice(other, key)
        assert effects(key) == 2 and first != second


def test_patterns_never_match_celerys_own_tasks(
    make_app: Callable[[], Celery], prefix: str, journal: str
) -> None:
    # Given a pattern that matches every name
    app = make_app()
    mine = plain(app, f"{prefix}.mine")
    own = plain(app, f"celery_grousset.{prefix}")
    with grousset({"*": {"max_processing_time": 60}}):
        # Then the project's task is guarded, Celery's built-in tasks are not
        assert isinstance(mine, GroussetTaskMixin)
        builtins = [t for name, t in app.tasks.items() if name.startswith("celery.")]
        assert builtins and not any(isinstance(t, GroussetTaskMixin) for t in builtins)
        assert not isinstance(own, GroussetTaskMixin)


def test_an_exact_name_wins_over_patterns_and_the_first_pattern_over_later_ones(
    make_app: Callable[[], Celery], prefix: str
) -> None:
    app = make_app()
    task = plain(app, f"{prefix}.a.b")
    tasks = {
        f"{prefix}.*": {"max_processing_time": 10, "max_takeovers": 7, "memoize": False},
        f"{prefix}.a.*": {"max_processing_time": 20, "max_takeovers": 8},
        f"{prefix}.a.b": {"max_processing_time": 30},
    }
    with grousset(tasks):
        opts = task.grousset_options()
    assert (opts.max_processing_time, opts.max_takeovers, opts.memoize) == (30.0, 7, False)


def test_a_task_keeps_its_own_options_the_settings_only_fill_unset_ones(
    make_app: Callable[[], Celery], prefix: str
) -> None:
    # Given a GroussetTask and a plain task, each with an option of its own
    app = make_app()

    def body() -> None:
        """Never run."""

    guarded = app.task(base=GroussetTask, shared=False, name=f"{prefix}.g", max_processing_time=10)(
        body
    )
    own = plain(app, f"{prefix}.p", max_processing_time=5)
    entry = {"max_processing_time": 99, "expires_after": 50, "on_failure": "memoize"}
    with grousset({f"{prefix}.*": entry}):
        for task, mpt in ((guarded, 10.0), (own, 5.0)):
            # Then its own option wins and the unset ones come from GROUSSET["TASKS"]
            opts = task.grousset_options()
            assert (opts.max_processing_time, opts.expires_after) == (mpt, 50.0), task.name
            assert opts.on_failure == "memoize"
            assert callable(task.on_failure)  # Celery's failure handler keeps its name
    # And once the entry is gone the guarded task has its own options only
    with grousset({}):
        assert guarded.grousset_options().expires_after == 7 * 24 * 3600.0


def test_grousset_key_from_settings(
    make_app: Callable[[], Celery], prefix: str, journal: str
) -> None:
    app = make_app()
    task = plain(app, f"{prefix}.keyed")
    entry = {"max_processing_time": 60, "grousset_key": ["key"], "validate_payload": False}
    with grousset({f"{prefix}.keyed": entry}):  # the key covers varying notes
        key = f"keyed-{uuid.uuid4().hex[:8]}"
        first = task.apply((key,), {"note": "a"}).get()
        second = task.apply((key,), {"note": "b"}).get()  # another note: the same call
    assert effects(key) == 1 and first == second


def the_key(key: str, **_: object) -> str:
    return key


def test_a_callable_grousset_key_from_settings_gets_the_bound_arguments(
    make_app: Callable[[], Celery], prefix: str, journal: str
) -> None:
    app = make_app()
    task = plain(app, f"{prefix}.keyfn")
    # Given GROUSSET["TASKS"] keying a task by a function of its arguments
    entry = {"max_processing_time": 60, "grousset_key": the_key, "validate_payload": False}
    with grousset({f"{prefix}.keyfn": entry}):
        key = f"keyfn-{uuid.uuid4().hex[:8]}"
        # When it is called twice with varying notes
        first = task.apply((key,), {"note": "a"}).get()
        second = task.apply((key,), {"note": "b"}).get()
    # Then the function saw the arguments alone, and the body ran once
    assert effects(key) == 1 and first == second


# -- when the guard is installed ----------------------------------------------------------


def test_tasks_registered_after_the_app_is_finalized_are_guarded(
    make_app: Callable[[], Celery], prefix: str, journal: str
) -> None:
    # Given a finalized app (its first tasks guarded already)
    app = make_app()
    with grousset({f"{prefix}.*": {"max_processing_time": 60}}):
        app.finalize()
        # When a module registers a task later
        late = plain(app, f"{prefix}.late")
        # Then it is guarded as it is registered
        assert isinstance(late, GroussetTaskMixin)
        key = f"late-{uuid.uuid4().hex[:8]}"
        assert len(set(twice(late, key))) == 1 and effects(key) == 1


def test_the_worker_guards_its_tasks_when_it_starts_and_says_which(
    make_app: Callable[[], Celery], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    from celery import signals

    from celery_grousset.worker import refuse_configuration_errors

    class Worker:  # what the handlers use of a WorkController
        def __init__(self, app: Celery) -> None:
            self.app = app

    tasks = {f"{prefix}.a": {"max_processing_time": 60}, f"{prefix}.typo": {"memoize": False}}
    with grousset(tasks):
        # Given an app no hook has seen yet, with a task registered at once (lazy=False)
        app = make_app()
        task = plain(app, f"{prefix}.a", lazy=False)
        assert not isinstance(task, GroussetTaskMixin)
        worker = Worker(app)
        # When a worker of it starts (worker_init, then celeryd_after_setup)
        signals.worker_init.send(sender=worker)
        # Then the task is guarded before any tracer is built
        assert isinstance(task, GroussetTaskMixin) and app.finalized
        with caplog.at_level("INFO", logger="celery_grousset"):
            signals.celeryd_after_setup.send(sender="w@h", instance=worker, conf=app.conf)
            # (and the worker's bootstep logs the checks' warnings)
            refuse_configuration_errors(in_process=True)
    # And the log says which tasks are guarded from settings
    messages = [r.getMessage() for r in caplog.records]
    assert f"celery-grousset guards from GROUSSET['TASKS']: {prefix}.a" in messages
    # And an entry that matches no task is pointed out, once (it was logged twice: by the
    # start-up report and as the check W017)
    typo = [m for m in messages if f"'{prefix}.typo'" in m and "matches no registered" in m]
    assert len(typo) == 1 and "celery_grousset.W017" in typo[0], typo


def test_a_tracer_built_before_the_guard_is_rebuilt(
    make_app: Callable[[], Celery], prefix: str, journal: str
) -> None:
    from celery.app.trace import build_tracer, task_has_custom

    # Given a plain task whose tracer a worker has built (it calls task.run directly)
    app = make_app()
    task = plain(app, f"{prefix}.traced")
    app.finalize()
    task.__trace__ = build_tracer(task.name, task, app=app)
    # When the guard is installed
    with grousset({f"{prefix}.traced": {"max_processing_time": 60}}):
        # Then Celery's tracer goes through the guarded __call__
        assert task_has_custom(task, "__call__")
        key = f"traced-{uuid.uuid4().hex[:8]}"
        results = [
            task.__trace__(uuid.uuid4().hex, (key,), {}, {"id": uuid.uuid4().hex})
            for _ in range(2)
        ]
        assert effects(key) == 1
        assert results[0].retval == results[1].retval


def test_a_task_is_plain_again_when_the_setting_is_gone(
    make_app: Callable[[], Celery], prefix: str, journal: str
) -> None:
    app = make_app()
    task = plain(app, f"{prefix}.again")
    cls = task.__class__
    with grousset({f"{prefix}.again": {"max_processing_time": 60}}):
        assert task.__class__ is not cls
    assert task.__class__ is cls and not isinstance(task, GroussetTaskMixin)
    key = f"again-{uuid.uuid4().hex[:8]}"
    twice(task, key)
    assert effects(key) == 2


def test_a_task_registered_while_guarded_stays_bound_to_its_app(
    make_app: Callable[[], Celery], prefix: str, journal: str
) -> None:
    # Given a task guarded as it is registered (Celery then binds the guarded class)
    app = make_app()
    with grousset({f"{prefix}.*": {"max_processing_time": 60}}):
        app.finalize()
        task = plain(app, f"{prefix}.bound")
        assert isinstance(task, GroussetTaskMixin)
        # When its options change, and then its entry goes away
        with grousset({f"{prefix}.*": {"max_processing_time": 30}}):
            assert task.grousset_options().max_processing_time == 30.0
            # Then it keeps its app and the app's configuration
            assert task.app is app and task.acks_late is True
    assert not isinstance(task, GroussetTaskMixin)
    assert task.app is app and task.acks_late is True and task.serializer == "json"


def test_a_matched_task_fails_closed_while_grousset_is_invalid(
    make_app: Callable[[], Celery], prefix: str, journal: str
) -> None:
    # Given a task listed in TASKS while another GROUSSET value is refused
    app = make_app()
    task = plain(app, f"{prefix}.closed")
    with grousset({f"{prefix}.closed": {"max_processing_time": 60}}, BYPASS="false"):
        # Then it is guarded all the same, and refuses to run (no effect)
        assert isinstance(task, GroussetTaskMixin)
        key = f"closed-{uuid.uuid4().hex[:8]}"
        with pytest.raises(ConfigurationError, match="BYPASS"):
            task.apply((key,)).get()
    assert effects(key) == 0


@pytest.mark.parametrize("shape", ["pairs", "names"])
def test_a_matched_task_fails_closed_while_tasks_is_not_a_dict(
    make_app: Callable[[], Celery], prefix: str, journal: str, shape: str
) -> None:
    """TASKS given as a list (of (name, options) pairs, of names) guarded nothing: its
    tasks ran unguarded in eager and direct calls, twice for the same call."""
    app = make_app()
    name = f"{prefix}.listed"
    task = plain(app, name)
    listed = [(name, {"max_processing_time": 60})] if shape == "pairs" else [name]
    # Given TASKS that is not a dict (refused), listing the task
    with grousset(listed):
        # Then it is guarded all the same, and refuses to run (no effect)
        assert isinstance(task, GroussetTaskMixin)
        key = f"listed-{uuid.uuid4().hex[:8]}"
        with pytest.raises(ConfigurationError, match="TASKS"):
            task.apply((key,)).get()
    assert effects(key) == 0


# -- validation and checks ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("tasks", "named"),
    [
        ({"shop.tasks.*": {"max_processing_time": -1}}, "max_processing_time"),
        ({"shop.tasks.*": {"max_processing_time": "60"}}, "max_processing_time"),
        ({"shop.tasks.send": {"on_in_flight": "sometimes"}}, "on_in_flight"),
        ({"shop.tasks.send": {"expires_after": None}}, "expires_after"),
        ({"shop.tasks.send": {"memoize": "false"}}, "memoize"),
        ({"shop.tasks.send": {"max_proccessing_time": 60}}, "max_processing_time"),
        ({"shop.tasks.send": {"acks_late": True}}, "acks_late"),
        ({"shop.tasks.send": {"expires": 60}}, "did you mean 'expires_after'"),
        ({"shop.tasks.send": {"grousset_key": "order_id"}}, "grousset_key"),
        ({"shop.tasks.send": 60}, "shop.tasks.send"),
        ({"": {"max_processing_time": 60}}, "''"),
        (["shop.tasks.*"], "TASKS"),
    ],
)
def test_a_bad_entry_is_refused_naming_grousset_tasks(tasks: Any, named: str) -> None:
    with grousset(tasks):
        # When the settings are read / Then a GroussetSettingsError names the setting
        with pytest.raises(GroussetSettingsError) as info:
            grousset_settings.TASKS  # noqa: B018
        assert [p.setting for p in info.value.problems] == ["TASKS"]
        assert "GROUSSET['TASKS']" in str(info.value) and named in str(info.value)
        # And manage.py check reports it as E010 on GROUSSET['TASKS']
        messages = [m for m in checks.run_checks(tags=[TAG]) if (m.id or "").startswith(TAG)]
    assert [(m.id, m.obj) for m in messages] == [("celery_grousset.E010", "GROUSSET['TASKS']")]
    assert named in messages[0].msg and messages[0].hint


@pytest.mark.parametrize(
    ("option", "where"),
    [("acks_late", "CELERY_TASK_ACKS_LATE"), ("time_limit", "CELERY_TASK_TIME_LIMIT"),
     ("reject_on_worker_lost", "CELERY_TASK_REJECT_ON_WORKER_LOST"), ("autoretry_for", None)],
)  # fmt: skip
def test_a_celery_option_in_an_entry_says_where_celery_reads_it(
    option: str, where: str | None
) -> None:
    # Given a Celery task option in a TASKS entry (meant for a task you do not own)
    entry = {"max_processing_time": 30, option: True}
    with grousset({"thirdparty.tasks.*": entry}), pytest.raises(GroussetSettingsError) as info:
        grousset_settings.TASKS  # noqa: B018
    # Then the refusal says whose option it is, and where Celery reads it instead
    [problem] = info.value.problems
    assert f"{option!r} is a Celery task option" in problem.message
    assert "task_annotations" in problem.hint and f"{option}=" in problem.hint
    assert (where in problem.hint) if where else "for every task" not in problem.hint


def test_valid_entries_read_back_as_seconds_and_tuples() -> None:
    tasks = {"a.*": {"max_processing_time": timedelta(seconds=90), "grousset_key": ["x", "y"]}}
    with grousset(tasks):
        assert grousset_settings.TASKS == {
            "a.*": {"max_processing_time": 90.0, "grousset_key": ("x", "y")}
        }
    assert settings.GROUSSET.get("TASKS") is None  # the test settings have none


def test_the_options_an_entry_may_set_are_the_task_options() -> None:
    from celery_grousset.conf import TASK_OPTIONS
    from celery_grousset.options import NAMES

    assert set(TASK_OPTIONS) == {*NAMES, "grousset_key"}


def test_the_checks_see_tasks_guarded_from_settings(
    make_app: Callable[[], Celery], prefix: str
) -> None:
    # Given plain tasks guarded from settings, one without any max_processing_time
    app = make_app()
    plain(app, f"{prefix}.bounded")
    plain(app, f"{prefix}.unbounded")
    plain(app, f"{prefix}.limited", time_limit=120)
    tasks = {
        f"{prefix}.bounded": {"max_processing_time": 60},
        f"{prefix}.unbounded": {"expires_after": 60},
        f"{prefix}.limited": {"max_processing_time": 60},
    }
    with grousset(tasks):
        messages = [m for m in checks.run_checks(tags=[TAG]) if m.obj]
    found = {(m.obj, m.id) for m in messages}
    # Then they are checked as the base class's tasks are
    mine = {(obj, cid) for obj, cid in found if str(obj).startswith(prefix)}
    assert mine == {
        (f"{prefix}.unbounded", "celery_grousset.E001"),
        (f"{prefix}.limited", "celery_grousset.E002"),
    }
    # And the fix named is the entry in GROUSSET["TASKS"] (the task is not the user's)
    ids_e001 = "celery_grousset.E001"
    [e001] = [m for m in messages if (m.obj, m.id) == (f"{prefix}.unbounded", ids_e001)]
    assert "its GROUSSET['TASKS'] entry" in (e001.hint or "") and "decorator" not in e001.hint


# -- a real worker ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_plain_task_listed_in_settings_runs_once_on_a_real_worker() -> None:
    services.require_database("postgresql")
    redis = services.require_redis()
    from tests.celeryapp import app

    queue = f"q-{uuid.uuid4().hex[:10]}"
    env = {"DJANGO_SETTINGS_MODULE": "tests.tasks_settings"}
    # Given a worker of an app with no celery-grousset code, whose settings list two of
    # its plain tasks in GROUSSET["TASKS"] (one by name, one by pattern)
    with workers(queue, 1, database="postgresql", broker=redis, concurrency=2,
                 app="tests.plainapp", env=env) as (worker,):  # fmt: skip
        counts, ids = {}, {}
        for name in ("receipt", "bulk_receipt", "untouched"):
            key = f"{name}-{uuid.uuid4().hex[:8]}"
            # When the same call is published 5 times
            results = [
                app.send_task(f"tests.plaintasks.{name}", args=[key], queue=queue)
                for _ in range(5)
            ]
            values = [r.get(timeout=90) for r in results]
            ids[name] = [r.id for r in results]
            counts[name] = (Effect.objects.using("postgresql").filter(key=key).count(),
                            len(set(values)), key)  # fmt: skip
        log = worker.text()
    # Then each listed task's effect happened once and the duplicates got its memo
    for name in ("receipt", "bulk_receipt"):
        effects_, distinct, key = counts[name]
        assert (effects_, distinct) == (1, 1), (name, log[-3000:])
        rec = Outcome.objects.using("postgresql").get(
            task_name=f"tests.plaintasks.{name}", task_id__in=ids[name]
        )
        assert rec.status == "completed" and rec.deliveries >= 5 and rec.takeovers == 0
    # And the unlisted task ran on every delivery (the count would have seen a duplicate)
    assert counts["untouched"][:2] == (5, 5)
    guards = "GROUSSET['TASKS']: tests.plaintasks.bulk_receipt, tests.plaintasks.receipt\n"
    assert f"celery-grousset guards from {guards}" in log


@pytest.mark.slow
def test_a_worker_of_an_app_without_install_refuses_a_configuration_error_too() -> None:
    """The worker's start-up step came only from ``install(app)`` in the project's
    celery.py: a project that left it out started with a configuration error, and each
    guarded delivery failed before its claim and was acknowledged, lost."""
    services.require_database("postgresql")
    redis = services.require_redis()
    from tests.workers import start_worker

    queue = f"q-{uuid.uuid4().hex[:10]}"
    env = {"DJANGO_SETTINGS_MODULE": "tests.tasks_settings", "GROUSSET_TEST_LAYOUT": "bogus"}
    # Given an app with no celery-grousset code (no install(app)) and GROUSSET in error
    # When its worker starts
    with pytest.raises(RuntimeError, match="worker exited with 1") as refused:
        start_worker(queue, database="postgresql", broker=redis, app="tests.plainapp",
                     env=env).kill()  # fmt: skip
    # Then it does not start, and says why
    text = str(refused.value)
    assert "JOURNAL_LAYOUT" in text and "this worker does not start" in text, text
