"""Tables on stdout, sections appended to bench/RESULTS.md, PNG plots (Agg backend)."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.harness import BENCH, ROOT

RESULTS = BENCH / "RESULTS.md"
PLOTS = BENCH / "plots"
DOCS_IMG = ROOT / "docs" / "img" / "bench"
#: False (``--no-record``): print tables only; no RESULTS.md section, no plot files
RECORD = True
#: appended to each section title (``--quick`` runs are marked)
TAG = ""

HEADER = """# Benchmark results

Appended by `python -m bench` (`make bench BENCH_ARGS=...`), newest last. Each
section: date, commit, machine, parameters, the table and its plot. Absolute
figures depend on the machine and on what else runs on it; compare the ratios,
which are measured against plain Celery in the same run.
"""


def commit() -> str:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                             check=False)  # fmt: skip
        return out.stdout.strip()

    sha = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{sha}{'-dirty' if dirty else ''}"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = ", load {:.1f}/{:.1f}/{:.1f} at start".format(*os.getloadavg())
    return f"{cpu}, {os.cpu_count()} CPUs{mem}, {platform.system()} {platform.release()}{load}"


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"Python {platform.python_version()}"]
    for dist in ("celery", "kombu", "Django", "psycopg", "redis"):
        with contextlib.suppress(PackageNotFoundError):
            parts.append(f"{dist} {version(dist)}")
    return ", ".join(parts)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (also readable on a terminal)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def emit(scenario: str, params: dict[str, object], headers: Sequence[str],
         rows: Sequence[Sequence[object]], plot: Path | None, record: bool,
         notes: Sequence[str] = ()) -> None:  # fmt: skip
    """Print the table; append a section to RESULTS.md (unless ``record`` is False)."""
    text = table(headers, rows)
    print(f"\n== {scenario} ==\n{text}")
    for note in notes:
        print(f"  {note}")
    if not record:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    lines = [
        f"\n## {scenario}{TAG} — {stamp}\n",
        f"* commit: `{commit()}`",
        f"* machine: {machine()}",
        f"* software: {versions()}",
        "* parameters: " + ", ".join(f"{k} = {v}" for k, v in params.items()),
        "",
        text,
        "",
        *(f"{note}  " for note in notes),
    ]
    if plot is not None:
        lines += ["", f"![{scenario}]({plot.relative_to(BENCH).as_posix()})"]
    if not RESULTS.exists():
        RESULTS.write_text(HEADER)
    with RESULTS.open("a") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"  appended to {RESULTS.relative_to(ROOT)}")


def _save(fig: object, scenario: str) -> Path | None:
    if not RECORD:
        return None
    PLOTS.mkdir(parents=True, exist_ok=True)
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    path = PLOTS / f"{scenario}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.png"
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    shutil.copyfile(path, DOCS_IMG / f"{scenario}.png")  # the docs show the latest
    return path


def bar_plot(scenario: str, groups: Sequence[str], series: Mapping[str, Sequence[float]],
             ylabel: str, title: str, annotate: str = "{:.0f}") -> Path | None:  # fmt: skip
    """Grouped bars: one group per entry of ``groups``, one bar per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) * len(series) / 2), 4.2))
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [g + i * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, labels=[annotate.format(v) for v in values], fontsize=7)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))], groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path = _save(fig, scenario)
    plt.close(fig)
    return path


def line_plot(scenario: str, xs: Sequence[float], series: Mapping[str, Sequence[float]],
              xlabel: str, ylabel: str, title: str) -> Path | None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, values in series.items():
        ax.plot(xs, values, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = _save(fig, scenario)
    plt.close(fig)
    return path
