"""Claim stores, one per database vendor (see :mod:`celery_grousset.store.base`)."""

from celery_grousset.store.base import ClaimResult, Completion, Store, get_store, reset_stores

__all__ = ["ClaimResult", "Completion", "Store", "get_store", "reset_stores"]
