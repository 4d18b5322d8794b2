"""The benchmarks still run (``python -m bench --quick``), on the real services.

Speed is measured in bench/, never asserted here. What this checks is the
plumbing a benchmark run depends on, so that a change to the store or the task
cannot silently break ``make bench``: every scenario prints its table, every
variant drains all its deliveries (a variant that fails is reported as FAILED),
the duplicates scenario runs each key's effect exactly once, a duplicate claim on
PostgreSQL is one statement, and the cost scenario finds the worker's processes.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import services

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _require_bench() -> None:
    missing = [m for m in ("matplotlib", "celery_once", "aws_lambda_powertools", "MySQLdb")
               if importlib.util.find_spec(m) is None]  # fmt: skip
    if missing:
        services.unavailable("the [bench] extra", f"cannot import {', '.join(missing)}; "
                             "`pip install -e '.[bench]'`")  # fmt: skip
    for what, port in (("PostgreSQL", 5432), ("MariaDB", 3306), ("Redis", 6379)):
        if not services.port_open("127.0.0.1", port):
            services.unavailable(what, f"nothing listens on 127.0.0.1:{port}")
    if not Path("/proc/stat").exists():
        pytest.skip("the cost scenario reads /proc (Linux only)")


def _run_bench(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *args, "--quick", "--no-record"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def _rows(out: str, scenario: str) -> list[list[str]]:
    """The table rows printed under ``== scenario ==`` (cells, stripped)."""
    section = out.split(f"== {scenario} ==", 1)[1].split("\n\n", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_every_scenario_runs_and_counts_what_it_claims() -> None:
    _require_bench()
    out = _run_bench(
        "throughput", "duplicates", "store", "scale",
        "--variants", "grousset-pg,grousset-pg-batch,grousset-sqlite,raw-pg,celery-once,powertools",
        "--bodies", "noop", "--n", "200", "--dup-keys", "40",
        "--dup-variants", "grousset-pg,grousset-pg-batch",
        "--scale-rows", "2000", "--purge-rows", "5000",
    )  # fmt: skip
    # cost reads CPU counters between 5 % and 95 % of the deliveries: it needs a drain
    # that lasts several of the children's 0.2 s reports
    out += _run_bench("cost", "--bodies", "noop", "--n", "2000")
    assert "FAILED" not in out, out[-4000:]

    throughput = {row[1]: row for row in _rows(out, "throughput")}
    assert len(throughput) == 7, throughput  # plain + the six variants asked for
    assert all(float(row[2]) > 0 for row in throughput.values()), throughput
    # journal commits per task, read from pg_stat_database: a claim and a completion each
    commits = float(throughput["GroussetTask (PostgreSQL)"][5])
    assert 1.9 <= commits <= 2.5, throughput
    assert throughput["plain Celery"][5] == "n/a", throughput
    # statements sent through psycopg by the worker's processes (probe-counted): the
    # claim and the completion; the claim thread's batches only with WORKER_CLAIM
    statements = float(throughput["GroussetTask (PostgreSQL)"][6])
    assert 1.9 <= statements <= 2.5, throughput
    # (plain Celery: none per task; the worker step's one schema read at start, which
    # celery_grousset in INSTALLED_APPS gives every app's worker, is under 0.1 at n=200)
    plain_statements = throughput["plain Celery"][6]
    assert plain_statements == "n/a" or float(plain_statements) < 0.1, throughput
    assert throughput["plain Celery"][7] == "n/a", throughput
    assert throughput["GroussetTask (PostgreSQL)"][7] == "n/a", throughput
    assert float(throughput["GroussetTask (PostgreSQL, WORKER_CLAIM)"][7]) >= 1.0, throughput

    assert out.count("effects = unique keys = 40 in every round: yes") == 2, out[-4000:]
    guarded = [r for r in _rows(out, "duplicates") if r[0].startswith("GroussetTask")]
    assert len(guarded) == 2, guarded  # the per-task claim and WORKER_CLAIM
    assert all(r[4] == "40" for r in guarded), guarded  # one effect per key, not per delivery

    store = _rows(out, "store")
    dup = next(r for r in store if r[:3] == ["postgresql", "duplicate claim",
                                              "celery-grousset store"])  # fmt: skip
    assert dup[5] == "1.00", dup  # statements per duplicate claim
    assert {r[0] for r in store} == {"postgresql", "sqlite", "mysql"}, store

    assert len(_rows(out, "scale")) == 2, out[-4000:]  # empty + 2,000 rows

    cost = {row[1]: row for row in _rows(out, "cost")}
    assert set(cost) == {"plain Celery", "GroussetTask (PostgreSQL)",
                         "GroussetTask (PostgreSQL, WORKER_CLAIM)",
                         "raw psycopg INSERT…ON CONFLICT + UPDATE"}, cost  # fmt: skip
    # The process groups are found: pool children and the worker parent use CPU in
    # every variant, and the PostgreSQL server where claims are made.
    for label, row in cost.items():
        children, parent, postgres = (float(x) for x in row[4:7])
        assert children > 0 and parent > 0, row
        if label != "plain Celery":
            assert postgres > 0, row
    assert "Bound, noop body" in out


def run_scale_bench(module: str, args: list[str], database: str, out: Path) -> dict[str, Any]:
    """``python -m bench.<module> … --out out`` on the scratch database ``database`` (and
    its ``_part`` twin), dropped afterwards; the JSON it wrote."""
    import json

    import psycopg

    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["BENCH_PG_NAME"] = database
    try:
        proc = subprocess.run(
            [sys.executable, "-m", f"bench.{module}", *args, "--out", str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    finally:
        with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres",
                             autocommit=True) as conn:  # fmt: skip
            for name in (database, f"{database}_part"):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    return dict(json.loads(out.read_text()))


def test_scale_retire_times_every_statement_of_a_retention(tmp_path: Path) -> None:
    """``bench.scale_retire`` on a small journal: both days are dropped whole, every
    statement of the purge is timed (the DROP TABLE among them), claims ran during day 1;
    and the file-system probe times a removal with flushes alongside."""
    _require_bench()
    import json

    args = ["--rows-per-day", "3000", "--live-per-day", "500", "--samples", "50"]
    result = run_scale_bench("scale_retire", args, "grousset_scale_ci", tmp_path / "retire.json")
    (one,) = result["rounds"]
    for day in ("day0", "day1"):
        assert one[day]["rows"] == 3000, one[day]
        drops = [s for s in one[day]["steps"] if s[0].startswith("DROP TABLE")]
        assert len(drops) == 1 and drops[0][2] > 0, one[day]["steps"]
        assert one[day]["seconds"] >= drops[0][2]
    assert one["day1"]["claim_during"]["n"] > 0 and one["claim_idle"]["n"] == 50
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    probe = subprocess.run(
        [sys.executable, "-m", "bench.scale_retire", "--unlink-probe", "0.002"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    found = json.loads(probe.stdout.split("unlink probe ", 1)[1].splitlines()[0])
    assert found["during_seconds"] > 0 and found["flush_idle"]["n"] > 0, found


def test_scale_convert_prepares_and_converts_a_journal_with_claims_running(
    tmp_path: Path,
) -> None:
    """``bench.scale_convert`` on a small journal: prepare ran while claims did, the
    conversion copied nothing (same file), each layout's claims were sampled, and the
    revert copied every row back."""
    _require_bench()
    result = run_scale_bench("scale_convert", ["--rows", "3000", "--samples", "20", "--revert"],
                             "grousset_scale_ci_convert", tmp_path / "convert.json")  # fmt: skip
    assert len(result["prepare"]["done"]) == 6 and result["prepare"]["claim_during"]["n"] > 0
    convert = result["convert"]
    assert convert["copied"] is False and convert["same_file"] is True, convert
    assert result["sizes_partitioned"]["tables"] >= 5  # the old table and 4 generations
    # the rows filled, and the new keys each of the three sampled phases claimed
    assert result["revert"]["rows"] >= 3000 + 3 * 20 and result["revert"]["seconds"] > 0
    for phase in ("idle_single", "idle_prepared", "idle_partitioned", "idle_reverted"):
        assert result[phase]["duplicate_old_row"]["n"] == 20, result[phase]


def test_stats_cli_times_the_command_as_an_operator_runs_it(processor: str) -> None:
    """``bench.stats_cli`` against the test PostgreSQL journal: real ``manage.py``
    processes of the example project; the window it reports is the command's own."""
    services.require_database("postgresql")
    import uuid

    from django.conf import settings

    from bench import stats_cli
    from celery_grousset.claim import ClaimRequest
    from celery_grousset.store import get_store

    for n in range(2):  # two entries of this processor, started now
        get_store("postgresql").claim(ClaimRequest(
            processor_id=processor, fingerprint=uuid.uuid4().hex * 2, task_name="tests.cli",
            task_id=f"t{n}", token=uuid.uuid4().hex, worker="w:1", args_repr="()",
            max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
        ))  # fmt: skip
    db = settings.DATABASES["postgresql"]
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    (one,) = stats_cli.main(["--url", url, "--repeat", "1", "--processor-id", processor])
    assert (one["entries"], one["expired"]) == (2, 0)
    assert (one["window_s"], one["narrowed"]) == (86400.0, False)
    assert one["version"]["median_s"] > 0 and one["stats"]["median_s"] > 0
    assert one["stats_1h"]["max_s"] >= one["stats_1h"]["median_s"] > 0


def test_claim_batch_claims_each_batch_on_both_layouts() -> None:
    """``bench.claim_batch`` on the test PostgreSQL server: every (layout, way) variant is
    timed, and every new key of every batch was owned (the bench stops otherwise)."""
    services.require_database("postgresql")
    services.require_partitioned()
    from bench import claim_batch

    rows = claim_batch.main(["--sizes", "3", "--rounds", "1"])
    assert sorted((r[0], r[2]) for r in rows) == [
        ("partitioned", "batch"), ("partitioned", "one by one"),
        ("single", "batch"), ("single", "one by one"),
    ]  # fmt: skip
    assert all(float(r[3]) > 0 for r in rows)
    assert {r[5] for r in rows if r[2] == "one by one"} == {"1.00x"}
