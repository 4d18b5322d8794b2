"""``manage.py grousset_stats`` end to end, as an operator runs it, on a large journal.

    .venv/bin/python -m bench.stats_cli \\
        --url postgres://postgres@127.0.0.1:5432/grousset_scale \\
        --url postgres://postgres@127.0.0.1:5432/grousset_scale_part --repeat 5

Each ``--url`` is the example project's ``DATABASE_URL`` (its journal database), so the
process is a real project's ``manage.py``: Django's setup and the Celery app it imports
(``proj/__init__.py``, Celery's Django recipe) included. First the project's and the
package's modules are byte-compiled, as ``pip install`` does for an installed package
(with ``PYTHONDONTWRITEBYTECODE`` set and no ``__pycache__``, every start would compile
them again). Then, per journal, the wall time (median and max of ``--repeat``, after
one warm-up) of:

* ``manage.py version``: the process start alone (Django, the settings, the Celery app);
* ``manage.py grousset_stats`` (the default window), and what that window counted
  (``--json``: the window, whether it was narrowed, the expired count);
* ``manage.py grousset_stats --since 1h``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench import report
from bench.harness import ROOT

MANAGE = str(ROOT / "manage.py")


def run(url: str, *argv: str) -> tuple[float, str]:
    """``manage.py <argv>`` against the journal at ``url``: (seconds, stdout)."""
    env = {**os.environ, "DATABASE_URL": url}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, MANAGE, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    seconds = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"manage.py {' '.join(argv)} failed on {url}:\n{proc.stderr}")
    return seconds, proc.stdout


def timed(url: str, repeat: int, *argv: str) -> dict[str, float]:
    run(url, *argv)  # warm-up: the OS cache, the database's buffers
    times = [run(url, *argv)[0] for _ in range(repeat)]
    return {"median_s": statistics.median(times), "max_s": max(times)}


def measure(url: str, repeat: int, processor: str | None) -> dict[str, Any]:
    only = ["--processor-id", processor] if processor else []
    out: dict[str, Any] = {"url": url.rsplit("/", 1)[-1]}
    out["version"] = timed(url, repeat, "version")
    out["stats"] = timed(url, repeat, "grousset_stats", *only)
    data = json.loads(run(url, "grousset_stats", "--json", *only)[1])
    out["window_s"], out["narrowed"] = data["since_seconds"], bool(data["narrowed_from_seconds"])
    out["entries"], out["expired"] = data["entries"], data["expired"]
    out["stats_1h"] = timed(url, repeat, "grousset_stats", "--since", "1h", *only)
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", action="append", required=True, help="a journal's DATABASE_URL")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--processor-id", default=None, help="count only this processor's entries")
    p.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    args = p.parse_args(argv)
    for tree in ("celery_grousset", "example_project"):
        compileall.compile_dir(str(ROOT / tree), quiet=1)
    results = [measure(url, args.repeat, args.processor_id) for url in args.url]

    def ms(d: dict[str, float]) -> str:
        return f"{d['median_s'] * 1000:.0f} / {d['max_s'] * 1000:.0f}"

    rows = [
        [r["url"], ms(r["version"]), ms(r["stats"]),
         f"{r['window_s'] / 3600:g} h{' (narrowed)' if r['narrowed'] else ''}", f"{r['entries']:,}",
         "not counted" if r["expired"] is None else f"{r['expired']:,}", ms(r["stats_1h"])]
        for r in results
    ]  # fmt: skip
    report.emit(
        "stats-cli (manage.py grousset_stats end to end)",
        {"repeat": args.repeat, "processor": args.processor_id or "all"},
        ["journal", "manage.py version ms (median / max)", "grousset_stats ms",
         "default window", "entries counted", "expired", "--since 1h ms"],
        rows, None, args.record,
    )  # fmt: skip
    return results


if __name__ == "__main__":
    main()
