"""``Store.claim_all`` of a batch (the worker's main-process claim) on PostgreSQL: ONE
transaction, the same decisions as one claim at a time."""

from __future__ import annotations

import uuid

import pytest

from celery_grousset.claim import Kind
from celery_grousset.exceptions import PoisonDelivery
from celery_grousset.models import Outcome
from celery_grousset.store import Completion, Store, get_store
from tests import services
from tests.test_store_contract import req


@pytest.fixture
def pg_store() -> Store:
    services.require_database("postgresql")
    return get_store("postgresql")


def key(first: str) -> str:
    """A fingerprint that sorts by ``first`` (the batch locks rows in key order)."""
    return first + uuid.uuid4().hex + uuid.uuid4().hex[: 63 - 32]


def test_a_batch_decides_each_key_as_one_claim_would(pg_store: Store, processor: str) -> None:
    done, held = req(processor, key("1")), req(processor, key("2"))
    assert pg_store.claim_all([done])[0].kind is Kind.NEW
    assert pg_store.finish(processor, done.fingerprint, done.token, Completion("completed"))
    pg_store.claim_all([held])
    new_a, new_b = req(processor, key("4")), req(processor, key("0"))
    # Given two new keys, a completed one and one held by a fresh claim, in no key order
    batch = [new_a, req(processor, done.fingerprint), req(processor, held.fingerprint), new_b]
    # When they are claimed as one batch
    results = pg_store.claim_all(batch)
    # Then each result is the one-claim decision, in the order asked
    assert [r.kind for r in results] == [Kind.NEW, Kind.COMPLETED, Kind.IN_FLIGHT, Kind.NEW]
    assert results[1].fence < results[0].fence  # clock fences: the older claim's is lower
    assert results[2].retry_in > 0


def test_a_batch_is_one_transaction(pg_store: Store, processor: str) -> None:
    first, second = req(processor, key("0")), req(processor, key("1"))
    refused = req(processor, key("f"), args_repr="nul \x00 inside")  # refused for its data
    # When a batch holds a claim the database refuses (locked last, in key order)
    with pytest.raises(PoisonDelivery):
        pg_store.claim_all([first, second, refused])
    # Then the claims before it in the same batch were rolled back with it
    fps = [first.fingerprint, second.fingerprint, refused.fingerprint]
    assert not Outcome.objects.using("postgresql").filter(fingerprint__in=fps).exists()
    # and the store still claims afterwards
    assert [r.kind for r in pg_store.claim_all([first, second])] == [Kind.NEW, Kind.NEW]
