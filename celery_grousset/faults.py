"""Fault injection for the chaos suite (tests/chaos): :func:`fault` costs one test of a
module constant unless the environment variable ``GROUSSET_FAULT`` is set.

``GROUSSET_FAULT=<point>:<action>[:<marker>]`` where point is one of
``after_claim``, ``mid_effect``, ``after_effect``, ``after_complete`` (and
``outbox_published`` in the outbox relay); action is
``kill`` (SIGKILL this process), ``stop`` (SIGSTOP it), ``term`` (SIGTERM),
``pgkill`` (terminate this process' journal connection from another session);
the fault fires only if the file named by ``GROUSSET_FAULT_ARM`` exists (and is
then removed, so exactly one attempt is hit), and when ``marker`` is given only
in tasks whose fingerprint or name contains it.
"""

from __future__ import annotations

import os
import signal
from typing import Any

POINTS = ("after_claim", "mid_effect", "after_effect", "after_complete")

_FAULT = os.environ.get("GROUSSET_FAULT", "")


def fault(point: str) -> None:
    """Chaos hook: ``GROUSSET_FAULT=<point>:<action>[:<task-substring>]``."""
    if _FAULT:
        trigger(_FAULT, point)


def messages() -> list[Any]:
    """Warning ``W021`` while this process has ``GROUSSET_FAULT`` set (outside the chaos
    suite it would kill, stop or disconnect a worker at a point of every guarded task)."""
    from django.core import checks

    if not _FAULT:
        return []
    return [checks.Warning(
        f"GROUSSET_FAULT={_FAULT!r} is set: the fault injection of celery-grousset's own "
        "chaos tests is armed in this process, and kills, stops or disconnects it at that "
        "point of guarded tasks.",
        hint="Unset GROUSSET_FAULT (and GROUSSET_FAULT_ARM): they are for celery-grousset's "
        "test suite only.", id="celery_grousset.W021")]  # fmt: skip


def kill_self(sig: int = signal.SIGKILL) -> None:  # pragma: no cover - used by chaos hooks
    os.kill(os.getpid(), sig)


def _armed() -> bool:
    arm = os.environ.get("GROUSSET_FAULT_ARM")
    if not arm:
        return True
    try:
        os.unlink(arm)  # atomic: exactly one process wins
    except FileNotFoundError:
        return False
    return True


def _matches(marker: str) -> bool:
    """Whether the running task's name or fingerprint contains ``marker``."""
    from celery import current_task

    task = current_task
    if task is None:
        return False
    if marker in task.name:
        return True
    try:
        return marker in task.grousset.fingerprint  # type: ignore[attr-defined]
    except Exception:  # not a guarded task, or no attempt running
        return False


def trigger(spec: str, point: str) -> None:
    want, _, rest = spec.partition(":")
    action, _, marker = rest.partition(":")
    if want != point or (marker and not _matches(marker)) or not _armed():
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "pgkill":
        _terminate_journal_backend()


def _terminate_journal_backend() -> None:
    from celery_grousset.store import get_store

    store = get_store()
    terminate = getattr(store, "terminate_connection", None)
    if terminate is not None:
        terminate()
