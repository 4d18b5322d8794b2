"""Worker-side measurement, identical for every variant.

Each pool child keeps, in memory, the first ``task_prerun`` and the last
``task_postrun`` time, counts deliveries by final state and counts effects (task
bodies that ran). A daemon thread started in the child publishes these figures
to a Redis hash every 0.2 s (and the keys whose effect ran, when
``BENCH_RECORD_KEYS`` is set), so the per-task cost is two clock reads and a few
dict updates — the same for every variant — and the harness learns the run is
over without the worker doing any I/O per task.

Every process also counts the statements it sends through psycopg (a wrapper around
``psycopg.Cursor.execute``: one integer increment per statement, the same for every
variant). The worker's main process writes its own count, and its claim thread's
passes and claims (``WORKER_CLAIM``), to the same hash when the worker shuts down.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from celery import signals

from celery_grousset.signals import duplicate_skipped

STATS_KEY = os.environ.get("BENCH_STATS_KEY", "")
RECORD_KEYS = bool(os.environ.get("BENCH_RECORD_KEYS"))
URL = os.environ.get("BENCH_BACKEND", "redis://127.0.0.1:6379/11")

_lock = threading.Lock()
_state: dict[str, Any] = {"pid": 0}
_new_keys: list[str] = []


#: the worker's main process (set when it is ready)
_main_pid: list[int] = []
#: statements this process sent through psycopg (see :func:`_count_statements`)
_statements = [0]


def _count_statements() -> None:
    import psycopg

    execute = psycopg.Cursor.execute

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        _statements[0] += 1
        return execute(self, *args, **kwargs)

    psycopg.Cursor.execute = counted  # type: ignore[method-assign]


_count_statements()


def _reset() -> None:
    if os.getpid() not in _main_pid:  # a pool child counts from its first task
        _statements[0] = 0
    _state.update(pid=os.getpid(), first=None, last=None, ok=0, retry=0, fail=0, effects=0)
    _new_keys.clear()
    if STATS_KEY:
        threading.Thread(target=_flusher, name="bench-probe", daemon=True).start()


def _flusher() -> None:
    import redis

    client = redis.Redis.from_url(URL)
    while True:
        time.sleep(0.2)
        flush(client)


def flush(client: Any) -> None:
    """Publish this child's figures (and the keys that got an effect)."""
    with _lock:
        keys = list(_new_keys)
        _new_keys.clear()
        data = {k: v for k, v in _state.items() if k != "pid"}
        if os.getpid() not in _main_pid:  # the main process reports at shutdown
            data["statements"] = _statements[0]
    pipe = client.pipeline(transaction=False)
    if keys:
        pipe.sadd(f"{STATS_KEY}:keys", *keys)
    pipe.hset(STATS_KEY, str(os.getpid()), json.dumps(data))
    pipe.execute()


def _ensure() -> None:
    if _state["pid"] != os.getpid():
        _reset()


@signals.task_prerun.connect
def _prerun(**_: Any) -> None:
    now = time.time()
    _ensure()
    if _state["first"] is None:
        _state["first"] = now


@signals.task_postrun.connect
def _postrun(state: str | None = None, **_: Any) -> None:
    now = time.time()
    with _lock:
        _state["last"] = now
        if state == "SUCCESS":
            _state["ok"] += 1
        elif state == "RETRY":
            _state["retry"] += 1
        else:
            _state["fail"] += 1


@signals.worker_ready.connect
def _ready(**_: Any) -> None:
    _main_pid.append(os.getpid())  # the worker's main process (pool children fork earlier)


def _answered_in_main(**_: Any) -> None:
    """A duplicate that ``WORKER_CLAIM`` answered in the worker's main process: it never
    reaches a pool child (no ``task_prerun`` / ``task_postrun``), so it is counted here —
    only here: in a pool child the per-task path's duplicate also ends in ``task_postrun``."""
    if os.getpid() not in _main_pid:
        return
    now = time.time()
    _ensure()
    with _lock:
        if _state["first"] is None:
            _state["first"] = now
        _state["last"] = now
        _state["ok"] += 1


@signals.worker_shutdown.connect
def _main_summary(sender: Any = None, **_: Any) -> None:
    """The worker's main process: its statements (the claim thread's, with
    ``WORKER_CLAIM``) and the claim thread's passes and claims, under ``main:<pid>``."""
    if not STATS_KEY:
        return
    import redis

    claimer = getattr(getattr(sender, "consumer", None), "_grousset_claimer", None)
    data = {"statements": _statements[0], "passes": getattr(claimer, "passes", 0),
            "claimed": getattr(claimer, "claimed", 0)}  # fmt: skip
    redis.Redis.from_url(URL).hset(STATS_KEY, f"main:{os.getpid()}", json.dumps(data))


duplicate_skipped.connect(_answered_in_main, weak=False, dispatch_uid="bench.probe")


def effect(key: str) -> None:
    """Called by every task body: one effect happened for ``key``."""
    _ensure()
    with _lock:
        _state["effects"] += 1
        if RECORD_KEYS:
            _new_keys.append(key)
