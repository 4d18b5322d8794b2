"""Tables and plots of a ``bench.scale_ab`` run (the two journal layouts at scale).

    .venv/bin/python -m bench.scale_report [bench/.work/scale-ab.json]

Appends a ``scale-layouts`` section to bench/RESULTS.md with two plots: claim p99 by
journal size and layout, and retention of one day (seconds and WAL) by layout.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from bench import harness, report

OPS = ("claim", "claim_complete", "duplicate", "duplicate_old_row")


def pq(s: dict[str, Any]) -> str:
    """A sample's ``p50 / p99`` cell, ms."""
    return f"{s['p50_ms']:.2f} / {s['p99_ms']:.2f}"
LAYOUTS = ("single", "partitioned")


def latency_rows(result: dict[str, Any]) -> list[list[str]]:
    empty = {lay: result["points"][0][lay]["claim"]["p99_ms"] for lay in LAYOUTS}
    rows = []
    for point in result["points"]:
        for lay in LAYOUTS:
            cells = [f"{point['rows']:,}", lay]
            for op in OPS:
                s = point[lay].get(op)
                cells.append(pq(s) if s else "-")
            cells.append(f"{point[lay]['claim']['p99_ms'] / empty[lay]:.2f}x")
            rows.append(cells)
    return rows


def retention_rows(ret: dict[str, Any]) -> list[list[str]]:
    rows = []
    for lay in LAYOUTS:
        d0, d1 = ret["day0"][lay], ret["day1_with_claims"][lay]
        idle, during = ret["claim_idle"][lay], d1["claim_during"]
        rows.append([
            lay, f"{d0['rows']:,}", f"{d0['seconds']:.2f}", f"{d1['seconds']:.2f}",
            f"{d0['wal_bytes'] / 1e6:.2f} / {d1['wal_bytes'] / 1e6:.2f}",
            f"{d1['heap_bytes'] / 1e9:.2f} / {d1['index_bytes'] / 1e9:.2f}",
            f"{d1['dead_rows']:,}",
            f"{idle['p99_ms']:.2f} → {during['p99_ms']:.2f} "
            f"({during['p99_ms'] / idle['p99_ms']:.2f}x, n={during['n']})",
        ])  # fmt: skip
    return rows


def record(result: dict[str, Any]) -> None:
    sizes = [p["rows"] for p in result["points"]]
    plot = report.line_plot(
        "scale-layouts", sizes,
        {f"{lay} {op} p99": [p[lay][op]["p99_ms"] for p in result["points"]]
         for lay in LAYOUTS for op in ("claim", "duplicate")},
        "rows in the journal", "ms",
        "Claim and duplicate-claim p99 by journal size, single table vs partitioned",
    )  # fmt: skip
    headers = ["rows", "layout", *(f"{op} p50 / p99 ms" for op in OPS), "claim p99 vs empty"]
    params = {"commit": result["commit"], "sizes": ", ".join(f"{s:,}" for s in sizes),
              "layouts": "single, partitioned (1 generation a day)"}  # fmt: skip
    report.emit("scale-layouts", params, headers, latency_rows(result), plot, True)
    warm = result.get("warm")
    if warm:
        rows = []
        for lay in LAYOUTS:
            empty = result["points"][0][lay]["claim"]["p99_ms"]
            cells = [pq(warm[lay][op]) for op in OPS]
            rows.append([lay, *cells, f"{warm[lay]['claim']['p99_ms'] / empty:.2f}x"])
        read = ", ".join(f"{k} {v / 1e9:.1f} GB" for k, v in warm["index_bytes_read"].items())
        report.emit("scale-warm", {"indexes read into the OS cache": read},
                    ["layout", *(f"{op} p50 / p99 ms" for op in OPS), "claim p99 vs empty"],
                    rows, None, True)  # fmt: skip
    again = result.get("retention_again")
    if again:
        d0, d1, idle = again["day0"], again["day1_with_claims"], again["claim_idle"]
        during = d1["claim_during"]
        report.emit("scale-retention-again", {"layout": "partitioned, one scan"},
                    ["rows a day", "day 0 s", "day 1 s (claims running)", "WAL MB day 0 / day 1",
                     "claim p99 ms idle → during"],
                    [[f"{d0['rows']:,}", f"{d0['seconds']:.2f}", f"{d1['seconds']:.2f}",
                      f"{d0['wal_bytes'] / 1e6:.2f} / {d1['wal_bytes'] / 1e6:.2f}",
                      f"{idle['p99_ms']:.2f} → {during['p99_ms']:.2f} "
                      f"({during['p99_ms'] / idle['p99_ms']:.2f}x, n={during['n']})"]],
                    None, True)  # fmt: skip
    ret = result.get("retention")
    if not ret:
        return
    plot = report.bar_plot(
        "scale-retention", list(LAYOUTS),
        {"day 0 alone (s)": [ret["day0"][lay]["seconds"] for lay in LAYOUTS],
         "day 1 with claims (s)": [ret["day1_with_claims"][lay]["seconds"] for lay in LAYOUTS],
         "WAL day 1 (MB)": [ret["day1_with_claims"][lay]["wal_bytes"] / 1e6 for lay in LAYOUTS]},
        "seconds / MB", "Retention of one day of rows at the largest size", "{:.2f}",
    )  # fmt: skip
    headers = ["layout", "rows a day", "day 0 s", "day 1 s (claims running)",
               "WAL MB day 0 / day 1", "heap / index GB after", "dead rows after",
               "claim p99 ms idle → during"]  # fmt: skip
    notes = [f"server WAL in the background: {ret['background_wal_bytes_per_s']:.0f} B/s"]
    report.emit("scale-retention", {"at rows": f"{sizes[-1]:,}"}, headers,
                retention_rows(ret), plot, True, notes)  # fmt: skip


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else str(harness.WORK / "scale-ab.json")
    with open(path) as fh:
        record(json.load(fh))
