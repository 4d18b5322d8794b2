"""Celery's own test fixtures with guarded tasks: ``celery_app`` and an in-process
``celery_worker`` (``celery.contrib.pytest``, loaded by the pytest-celery plugin).

pytest-celery 1.x names its Docker-based worker ``celery_worker`` too; no container
images exist on these machines, so this module binds that name to Celery's in-process
fixture, which takes precedence over the plugin's (docs/testing.md shows users the same).
The worker is a thread of the test process on an in-memory broker; the journal and the
effect ledger are the SQLite ``default`` database, so duplicate effects are counted.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from celery.contrib import pytest as celery_fixtures

from celery_grousset import GroussetTask
from celery_grousset.contrib.pytest import Journal
from tests import services
from tests.ledger.models import Effect
from tests.tasks import effect

if TYPE_CHECKING:
    from celery import Celery
    from celery.worker import WorkController
    from pytest_django.fixtures import Settings

#: Celery's in-process worker, in place of pytest-celery 1.x's Docker one
celery_worker = celery_fixtures.celery_worker


@pytest.fixture
def sqlite_journal(settings: Settings) -> Journal:
    services.require_database("default")
    settings.GROUSSET = {**settings.GROUSSET, "DATABASE": "default"}
    return Journal()


def effects(key: str) -> int:
    return Effect.objects.using("default").filter(key=key).count()


def test_in_process_worker_answers_a_duplicate_from_the_memo(
    celery_app: Celery, celery_worker: WorkController, sqlite_journal: Journal
) -> None:
    key = f"inproc-{uuid.uuid4().hex[:8]}"
    # Given a guarded shared task, consumed by Celery's in-process worker
    assert effect.app is celery_app
    first = effect.delay(key).get(timeout=20)
    # When the same call is published twice more (new task ids: a duplicate delivery)
    again = [effect.delay(key).get(timeout=20) for _ in range(2)]
    # Then the body ran once, in the worker; the duplicates got its memo
    assert effects(key) == 1
    assert again == [first, first] and first["key"] == key
    record = sqlite_journal.get(effect, key)
    assert record.status == "completed" and record.deliveries == 3
    assert first["fence"] == record.fence
    assert first["pid"] == os.getpid()  # the worker is a thread of this process


def test_in_process_worker_runs_a_task_defined_in_the_test(
    celery_app: Celery, celery_worker: WorkController, sqlite_journal: Journal
) -> None:
    calls: list[str] = []

    @celery_app.task(base=GroussetTask, bind=True, max_processing_time=30,
                     name=f"tests.inproc.charge.{uuid.uuid4().hex[:6]}")  # fmt: skip
    def charge(self: Any, order: int) -> str:
        calls.append(self.request.id)
        return f"charged-{order}"

    celery_worker.reload()  # the worker learns the new task
    # Given a task registered on the test app after the worker started
    # When it is published twice with the same arguments
    results = [charge.delay(17).get(timeout=20) for _ in range(2)]
    # Then it ran once, and the second delivery was answered from the journal
    assert results == ["charged-17", "charged-17"]
    assert len(calls) == 1
    assert sqlite_journal.deliveries(charge, 17) == 2


@pytest.mark.parametrize("left", [{"once": {"graceful": True}}, {"grousset_key": "order-42"}],
                         ids=["celery-once", "grousset-key"])  # fmt: skip
def test_a_chain_link_left_with_celery_once_options_is_still_published(
    celery_app: Celery, celery_worker: WorkController, sqlite_journal: Journal,
    left: dict[str, Any],
) -> None:  # fmt: skip
    """A caller's own ``once=`` is refused at its publish, and so is a later link's
    when the caller's publish carries it; a chain's next link that the worker publishes
    after a plain task's body is not the caller's: refused there, the link would be lost
    (the body already completed)."""
    from celery import chain

    @celery_app.task(name=f"tests.inproc.plain.{uuid.uuid4().hex[:6]}")
    def plain() -> str:
        return "plain"

    celery_worker.reload()  # the worker learns the new task
    second = f"link-{uuid.uuid4().hex[:8]}"
    # Given a chain led by a plain task (its publish checks nothing of the guarded link)
    # whose second link, guarded, still carries celery-once's per-call option (or the
    # task option's name, grousset_key=, refused to a caller)
    links = chain(plain.si(), effect.si(second).set(**left))
    # When it runs
    value = links.apply_async().get(timeout=20)
    # Then the worker published the link: it ran, once
    assert value["key"] == second
    assert effects(second) == 1


@pytest.mark.parametrize(
    ("link_options", "error"),
    [
        ({"idempotency_keys": "order-42"}, TypeError),
        ({"headers": {"grousset-key": "order-42"}}, ValueError),
        ({"once": {"graceful": True}}, TypeError),
    ],
    ids=["misspelt-option", "misspelt-header", "celery-once"],
)
def test_a_chain_with_a_link_the_worker_would_refuse_is_refused_by_the_caller(
    celery_app: Celery, celery_worker: WorkController, sqlite_journal: Journal,
    link_options: dict[str, Any], error: type[Exception],
) -> None:  # fmt: skip
    """The worker publishes a chain's next link after the previous body completed; a
    link it refuses there (a misspelt key) is lost. The caller's publish checks every
    guarded call it carries, and publishes none of the chain."""
    from celery import chain

    first, second, after = (f"link-{uuid.uuid4().hex[:8]}" for _ in "abc")
    # Given a chain whose second link is given its key under a name nothing reads
    links = chain(effect.si(first), effect.si(second).set(**link_options))
    # When the caller publishes it
    with pytest.raises(error, match=r"publish later .*chain's next link.*It was not published"):
        links.apply_async()
    # Then nothing of it was published: a call published after it is consumed (the
    # worker runs one task at a time, in order) and the first link never ran
    assert effect.delay(after).get(timeout=20)["key"] == after
    assert (effects(first), effects(second), effects(after)) == (0, 0, 1)


def test_a_chord_body_and_a_callback_are_checked_by_the_callers_publish(
    celery_app: Celery, sqlite_journal: Journal
) -> None:
    """A chord's body and a ``link`` callback are published later by the worker too."""
    from celery import chord

    misspelt = effect.si("body").set(idempotency_keys="order-42")
    # Given a chord of guarded tasks whose body misspells its key, a call whose callback does
    # When either is published, Then the caller's publish refuses it
    with pytest.raises(TypeError, match=r"'idempotency_keys'.*a chord's body"):
        chord([effect.si("h1"), effect.si("h2")], misspelt).apply_async()
    with pytest.raises(TypeError, match=r"'idempotency_keys'.*a link or link_error callback"):
        effect.apply_async(("cb",), link=misspelt)


def test_options_given_to_a_group_or_a_chord_are_checked_as_its_members_own(
    celery_app: Celery, sqlite_journal: Journal
) -> None:
    """Celery publishes a group's, a chord's and a chain's own options with each of its
    members: a misspelt key set on the group itself was lost at the worker too."""
    from celery import chain, chord, group

    misspelt = {"headers": {"grousset-key": "order-42"}}
    # Given a chain whose next step is a group given a misspelt key header, and a call
    # whose callback is a chord given a misspelt key option
    steps = chain(effect.si("a"), group(effect.si("b"), effect.si("c")).set(**misspelt))
    callback = chord([effect.si("d")], effect.si("e")).set(idempotency_keys="order-42")
    # When they are published, Then the caller's publish refuses both
    with pytest.raises(ValueError, match=r"'grousset-key' is not read.*It was not published"):
        steps.apply_async()
    with pytest.raises(TypeError, match=r"'idempotency_keys'.*It was not published"):
        effect.apply_async(("f",), link=callback)


def test_a_linked_task_this_process_has_not_imported_is_checked_for_its_options(
    celery_app: Celery,
) -> None:
    """A task named by a string, not registered here, may be guarded where it runs: a
    misspelt key option is refused (nothing reads it anywhere); its headers and
    celery-once's once= (its own, if it is a QueueOnce task) are left alone."""
    from celery import signature

    from celery_grousset.publish_check import refuse_misspelt_links

    elsewhere = "billing.tasks.capture"
    assert elsewhere not in celery_app.tasks
    # Given links to that task with a misspelt key option, a key-like header, once=
    bad = signature(elsewhere, args=(1,), options={"idempotency_keys": "k"}, app=celery_app)
    header = signature(elsewhere, options={"headers": {"grousset-key": "k"}}, app=celery_app)
    once = signature(elsewhere, options={"once": {"graceful": True}}, app=celery_app)
    # When a guarded call carries them, Then the misspelt option is refused
    with pytest.raises(TypeError, match=r"'idempotency_keys'.*It was not published"):
        effect.apply_async(("g",), link=bad)
    # and the others pass the check (a plain task of its own may read them)
    refuse_misspelt_links(celery_app, effect.name, {"link": [header, once]})
    # as does a link whose options are not what Celery would make (a non-str name)
    odd = {"task": effect.name, "options": {1: 2, "headers": "x"}}
    refuse_misspelt_links(celery_app, effect.name, {"link": [odd], "chain": [{"task": ["x"]}]})


def test_a_call_enqueued_inside_a_task_has_its_links_checked(
    celery_app: Celery, sqlite_journal: Journal
) -> None:
    """outbox.enqueue() inside a task: the relay publishes the row later, and the worker
    refuses the misspelt link after the body: the caller's check must run in a task too."""
    from celery_grousset import outbox
    from celery_grousset.models import OutboxMessage

    @celery_app.task(name=f"tests.inproc.enqueuer.{uuid.uuid4().hex[:6]}")
    def enqueuer(key: str) -> None:
        link = effect.si("after").set(idempotency_keys="order-42")
        outbox.enqueue(effect, [key], link=link, using="default")

    rows = OutboxMessage.objects.using("default")
    before = rows.count()
    # Given a task body that enqueues a guarded call whose callback misspells its key
    # When the body runs (as a worker runs it: Celery's __call__), Then enqueue refuses
    with pytest.raises(TypeError, match=r"'idempotency_keys'.*It was not published"):
        enqueuer(f"enq-{uuid.uuid4().hex[:8]}")
    # and wrote no row
    assert rows.count() == before


@pytest.mark.parametrize("memoize", [False, True])
def test_a_duplicate_with_no_memo_sends_no_next_step_nor_callback(
    celery_app: Celery, celery_worker: WorkController, sqlite_journal: Journal, memoize: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A duplicate of a ``memoize=False`` call has no value to pass on: with its ``None``,
    the chain's next step and a ``link`` would be other calls, whose effects would run
    again. The first delivery sent them; a memoizing task's duplicate sends them with the
    memo, as the first delivery did."""
    from celery import chain

    led: list[int] = []
    followed: list[Any] = []
    tag = uuid.uuid4().hex[:6]

    @celery_app.task(base=GroussetTask, max_processing_time=30, memoize=memoize,
                     name=f"tests.inproc.lead.{tag}")  # fmt: skip
    def lead(order: int) -> str:
        led.append(order)
        return f"lead-{order}"

    @celery_app.task(base=GroussetTask, max_processing_time=30, name=f"tests.inproc.follow.{tag}")
    def follow(value: Any) -> Any:
        followed.append(value)
        return value

    celery_worker.reload()  # the worker learns the new tasks
    # Given a chain and a link led by a guarded task, each run once
    assert chain(lead.s(17), follow.s()).apply_async().get(timeout=20) == "lead-17"
    assert lead.apply_async((18,), link=follow.s()).get(timeout=20) == "lead-18"
    follow.delay("first-marker").get(timeout=20)  # (the worker runs one task at a time)
    assert led == [17, 18] and followed == ["lead-17", "lead-18", "first-marker"]
    # When each is sent again: its lead is a duplicate
    with caplog.at_level(logging.INFO, logger="celery_grousset"):
        again = chain(lead.s(17), follow.s()).apply_async()
        value = again.parent.get(timeout=20)
        linked = lead.apply_async((18,), link=follow.s()).get(timeout=20)
        # (a next step or callback sent by those duplicates is ahead of this one)
        follow.delay("marker").get(timeout=20)
    stopped = [r for r in caplog.records if "grousset.canvas_stopped" in r.getMessage()]
    # Then the leads did not run again; without a memo, nothing followed the duplicates;
    # with one, they passed it on as the first deliveries did (duplicates of the follow
    # calls, answered from their memos)
    assert led == [17, 18]
    assert followed == ["lead-17", "lead-18", "first-marker", "marker"], followed
    sent = [sqlite_journal.deliveries(follow, v) for v in ("lead-17", "lead-18")]
    if memoize:
        assert (value, linked) == ("lead-17", "lead-18")
        assert again.get(timeout=20) == "lead-17" and sent == [2, 2]
    else:
        assert (value, linked) == (None, None)
        assert again.state == "PENDING" and sent == [1, 1]  # (the last step never sent)
        # ... which is said as a warning: these publishes' own canvases stop there (the
        # first deliveries, other task ids, sent theirs)
        assert [r.levelno for r in stopped] == [logging.WARNING] * 2, stopped
        assert all("first_task_id=" in r.getMessage() for r in stopped)
