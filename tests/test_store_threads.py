"""Stores are per thread (celery_grousset.store.get_store): a thread's connection is
closed when the thread ends, greenlets are not threads, and a fork leaves the parent's
connections alone — with real PostgreSQL and MariaDB sessions."""

from __future__ import annotations

import gc
import os
import threading
import uuid
from typing import Any

from celery_grousset.claim import ClaimRequest, Kind
from celery_grousset.store import get_store
from tests import services


def request() -> ClaimRequest:
    return ClaimRequest(
        f"threads-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex * 2, "t", uuid.uuid4().hex,
        uuid.uuid4().hex, "w", "", 60.0, 3600.0, 3,
    )  # fmt: skip


def claim_on(alias: str) -> Any:
    """This thread's store of ``alias``, after a claim (its connection open)."""
    store = get_store(alias)
    assert store.claim(request()).kind is Kind.NEW
    return store


def test_a_threads_connection_is_closed_when_the_thread_ends() -> None:
    services.require_database("postgresql")
    seen: list[Any] = []
    # Given a thread that used the journal, then ended
    thread = threading.Thread(target=lambda: seen.append(claim_on("postgresql")._conn))
    thread.start()
    thread.join()
    gc.collect()
    # Then its connection was closed (not left to the server's idle timeout), and this
    # thread's store is another one
    assert seen[0].closed
    assert claim_on("postgresql")._conn is not seen[0]


def test_a_fork_leaves_another_threads_connection_to_the_parent() -> None:
    """In a forked child, the other threads' stores are freed; a MySQL connection freed
    there says goodbye (COM_QUIT) on the socket it shares with the parent, whose session
    then ended under the parent's thread."""
    services.require_database("mysql")
    ready, done = threading.Event(), threading.Event()
    held: dict[str, Any] = {}

    def holder() -> None:
        held["store"] = claim_on("mysql")
        held["session"] = held["store"]._conn.thread_id()
        ready.set()
        done.wait(30)
        held["after"] = claim_on("mysql")._conn.thread_id()

    thread = threading.Thread(target=holder)
    thread.start()
    assert ready.wait(30)
    # When the process forks, and the child exits
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        gc.collect()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    done.set()
    thread.join()
    # Then the parent's thread goes on on the same server session
    assert held["after"] == held["session"]


def test_a_fork_leaves_the_claim_threads_connection_to_the_parent() -> None:
    """The worker's claim thread keeps its own stores, outside every thread's: a forked
    child that freed the claimer's store said goodbye on the parent's session."""
    from celery_grousset.batch_claim import Claimer

    services.require_database("mysql")
    claimer = Claimer(batch_size=1)
    try:
        # Given the claim thread's store of a MySQL journal, connected
        store = claimer._store("mysql")
        assert store.claim(request()).kind is Kind.NEW
        session = store._conn.thread_id()
        # When the process forks, and the child frees the claimer's stores
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            claimer.stores.clear()
            del store
            gc.collect()
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        # Then the parent's claims go on on the same server session
        assert store.claim(request()).kind is Kind.NEW
        assert store._conn.thread_id() == session
    finally:
        claimer.stop(pool_stopped=True)


def test_a_connection_dropped_in_its_own_process_is_not_kept() -> None:
    """A store drops its connection after an error (discard): only a forked child must
    keep it unfreed; in its own process a kept one stayed open for the worker's life,
    one server session per error."""
    from celery_grousset.store import base

    services.require_database("postgresql")
    store = claim_on("postgresql")
    kept = len(base._ORPHANS)
    store.discard()
    assert len(base._ORPHANS) == kept and store._conn is None
    # ... while a forked child keeps it (the parent's socket)
    claim_on("postgresql")._conn  # noqa: B018 - connected again
    get_store("postgresql").discard(forked=True)
    assert len(base._ORPHANS) == kept + 1
    base._ORPHANS.pop()
