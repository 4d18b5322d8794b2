"""Retention beside live traffic: a purge batch never waits for a row another
transaction holds (a claim's, an operator's), so it never holds the rows it already
deleted while it waits, and two purges at once take different rows."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import transaction

from celery_grousset import journal
from celery_grousset.models import Outcome
from celery_grousset.store import get_store
from tests import services
from tests.test_store_contract import age, completed, req


def expired_rows(alias: str, processor: str, count: int) -> list[str]:
    """``count`` completed rows of ``processor`` whose retention has passed."""
    store, fps = get_store(alias), [uuid.uuid4().hex * 2 for _ in range(count)]
    for fp in fps:
        r = req(processor, fp)
        store.claim(r)
        store.finish(processor, fp, r.token, completed())
        age(alias, processor, fp, 3601, "expires_on")
    return fps


@pytest.mark.parametrize("name", ["postgresql", "mysql"])
def test_purge_skips_a_row_another_transaction_holds_instead_of_waiting(
    name: str, processor: str
) -> None:
    """A purge batch waited on a row another transaction held while holding every row it
    had already deleted: claims of those keys waited for it, up to STORE_TIMEOUT (a
    review saw a batch take 12 s and claims fail). Two purges at once deadlocked on
    MariaDB, and a batch cut short by a re-claimed row ended the run with rows left."""
    services.require_database(name)
    # Given five expired completed rows, one of them held by another transaction
    fps = expired_rows(name, processor, 5)
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(using=name):
                Outcome.objects.using(name).select_for_update().get(
                    processor_id=processor, fingerprint=fps[0])  # fmt: skip
                held.set()
                done.wait(10)
        finally:
            from django.db import connections

            connections[name].close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        # When the journal is purged in batches of two
        started = time.monotonic()
        deleted = journal.purge_expired(name, batch_size=2)
        took = time.monotonic() - started
    finally:
        done.set()
        holder.join()
    # Then it did not wait for the held row: it deleted every other one, and left that one
    left = set(Outcome.objects.using(name).filter(processor_id=processor)
               .values_list("fingerprint", flat=True))  # fmt: skip
    assert left == {fps[0]}
    assert deleted >= 4 and took < 5, (deleted, took)
    # And the next run takes it
    journal.purge_expired(name, batch_size=2)
    assert not Outcome.objects.using(name).filter(processor_id=processor).exists()


def test_sqlite_purge_waits_for_the_write_lock_instead_of_failing(processor: str) -> None:
    """On SQLite a batch read its ids, then its DELETE had to upgrade that read to a
    write, which SQLite refuses at once ("database is locked", no busy wait) while a
    claim holds the write lock: the purge failed whenever a worker claimed meanwhile."""
    import sqlite3

    from django.conf import settings

    alias = "default"
    expired_rows(alias, processor, 3)
    # Given another connection (a claim's) that holds the write lock for a moment
    other = sqlite3.connect(settings.DATABASES[alias]["NAME"], isolation_level=None,
                            check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(1.0, lambda: other.execute("COMMIT"))
    releaser.start()
    try:
        # When the journal is purged meanwhile
        deleted = journal.purge_expired(alias, batch_size=2)
    finally:
        releaser.join()
        other.close()
    # Then it waited for the lock and deleted every expired row
    assert deleted >= 3
    assert not Outcome.objects.using(alias).filter(processor_id=processor).exists()
