"""REPORT.md from the tallies the scenarios append to results.jsonl."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

#: scenario number -> (status, what is asserted / why not)
COVERAGE: dict[int, tuple[str, str]] = {
    1: ("done", "200 duplicates, 2 workers x 2: one effect, one claim (3 backends)"),
    2: ("done", "8 rounds of 2 deliveries released together by a task_prerun barrier "
                "(3 backends)"),
    3: ("done", "protect(transactional) in a caller's atomic(): claim visible to another "
                "session at once; caller rollback leaves it in flight; the next caller takes "
                "over, 1 effect"),
    4: ("done", "stale claim + 2 deliveries at a barrier: exactly one takeover (3 backends)"),
    5: ("done", "SIGKILL after claim: taken over after max_processing_time, 1 effect"),
    6: ("done", "SIGKILL mid-effect: plain 2 effects (the documented window, counted as a "
                "takeover), transactional 1 (3 backends); SIGTERM to the child mid-effect: "
                "the claim stays in flight, plain 2 effects only after a takeover, "
                "transactional 1"),
    7: ("done", "SIGKILL after effect: plain ≤ 1 extra effect + 1 takeover, transactional 1"),
    8: ("done", "SIGKILL after completion: redelivery returns the memo, no effect, no takeover"),
    9: ("done", "SIGKILL on every attempt: GaveUp after 3 takeovers, record failed, no redelivery"),
    10: ("done", "time_limit 1.5 s < run 5 s: TimeLimitExceeded once, not requeued, the "
                 "claim left in flight"),
    11: ("done", "soft_time_limit fires while finish() waits on a row lock held by another "
                 "session: the record is completed with its memo or has no result; the worker's "
                 "next task runs"),
    12: ("done", "SIGTERM mid-task: warm shutdown completes it; duplicate gets the memo"),
    13: ("done", "visibility_timeout 1 s < countdown 4 s: ≥ 2 copies received, 1 effect"),
    14: ("done", "visibility_timeout 1 s < run 4 s: copies wait, in-flight requeues bounded"),
    15: ("done", "CLIENT KILL of the worker's db-10 connections mid-task: 1 effect, memo"),
    16: ("done", "self.retry() and autoretry_for, 2 copies: 3 attempts, 1 success"),
    17: ("done", "chord header task killed after completion: body runs once"),
    18: ("done", "SIGSTOP > max_processing_time, takeover, SIGCONT: FencedOut, result kept, "
                 "transactional effect rolled back (3 backends; on SQLite the frozen "
                 "transaction holds the only write lock, so the duplicate fails closed and "
                 "the zombie completes: no takeover)"),
    19: ("done", "zombie resumes after completion + purge + new claim: fenced out by token"),
    20: ("done", "database behind a stopped TCP proxy: fail closed, then once (PostgreSQL, "
                 "MariaDB)"),
    21: ("done", "all connections dropped while paused after the effect: completion on a fresh "
                 "connection, 1 effect"),
    22: ("done", "row lock held: the claim fails closed after STORE_TIMEOUT (2 s), then memo"),
    23: ("done", "proxy drops the claim's answer after the server committed it: re-sent claim "
                 "is RESUMED (deliveries 1, one fence)"),
    24: ("done", "purge_expired() looping during 200 duplicates: 1 effect"),
    25: ("done", "2 workers under libfaketime at +10 min and -10 min, 50 duplicates "
                 "(on_in_flight='wait'): 1 effect, no takeover (database clock); 25b: the same "
                 "with the default on_in_flight='retry' (requeues with a countdown)"),
    26: ("done", "marker dict rejected at publish; via send_task: NaN fails once "
                 "(FingerprintError), unknown marker dropped once by kombu, never redelivered"),
    27: ("done", "database unreachable after the effect through every completion retry: "
                 "requeued carrying its outcome, written by the next delivery: 1 effect, memo, "
                 "fence 1 (PostgreSQL, MariaDB); 27b: transactional, connections dropped "
                 "before the commit: effect rolled back, nothing carried, the same delivery "
                 "requeued (TransactionLost), then 1 effect"),
    28: ("done", "the completion's answer lost after the server committed it: re-sent with "
                 "the same token, 1 effect, memo (PostgreSQL, MariaDB)"),
    29: ("done", "the claim's answer lost on the warm and on the fresh connection: requeued "
                 "with its token, the next delivery frees the committed claim and runs at "
                 "once (max_processing_time 30 s), no takeover, 1 effect (PostgreSQL, MariaDB)"),
    30: ("done", "half-open connection (the proxy stops forwarding, nothing closes): the claim "
                 "fails closed within 15 s (STORE_TIMEOUT 2 s), then 1 effect (PostgreSQL, "
                 "MariaDB)"),
    31: ("done", "WORKER_CLAIM: the main process SIGKILLed after claiming 3 requests "
                 "prefetched behind a running body: a second worker takes each stale claim "
                 "over, 1 effect each (3 backends)"),
    32: ("done", "WORKER_CLAIM: a request revoked while it waits for its ETA, claimed with "
                 "its batch when due: released, never run; the others once (3 backends)"),
    33: ("done", "WORKER_CLAIM: 200 duplicates, 2 workers x 2: one effect (3 backends)"),
    34: ("done", "WORKER_CLAIM: a queue wait (1.5 s) longer than WORKER_CLAIM_RENEW_AFTER "
                 "(0.5 s): the child renews the claim, 1 effect, no takeover (3 backends)"),
    35: ("done", "WORKER_CLAIM: the journal slow for seconds (another session holds the "
                 "record's row lock, STORE_TIMEOUT 8 s): the claim waiting is the main "
                 "process's, which answers 5 control pings meanwhile, each within 1 s; then "
                 "the memo, 1 effect (PostgreSQL, MariaDB)"),
    37: ("done", "WORKER_CLAIM: the broker connections killed with 12 calls of 1 s on 2 "
                 "children, 8 prefetched: the claims of the requests Celery drops are given "
                 "back, each call once, at most 1 takeover (3 backends)"),
}


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _commit() -> str:
    """The commit the suite ran on (``-dirty`` with uncommitted changes in the package)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "celery_grousset", "tests")
    return f"{head}-dirty" if dirty else head


def render(rows: list[dict[str, Any]], runs: int, mode: str = "") -> str:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["scenario"], row["backend"])].append(row)
    out = [
        "# Chaos report",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} by "
        f"`python -m tests.chaos` on commit `{_commit()}` ({runs} run(s) requested). "
        "Counts are sums over the runs; "
        "*max dup* is the largest number of extra effects of one call in any run."
        + (f" Mode: {mode}." if mode else ""),
        "",
        "| scenario | backend | runs | passed | deliveries | effects | takeovers | fence-outs "
        "| max dup | result |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (scenario, backend), items in sorted(groups.items()):
        passed = sum(1 for r in items if r["passed"])
        out.append(
            f"| {scenario} | {backend} | {len(items)} | {passed} "
            f"| {sum(r['deliveries'] for r in items)} | {sum(r['effects'] for r in items)} "
            f"| {sum(r['takeovers'] for r in items)} | {sum(r['fence_outs'] for r in items)} "
            f"| {max(r['max_duplicate_effects'] for r in items)} "
            f"| {'PASS' if passed == len(items) else 'FAIL'} |"
        )
    notes = sorted({f"{r['scenario']} [{r['backend']}]: {n}" for r in rows for n in r["notes"]})
    if notes:
        out += ["", "## Notes from the runs", ""] + [f"* {n}" for n in notes[:60]]
    out += ["", "## Coverage of the issue's scenarios", "", "| # | status | what is asserted |",
            "|---:|---|---|"]  # fmt: skip
    out += [f"| {n} | {status} | {what} |" for n, (status, what) in COVERAGE.items()]
    out += [
        "",
        "Expected extra effects: only scenarios 6, 7, 18, 19 (plain tasks) may show one extra "
        "effect per call — the documented window (the attempt died or froze after its effect, "
        "before its completion); each is counted as a takeover or a fence-out. Scenario 19 "
        "shows 2: the record was purged, so the third run is a new call by design. Scenario 16 "
        "counts only the successful effect (`done`), not the failing attempts.",
        "",
    ]
    return "\n".join(out)
