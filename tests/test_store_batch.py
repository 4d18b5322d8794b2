"""``Store.claim_all`` of a batch (the worker's main-process claim), on PostgreSQL (both
journal layouts), SQLite and MariaDB: ONE statement (PostgreSQL) or ONE short
transaction (the others), the same decisions and rows as one claim at a time, and no
deadlock between batches."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from celery_grousset import journal
from celery_grousset.claim import ENC_EXCEPTION, ClaimRequest, Kind
from celery_grousset.exceptions import PoisonDelivery
from celery_grousset.models import Outcome
from celery_grousset.store import Completion, Store
from tests import services
from tests.racer import claim_batches, run_racers
from tests.test_store_contract import _layout, age, alias, completed, req, row

# Every test here runs on each backend and on the partitioned PostgreSQL journal too
# (the contract suite's fixtures: its layouts, its stores).
__all__ = ["_layout", "alias"]


def key(first: str) -> str:
    """A fingerprint that sorts by ``first`` (the batch locks rows in key order)."""
    return first + uuid.uuid4().hex + uuid.uuid4().hex[: 63 - 32]


# Each state of the decision table: build it for a key, return the next claim's request.
def _new(s: Store, a: str, p: str, fp: str) -> ClaimRequest:
    return req(p, fp)


def _held(s: Store, p: str, fp: str, **over: Any) -> ClaimRequest:
    first = req(p, fp, task_id=f"holder-{fp[:8]}", **over)
    assert s.claim(first).owned
    return first


def _resumed(s: Store, a: str, p: str, fp: str) -> ClaimRequest:
    return req(p, fp, token=_held(s, p, fp).token)


def _mismatch(s: Store, a: str, p: str, fp: str) -> ClaimRequest:
    _held(s, p, fp, payload_hash="a" * 64)
    return req(p, fp, payload_hash="b" * 64)


def _in_flight(s: Store, a: str, p: str, fp: str) -> ClaimRequest:
    _held(s, p, fp)
    return req(p, fp)


def _redelivered(s: Store, a: str, p: str, fp: str) -> ClaimRequest:
    _held(s, p, fp)
    return req(p, fp, task_id=f"holder-{fp[:8]}")  # the holder's own delivery again


def _bounced(s: Store, a: str, p: str, fp: str) -> ClaimRequest:
    _held(s, p, fp)
    return req(p, fp, bounce=True)


def _takeover(s: Store, a: str, p: str, fp: str) -> ClaimRequest:
    _held(s, p, fp)
    age(a, p, fp, 61)
    return req(p, fp)


def _gave_up(s: Store, a: str, p: str, fp: str) -> ClaimRequest:
    _held(s, p, fp, max_takeovers=1)
    age(a, p, fp, 61)
    assert s.claim(req(p, fp, max_takeovers=1)).kind is Kind.TAKEOVER
    age(a, p, fp, 61)
    return req(p, fp, max_takeovers=1)


def _finished(completion: Completion) -> Callable[[Store, str, str, str], ClaimRequest]:
    def state(s: Store, a: str, p: str, fp: str) -> ClaimRequest:
        assert s.finish(p, fp, _held(s, p, fp).token, completion)
        return req(p, fp)

    return state


def _expired(s: Store, a: str, p: str, fp: str) -> ClaimRequest:
    nxt = _finished(completed())(s, a, p, fp)
    age(a, p, fp, 3601, "expires_on")
    return nxt


STATES: dict[str, tuple[Callable[[Store, str, str, str], ClaimRequest], Kind]] = {
    "new": (_new, Kind.NEW),
    "resumed": (_resumed, Kind.RESUMED),
    "mismatch": (_mismatch, Kind.MISMATCH),
    "in_flight": (_in_flight, Kind.IN_FLIGHT),
    "redelivered": (_redelivered, Kind.IN_FLIGHT),
    "bounced": (_bounced, Kind.IN_FLIGHT),
    "takeover": (_takeover, Kind.TAKEOVER),
    "gave_up": (_gave_up, Kind.GAVE_UP),
    "expired": (_expired, Kind.EXPIRED),
    "reclaim": (_finished(Completion("failed", None, "", "E: x")), Kind.RECLAIM),
    "completed": (_finished(completed()), Kind.COMPLETED),
    "failed": (_finished(Completion("failed", b"{}", ENC_EXCEPTION, "E: y")), Kind.FAILED),
}


def _seen(alias: str, r: ClaimRequest, res: Any, fence_before: int | None) -> tuple[Any, ...]:
    """What a claim decided and the row it left, without what differs between twin keys
    (tokens, task ids, times): the decision, the answer and the row's columns."""
    o = row(alias, r.processor_id, r.fingerprint)
    deliveries = [d.decision for d in journal.deliveries_of(alias, r.task_id)]
    holder = [d.decision for d in journal.deliveries_of(alias, f"holder-{r.fingerprint[:8]}")]
    return (
        res.kind, res.status, res.deliveries, res.takeovers, res.result, res.result_encoding,
        res.error, res.payload_hash, res.task_id == r.task_id, res.fence == fence_before,
        res.retry_in > 0, o.status, o.deliveries, o.takeovers, o.duplicates, o.result,
        o.result_encoding, o.error, o.payload_hash, o.claim_token == r.token,
        o.completed_at is None, o.stale_at - o.started_at,
        o.expires_on - (o.completed_at if res.kind is Kind.GAVE_UP else o.started_at),
        o.first_claimed_at == o.started_at, deliveries, holder,
    )  # fmt: skip


def _fence(alias: str, r: ClaimRequest) -> int | None:
    o = Outcome.objects.using(alias).filter(processor_id=r.processor_id, fingerprint=r.fingerprint)
    return o.values_list("fence", flat=True).first()


def test_a_batch_decides_and_writes_each_state_as_one_claim(
    store: Store, alias: str, processor: str
) -> None:
    # Given every state of the decision table twice, on twin keys
    names = list(STATES)
    alone = {n: STATES[n][0](store, alias, processor, key("1")) for n in names}
    batch = {n: STATES[n][0](store, alias, processor, key("2")) for n in names}
    fences = {n: (_fence(alias, alone[n]), _fence(alias, batch[n])) for n in names}
    # When one twin of each is claimed alone and the others as ONE batch, in no key order
    single = {n: store.claim(alone[n]) for n in names}
    random.shuffle(names)
    together = dict(zip(names, store.claim_all([batch[n] for n in names]), strict=True))
    # Then each state gets its decision, and the same answer and row either way
    for n in names:
        assert single[n].kind is STATES[n][1], n
        expected = _seen(alias, alone[n], single[n], fences[n][0])
        assert _seen(alias, batch[n], together[n], fences[n][1]) == expected, n


def test_a_key_twice_in_a_batch_is_claimed_as_one_claim_after_the_other(
    store: Store, processor: str
) -> None:
    fp = key("5")
    first, second = req(processor, fp), req(processor, fp)
    results = store.claim_all([first, req(processor, key("0")), second])
    assert [r.kind for r in results] == [Kind.NEW, Kind.NEW, Kind.IN_FLIGHT]


def test_a_batch_is_one_transaction(store: Store, alias: str, processor: str) -> None:
    first, second = req(processor, key("0")), req(processor, key("1"))
    refused = req(processor, key("f"), task_id="x" * 300)  # refused for its data
    # When a batch holds a claim the journal refuses (locked last, in key order)
    with pytest.raises(PoisonDelivery):
        store.claim_all([first, second, refused])
    # Then the claims before it in the same batch were rolled back with it
    fps = [first.fingerprint, second.fingerprint, refused.fingerprint]
    assert not Outcome.objects.using(alias).filter(fingerprint__in=fps).exists()
    # and the store still claims afterwards
    assert [r.kind for r in store.claim_all([first, second])] == [Kind.NEW, Kind.NEW]


@pytest.fixture
def commits(store: Store, alias: str) -> Iterator[Callable[[], int]]:
    """The number of commits the store's private connection has made so far (SQLite: the
    COMMITs it sent; MariaDB: the session's Com_commit; PostgreSQL: see
    tests/test_pg_roundtrips.py, one statement in autocommit)."""
    store.claim(req("warm-up", key("0")))  # connected
    conn: Any = store._conn  # type: ignore[attr-defined]
    if store.vendor == "sqlite":
        sent: list[str] = []
        conn.set_trace_callback(sent.append)
        yield lambda: sum(1 for s in sent if s.strip().upper() == "COMMIT")
        conn.set_trace_callback(None)
    elif store.vendor == "mysql":

        def count() -> int:
            cur = conn.cursor()
            cur.execute("SHOW SESSION STATUS LIKE 'Com_commit'")
            return int(cur.fetchone()[1])

        yield count
    else:
        pytest.skip("PostgreSQL: one statement, counted on the wire (test_pg_roundtrips.py)")


def test_a_batch_commits_once(
    store: Store, alias: str, processor: str, commits: Callable[[], int]
) -> None:
    done = req(processor, key("3"))
    store.claim(done)
    store.finish(processor, done.fingerprint, done.token, completed())
    batch = [req(processor, key(str(i))) for i in range(8)] + [req(processor, done.fingerprint)]
    before = commits()
    results = store.claim_all(batch)
    assert commits() - before == 1
    assert [r.kind for r in results] == [Kind.NEW] * 8 + [Kind.COMPLETED]


@pytest.mark.timeout(300)
def test_four_processes_claim_overlapping_batches_each_key_once(
    alias: str, processor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if alias == services.PARTITIONED:  # the racers' settings: the partitioned store
        monkeypatch.setenv("GROUSSET_TEST_LAYOUT", "partitioned")
    # Given 4 OS processes behind a barrier, each claiming the same 200 keys in its own
    # random order, in batches of 50 (so the batches overlap in every way)
    keys = [uuid.uuid4().hex * 2 for _ in range(200)]
    owned = [fp for got in run_racers(claim_batches, 4, alias, keys, processor) for fp in got]
    # Then every key is owned by exactly one claim, and the journal has one row per key
    counts = Counter(owned)
    assert set(counts) == set(keys) and max(counts.values()) == 1
    assert Outcome.objects.using(alias).filter(processor_id=processor).count() == 200
    rows = Outcome.objects.using(alias).filter(processor_id=processor)
    assert set(rows.values_list("deliveries", flat=True)) == {4}
