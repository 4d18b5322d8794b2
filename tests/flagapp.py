"""The test Celery app with the celery-grousset worker flags installed
(``celery -A tests.flagapp worker --grousset-…``) and the tasks of
:mod:`tests.flagtasks`.

Only worker processes import this module: ``tests.flagtasks`` holds a guarded task
without ``max_processing_time`` (it relies on ``--grousset-max-processing-time``),
which the system checks report as E001 in any process that imports it.
"""

from __future__ import annotations

from celery_grousset.worker import install
from tests.celeryapp import app

install(app)

import tests.flagtasks  # noqa: E402, F401  (registers the flag tasks on app)

__all__ = ["app"]
