"""Run ``journal.purge_expired(alias, batch_size=…)`` in a fresh process
and print JSON: rows deleted, seconds, RSS before and peak.

The peak is ``VmHWM`` from /proc/self/status (this process image's high-water
mark). ``ru_maxrss`` is not used: on Linux it carries over the parent's peak
through fork + exec, so a child of a large harness would report the harness."""

from __future__ import annotations

import json
import os
import sys
import time


def rss_mb() -> float:
    """Current resident set size of this process (MiB), from /proc."""
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """High-water mark of this process' resident set (MiB)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(alias: str, batch_size: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from celery_grousset import journal

    before = rss_mb()
    t0 = time.perf_counter()
    deleted = journal.purge_expired(alias, batch_size=batch_size)
    seconds = time.perf_counter() - t0
    peak = peak_rss_mb()
    print(json.dumps({"deleted": deleted, "seconds": seconds, "rss_before_mb": before,
                      "rss_peak_mb": peak, "rss_after_mb": rss_mb()}))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "postgresql",
         int(sys.argv[2]) if len(sys.argv) > 2 else 10_000)  # fmt: skip
