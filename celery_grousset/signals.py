"""Django signals sent by the guard. Receivers get ``sender`` (the task name or
``"protect"``) and keyword arguments named in each docstring."""

from __future__ import annotations

from django.dispatch import Signal

__all__ = ["claim_taken_over", "duplicate_skipped", "fenced_out"]

#: A duplicate delivery was not run: ``fingerprint``, ``task_id``, ``processor_id``,
#: ``original_task_id``, ``completed_at``, ``deliveries``, ``outcome`` (``"completed"``:
#: it got the memo; ``"failed"``: the memoized failure was raised again).
duplicate_skipped = Signal()

#: A stale claim of a dead attempt was taken over: ``fingerprint``, ``task_id``,
#: ``processor_id``, ``fence``, ``takeovers``.
claim_taken_over = Signal()

#: An attempt lost its claim before completing; its result was discarded (and in
#: transactional mode its writes rolled back): ``fingerprint``, ``task_id``,
#: ``processor_id``, ``fence``.
fenced_out = Signal()
