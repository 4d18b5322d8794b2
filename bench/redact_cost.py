"""What redacting a call's arguments costs (``args_repr``, as every claim stores it:
``celery_grousset.quoted.redacted_call``), per argument shape: every character and every
item read (the one pass of the redaction pattern over every string, every container
rendered whole) against what the package does (``celery_grousset.anchored``: the pattern
tried only near the characters a secret needs, no further than ``max_length +
SCAN_MARGIN``; a container's items rendered only until the shown part is full). Both in
one process, taking turns, best of 7 rounds. ``python -m bench.redact_cost`` prints a
Markdown table.
"""

from __future__ import annotations

import re
import subprocess
import timeit
from collections.abc import Callable
from typing import Any

from celery_grousset import anchored, redact
from celery_grousset.quoted import redacted_call
from celery_grousset.redact import DEFAULT_REDACT_KEYS

_HTML = '<p class="a">Hello <b>world</b> see <a href="https://ex.com/x?y=1">link</a></p>\n'
_PROSE = "Dear customer, your order 12345 of 2026-12-03 ships today. Thanks for shopping! "
SHAPES: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "two ints": ((42, 7), {}),
    "an order (5 kwargs)": ((), {"order_id": 123456, "amount": "19.99", "currency": "EUR",
                                 "email": "a.customer@example.com",
                                 "note": "Deliver to the back door after 5pm, ring twice"}),
    "2 KB of words": (("lorem ipsum " * 170,), {}),
    "2 KB of prose with numbers": (((_PROSE * 30)[:2000],), {}),
    "2 KB of HTML": (((_HTML * 30)[:2000],), {}),
    "50 KB of HTML": ((_HTML * 700,), {}),
    "1 MB of words": (("lorem ipsum " * 87_000,), {}),
    "a list of 10,000 ints": ((list(range(10_000)),), {}),
    "1,000 order lines (dicts)": ((), {"lines": [
        {"sku": f"SKU-{i}", "name": "Widget deluxe", "qty": i, "price": "19.99"}
        for i in range(1_000)]}),
    "a dict of 3,000 keys": ((), {"data": {f"k{i}": [i, "x", {"y": i}] for i in range(3_000)}}),
}  # fmt: skip


def _one_pass(pattern: re.Pattern[str], repl: Callable[[re.Match[str]], str], text: str) -> str:
    return pattern.sub(repl, text)


def _cost(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    size = sum(len(a) * (1 if isinstance(a, str) else 20) if hasattr(a, "__len__") else 1
               for a in (*args, *kwargs.values()))  # fmt: skip
    number = max(3, min(2000, 2_000_000 // max(size, 1)))
    return timeit.timeit(
        lambda: redacted_call(args, kwargs, dict(kwargs) or None, DEFAULT_REDACT_KEYS, 1024),
        number=number,
    ) / number


def _whole(_renderer: object, _item: object = None) -> bool:
    return True  # every item rendered, as before items stopped at the shown part


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()  # fmt: skip
    print(f"Redaction per call, best of 7 (commit {commit}; ARGS_REPR_MAX_LENGTH 1024)\n")
    print("| arguments | every character and item | anchored, bounded | ratio |")
    print("|---|---:|---:|---:|")
    real, margin, unspent = anchored.sub, redact.SCAN_MARGIN, redact._Renderer.unspent
    ways: tuple[tuple[Any, int, Any], ...] = ((_one_pass, 10**9, _whole), (real, margin, unspent))
    for name, (args, kwargs) in SHAPES.items():
        best = [float("inf"), float("inf")]
        for _ in range(7):
            for i, (sub, scanned, items) in enumerate(ways):
                anchored.sub, redact.SCAN_MARGIN = sub, scanned  # type: ignore[assignment]
                redact._Renderer.unspent = items  # type: ignore[method-assign]
                try:
                    best[i] = min(best[i], _cost(args, kwargs))
                finally:
                    anchored.sub, redact.SCAN_MARGIN = real, margin  # type: ignore[assignment]
                    redact._Renderer.unspent = unspent  # type: ignore[method-assign]
        print(f"| {name} | {best[0] * 1e6:,.1f} µs | {best[1] * 1e6:,.1f} µs "
              f"| {best[1] / best[0]:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
