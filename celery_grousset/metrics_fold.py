"""The counts of dead pool children, folded into one file per kind before each scrape.

prometheus-client's multiprocess mode keeps a counter file and a histogram file for each
process that ever counted, and a scrape reads them all. A worker with
``--max-tasks-per-child`` replaces its children for as long as it runs: their files
piled up (about 0.1 ms of scrape per dead child: 10,000 children, a second; a worker up
for weeks passed Prometheus's scrape timeout, and every series was lost). Before each
scrape the worker's parent adds the values of each dead process's files into
``counter_folded.db`` / ``histogram_folded.db`` in the same directory and removes them,
so the totals stay what they were and the files stay as many as the live processes
(docs/operations.md, "Metrics").

A scrape folds and reads under one lock (a file lock: scrapes at once, of one worker or
of workers sharing a ``PROMETHEUS_MULTIPROC_DIR``, never see a file half folded), and
serves no counter below what it served before (the folded sum adds the same values in
another order: a float ``_sum`` could come out one rounding step lower, which Prometheus
would read as a reset).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger("celery_grousset")

#: the kinds whose values add up across processes (gauges are served by the parent)
KINDS = ("counter", "histogram")
FOLDED = "folded"  #: the ``<kind>_folded.db`` file that holds what dead processes counted


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def dead_files(path: str, kind: str) -> list[str]:
    """The ``<kind>_<pid>.db`` files of ``path`` whose process is gone."""
    found = []
    for name in glob.glob(os.path.join(path, f"{kind}_*.db")):
        pid = os.path.basename(name)[len(kind) + 1 : -3]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            found.append(name)
    return found


def fold_dead(path: str) -> int:
    """Fold the files of the dead processes of ``path`` into its folded files; how many.
    (The caller holds :func:`locked`.)"""
    folded = 0
    for kind in KINDS:
        dead = dead_files(path, kind)
        if dead:
            folded += _fold(os.path.join(path, f"{kind}_{FOLDED}.db"), dead)
    return folded


def _fold(target: str, dead: list[str]) -> int:
    from prometheus_client.mmap_dict import MmapedDict

    into = MmapedDict(target)  # type: ignore[no-untyped-call]
    try:
        totals = dict(_values(target))
        for name in dead:
            values = list(_values(name))  # (read whole first: a bad file stays as it is)
            os.unlink(name)
            for key, value in values:
                totals[key] = totals.get(key, 0.0) + value
                _write(into, key, totals[key])
    finally:
        into.close()  # type: ignore[no-untyped-call]
    return len(dead)


def _values(name: str) -> Iterator[tuple[str, float]]:
    from prometheus_client.mmap_dict import MmapedDict

    for entry in MmapedDict.read_all_values_from_file(name):  # type: ignore[no-untyped-call]
        yield entry[0], entry[1]  # (key, value[, timestamp], position)


def _write(into: Any, key: str, value: float) -> None:
    try:
        into.write_value(key, value, 0.0)  # (prometheus-client 0.18+: a timestamp)
    except TypeError:
        into.write_value(key, value)


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    with open(os.path.join(path, ".fold.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def collector(registry: Any, path: str) -> Any:
    """prometheus-client's multiprocess collector of ``path``, folding first on each scrape
    (a fold that fails is logged, and the scrape reads the files as they are)."""
    from prometheus_client import multiprocess

    served: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    class FoldingCollector(multiprocess.MultiProcessCollector):
        def collect(self) -> Any:
            with locked(path):
                try:
                    fold_dead(path)
                except Exception as exc:  # never fail a scrape for it
                    logger.warning(
                        "celery-grousset metrics: could not fold the counts of dead "
                        "processes in %s: %s: %s", path, type(exc).__name__, exc
                    )
                families = list(super().collect())  # type: ignore[no-untyped-call]
            return [_never_lower(f, served) for f in families]

    return FoldingCollector(registry, path=path)  # type: ignore[no-untyped-call]


def _never_lower(family: Any, served: dict[Any, float]) -> Any:
    """``family`` with no counter or histogram sample below what was served before."""
    if family.type not in ("counter", "histogram"):
        return family
    for i, sample in enumerate(family.samples):
        key = (sample.name, tuple(sorted(sample.labels.items())))
        value = served[key] = max(sample.value, served.get(key, sample.value))
        family.samples[i] = sample._replace(value=value)
    return family
