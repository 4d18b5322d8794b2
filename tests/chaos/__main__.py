"""``python -m tests.chaos`` (``make chaos``): the whole chaos suite ``CHAOS_RUNS``
times (default 5), then ``tests/chaos/REPORT.md`` (``REPORT-worker-claim.md`` with
``GROUSSET_TEST_WORKER_CLAIM=1``: every worker claims in its main process).

Extra arguments go to pytest (e.g. ``python -m tests.chaos -k 05``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

# Databases and Redis dbs of their own, so a chaos run never drops another session's.
DEFAULTS = {
    "GROUSSET_TEST_PG_NAME": "grousset_chaos",
    "GROUSSET_TEST_MYSQL_NAME": "grousset_chaos",
    "GROUSSET_TEST_TMP": "/tmp/grousset-chaos",
    "GROUSSET_TEST_BROKER": "redis://127.0.0.1:6379/10",
    "GROUSSET_TEST_BACKEND": "redis://127.0.0.1:6379/9",
}


def main(argv: list[str]) -> int:
    runs = int(os.environ.get("CHAOS_RUNS") or 5)
    results = ROOT / "tests" / "artifacts" / "chaos" / "run-results.jsonl"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)
    env = {**DEFAULTS, **os.environ, "CHAOS_FULL": "1", "CHAOS_RESULTS": str(results)}
    failed = 0
    for n in range(1, runs + 1):
        print(f"== chaos run {n}/{runs}", flush=True)
        cmd = [sys.executable, "-m", "pytest", str(HERE), "-p", "no:cacheprovider", "-q",
               "-m", "chaos", *argv]  # fmt: skip
        failed += subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode != 0
    from tests.chaos.report import load, render

    # With the main-process claim switched on, the report is a separate file.
    on = env.get("GROUSSET_TEST_WORKER_CLAIM") == "1"
    report = HERE / ("REPORT-worker-claim.md" if on else "REPORT.md")
    mode = "every worker with `WORKER_CLAIM` on (`GROUSSET_TEST_WORKER_CLAIM=1`)" if on else ""
    report.write_text(render(load(results), runs, mode))
    print(f"wrote {report}; {failed} of {runs} run(s) had failures", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
