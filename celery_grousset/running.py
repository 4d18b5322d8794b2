"""The keys whose owned body runs in this context: a call of one of them inside its own
run is refused (it would wait for its own claim, then run the effect a second time)."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from celery_grousset.claim import ClaimRequest
from celery_grousset.exceptions import InvalidArgument
from celery_grousset.store import Store

#: the keys whose owned body runs in this context: (journal alias, processor, fingerprint)
RUNNING: ContextVar[frozenset[tuple[str, str, str]]] = ContextVar("grousset_running",
                                                                 default=frozenset())


def not_running(store: Store, req: ClaimRequest) -> None:
    """Refuse to claim a key whose own body runs in this context (``protect()`` of the
    same key inside its ``fn``, a task calling itself with the same arguments): the call
    waited for its own claim, took it over once stale and ran the effect a second time,
    the outer attempt then fenced out (or, raising, released for a retry to run again)."""
    if (store.alias, req.processor_id, req.fingerprint) in RUNNING.get():
        raise InvalidArgument(
            f"{req.task_name}: a call of the same key ({req.args_repr or req.fingerprint[:12]})"
            " inside that key's own run would wait for itself, then run the effect a second "
            "time. The body already runs under the key's claim: call the function directly, "
            "or give the inner call a key of its own."
        )


def holding(key: tuple[str, str, str], fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn``, run with ``key`` among the keys :data:`RUNNING` in its context."""

    def body() -> Any:
        scope = RUNNING.set(RUNNING.get() | {key})
        try:
            return fn()
        finally:
            RUNNING.reset(scope)

    return body
