"""The claim pass of the worker's main process (``--grousset-batch``,
celery_grousset.batch_pass) with more than one journal database."""

from __future__ import annotations

import types
import uuid

from django.conf import settings
from django.test import override_settings

from celery_grousset import batch_pass, guard
from celery_grousset.options import Options
from celery_grousset.store import get_store, reset_stores
from tests import services
from tests.blackhole import blackhole


def _job(processor: str, alias: str) -> batch_pass.Job:
    """A request of a call journaled on ``alias``, as the event loop hands it over."""
    opts = Options.resolve("tests.batch", {"processor_id": processor, "database": alias,
                                           "max_processing_time": 30},
                           default_processor=processor)  # fmt: skip
    key = uuid.uuid4().hex
    claim = guard.request(opts, key * 2, "tests.batch", f"task-{key}", "(key)")
    request = types.SimpleNamespace(request_dict={})  # (what lost() marks)
    return batch_pass.Job(request, lambda _: None, claim, alias, f"task-{key}")


def test_a_journal_database_found_down_is_left_to_the_children_for_a_while(
    processor: str,
) -> None:
    """With two journal databases, every claim pass asked the one that did not answer
    again, waiting its timeout each time before the other database's claims (a review:
    a task on the healthy journal took 15 s instead of 0.1 s)."""
    services.require_database("postgresql")
    pg = settings.DATABASES["postgresql"]
    silent = f"silent{uuid.uuid4().hex[:6]}"
    # Given two journal databases, one that accepts connections and never answers
    with blackhole((pg["HOST"] or "127.0.0.1", int(pg["PORT"]))) as proxy:
        proxy.deaf.set()
        deaf = {**pg, "HOST": "127.0.0.1", "PORT": str(proxy.port),
                "OPTIONS": {"sslmode": "disable"}}  # fmt: skip
        with services.extra_database(silent, **deaf), override_settings(
            GROUSSET={"DATABASE": "postgresql", "STORE_TIMEOUT": 0.5}
        ):
            reset_stores()
            # When two passes claim a request on each
            first = [_job(processor, silent), _job(processor, "postgresql")]
            batch_pass.claim_pass(get_store, first)
            asked = proxy.accepted
            second = [_job(processor, silent), _job(processor, "postgresql")]
            batch_pass.claim_pass(get_store, second)
            again = proxy.accepted
        reset_stores()
    # Then the healthy database's requests are claimed in both passes, the silent one's
    # go to the pool unclaimed (its children claim them), and the second pass did not
    # ask the silent database again
    assert [j.action for j in first + second] == [batch_pass.PER_TASK, batch_pass.OWNED] * 2
    assert asked >= 1 and again == asked, (asked, again)
