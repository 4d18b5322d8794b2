"""Scenario 25: workers whose clocks are 10 minutes ahead and behind (libfaketime).
The journal uses the database clock only, so staleness and expiry do not move."""

from __future__ import annotations

import os
import re
import time
from datetime import datetime, timezone
from typing import Any

import pytest

import tests.chaos_tasks as ct
from tests.chaos.harness import effects, new_key, record_of, start_worker

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def _log_skew(text: str) -> float:
    """Seconds between the worker's first log timestamp and now (real clock)."""
    m = re.search(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+: ", text)
    assert m, "no timestamp in the worker log"
    stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    return stamp.timestamp() - time.time()


def test_25_workers_with_skewed_clocks(broker: str, pg: str, queue: str, tally: Any) -> None:
    if not os.path.exists(LIB):
        pytest.skip("libfaketime is not installed (Debian package faketime)")
    t = tally("25 worker clocks offset +/-10 min", "postgresql")
    ws = []
    try:
        for offset in ("+10m", "-10m"):
            env = {"LD_PRELOAD": LIB, "FAKETIME": offset,
                   "TZ": "UTC"}  # fmt: skip
            ws.append(start_worker(queue, database=pg, concurrency=1, env=env))
        # Given two workers 10 minutes ahead and 10 minutes behind
        skews = [_log_skew(w.text()) for w in ws]
        assert skews[0] > 500 and skews[1] < -500, f"faketime not applied: {skews}"
        key = new_key("s25")
        # When 50 duplicates of one call run on both (on_in_flight="wait": no ETAs)
        results = [ct.skewed.apply_async((key, 0.5), queue=queue) for _ in range(50)]
        values = [r.get(timeout=120) for r in results]
    finally:
        for w in ws:
            w.stop()
    rec = record_of(pg, ct.skewed, (key, 0.5))
    t.add_key(pg, key, rec)
    t.add_logs(ws)
    # Then no worker judged the claim stale by its own clock: one effect, no takeover
    assert len({repr(v) for v in values}) == 1
    assert effects(pg, key) == 1 and rec.takeovers == 0 and values[0]["fence"] == rec.fence


def test_25b_skewed_clocks_with_in_flight_requeues(broker: str, pg: str, queue: str,
                                                   tally: Any) -> None:  # fmt: skip
    if not os.path.exists(LIB):
        pytest.skip("libfaketime is not installed (Debian package faketime)")
    t = tally("25b worker clocks +/-10 min, on_in_flight=retry", "postgresql")
    ws = []
    key = new_key("s25b")
    try:
        for offset in ("+10m", "-10m"):
            env = {"LD_PRELOAD": LIB, "FAKETIME": offset, "TZ": "UTC"}
            ws.append(start_worker(queue, database=pg, concurrency=1, env=env))
        # Given skewed workers and duplicates that find the claim in flight (default
        # on_in_flight="retry": the delivery is re-published with a countdown)
        results = [ct.effect.apply_async((key, 1.0), queue=queue) for _ in range(6)]
        # When they are processed / Then they all finish in bounded time, once
        values = [r.get(timeout=60) for r in results]
    finally:
        for w in ws:
            w.stop()
    rec = record_of(pg, ct.effect, (key, 1.0))
    t.add_key(pg, key, rec)
    t.add_logs(ws)
    assert len({repr(v) for v in values}) == 1
    assert effects(pg, key) == 1 and rec.takeovers == 0
