"""Writes a ``transactional=True`` body makes outside its journal's database.

A transactional task's effect is exactly once only for its writes to the journal's
database: they commit or roll back with the completion. A write to another database
(another ``DATABASES`` alias) commits on its own, so a crash between it and the
completion makes the next delivery write it again. The system check W019 guesses this
from where the project's models are routed; this watches what the body really does:
while it runs, every other alias's connection reports its ``INSERT``/``UPDATE``/
``DELETE`` statements (Django's ``execute_wrapper``), and the first such write of each
processor and task to each alias is logged once per process (``grousset.transactional_elsewhere``,
WARNING). Nothing is refused: the body's result stands.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from celery_grousset import events

_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "MERGE")
_NOTE = (
    "a transactional=True body wrote to {alias!r}, not to its journal's database "
    "{journal!r}: those writes commit on their own, so a crash before the outcome commits "
    "makes the next delivery write them again. Put the journal on the database the task "
    "writes to (database=), or route those models there. Said once per processor, task "
    "and database."
)
_said: set[tuple[str, str, str]] = set()  # (processor, task, alias): said in this process


def _watcher(alias: str, seen: set[str]) -> Callable[..., Any]:
    def watch(execute: Callable[..., Any], sql: Any, params: Any, many: bool,
              context: Any) -> Any:  # fmt: skip
        if isinstance(sql, str) and sql.lstrip()[:7].upper().startswith(_WRITES):
            seen.add(alias)
        return execute(sql, params, many, context)

    return watch


@contextlib.contextmanager
def watched(journal: str, processor_id: str, task_name: str) -> Iterator[None]:
    """Run the block watching the other databases' connections for writes; say the
    first of each (processor, task, database) once."""
    from django.db import connections

    seen: set[str] = set()
    try:
        with contextlib.ExitStack() as stack:
            for alias in connections:
                if alias != journal:
                    stack.enter_context(connections[alias].execute_wrapper(_watcher(alias,
                                                                                    seen)))
            yield
    finally:  # a body that raised too: its writes there stand, and run again
        _say(seen, journal, processor_id, task_name)


def _say(seen: set[str], journal: str, processor_id: str, task_name: str) -> None:
    for alias in sorted(seen):
        if (processor_id, task_name, alias) not in _said:
            _said.add((processor_id, task_name, alias))
            events.emit(logging.WARNING, "grousset.transactional_elsewhere", {
                "task": task_name, "processor": processor_id, "database": alias,
                "journal": journal,
            }, note=_NOTE.format(alias=alias, journal=journal))  # fmt: skip
