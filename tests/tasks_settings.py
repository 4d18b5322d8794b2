"""The test settings plus ``GROUSSET["TASKS"]`` guarding the plain tasks of
:mod:`tests.plaintasks` (tests/test_settings_tasks.py runs a worker with them;
docs/configuration.md shows the region below)."""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import GROUSSET as _GROUSSET

GROUSSET = {
    **_GROUSSET,
    # --8<-- [start:tasks]
    "TASKS": {
        # one task, by its name
        "tests.plaintasks.receipt": {"max_processing_time": 30},
        # every task whose name matches the pattern (fnmatch: * ? [seq])
        "tests.plaintasks.bulk_*": {"max_processing_time": 20, "expires_after": 3600},
    },
    # --8<-- [end:tasks]
}
