"""The example project (example_project/, manage.py) and its demo (``make demo``).

Everything runs in subprocesses: the example project has settings of its own
(``proj.settings``), and this pytest process is already set up with
``tests.settings``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import services

ROOT = Path(__file__).resolve().parent.parent
#: variables of the caller's shell that would point the example project elsewhere
_FOREIGN = ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DJANGO_SETTINGS_MODULE",
            "GROUSSET_DEMO_DIR", "CELERY_TASK_DEFAULT_QUEUE", "PYTHONPATH")  # fmt: skip
GUARDED = ["shop.tasks.book", "shop.tasks.charge", "shop.tasks.send_receipt",
           "shop.tasks.slow_receipt"]  # fmt: skip


def project_env(demo_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    return {**env, "GROUSSET_DEMO_DIR": str(demo_dir), **extra}


def run(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "manage.py", *args], env)


def shell_json(env: dict[str, str], code: str) -> object:
    """Run ``code`` in ``manage.py shell``; it prints one JSON document last."""
    out = manage(env, "shell", "-v", "0", "-c", code)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_system_checks_pass_with_warnings_as_errors(tmp_path: Path) -> None:
    # Given the example project with its defaults (SQLite, filesystem broker)
    env = project_env(tmp_path)

    # When Django's system checks run, celery-grousset's included, warnings failing too
    out = manage(env, "check", "--fail-level", "WARNING")

    # Then there is nothing to report
    assert out.returncode == 0, out.stdout + out.stderr
    assert "celery_grousset." not in out.stdout + out.stderr
    assert "no issues" in out.stdout


def test_checks_see_every_guarded_task(tmp_path: Path) -> None:
    # Given the example project
    env = project_env(tmp_path)

    # When the check's own task discovery runs in it
    names = shell_json(env, "import json; from celery_grousset.checks import guarded_tasks; "
                       "print(json.dumps(sorted(t.name for _, t in guarded_tasks())))")  # fmt: skip

    # Then it finds the shop's four GroussetTasks (so the passing check above was not vacuous)
    assert names == GUARDED


def test_every_beat_entry_names_a_registered_task(tmp_path: Path) -> None:
    # Given the example project's Celery app with its task modules loaded
    env = project_env(tmp_path)

    # When its beat schedule and its task registry are compared
    code = (
        "import json; from proj.celery import app; app.loader.import_default_modules(); "
        "beat = sorted(e['task'] for e in app.conf.beat_schedule.values()); "
        "print(json.dumps({'beat': beat, 'tasks': sorted(app.tasks)}))"
    )
    conf = shell_json(env, code)

    # Then beat schedules the journal purge, and the worker would know that task
    assert isinstance(conf, dict)
    assert conf["beat"] == ["celery_grousset.purge_expired"]
    assert set(conf["beat"]) <= set(conf["tasks"])


def test_migrations_are_current_and_the_journal_database_checks_clean(tmp_path: Path) -> None:
    # Given a fresh SQLite database for the example project
    env = project_env(tmp_path)

    # When it is migrated, and the models compared with the migrations
    migrate = manage(env, "migrate", "-v", "0")
    pending = manage(env, "makemigrations", "--check", "--dry-run")
    db_check = manage(env, "check", "--database", "default", "--fail-level", "WARNING")

    # Then the migrations apply, none is missing, and the database checks (WAL) pass
    assert migrate.returncode == 0, migrate.stderr
    assert pending.returncode == 0, pending.stdout + pending.stderr
    assert db_check.returncode == 0, db_check.stdout + db_check.stderr
    assert (tmp_path / "db.sqlite3").exists()


_SETTINGS = """
import json
from django.conf import settings
from proj.celery import app
db = settings.DATABASES["default"]
print(json.dumps({
    "engine": db["ENGINE"], "name": str(db["NAME"]), "host": db.get("HOST", ""),
    "port": str(db.get("PORT", "")), "broker": app.conf.broker_url,
    "options": app.conf.broker_transport_options, "results": app.conf.result_backend,
    "acks_late": app.conf.task_acks_late, "reject": app.conf.task_reject_on_worker_lost,
    "prefetch": app.conf.worker_prefetch_multiplier,
    "beat": app.conf.beat_schedule["grousset-purge-expired"]["task"],
    "processor": settings.GROUSSET["PROCESSOR_ID"],
}))
"""


def test_defaults_need_no_server(tmp_path: Path) -> None:
    # Given no DATABASE_URL / CELERY_BROKER_URL in the environment
    env = project_env(tmp_path)

    # When the settings are loaded
    conf = shell_json(env, _SETTINGS)

    # Then SQLite, the filesystem broker (one folder in and out) and file results live
    # in the demo folder, and the Celery options the guard relies on are on
    assert isinstance(conf, dict)
    assert conf["engine"] == "django.db.backends.sqlite3"
    assert conf["name"] == str(tmp_path / "db.sqlite3")
    assert conf["broker"] == "filesystem://"
    options = conf["options"]
    queue = str(tmp_path / "broker" / "queue")
    assert options["data_folder_in"] == options["data_folder_out"] == queue
    assert Path(options["processed_folder"]).parent == tmp_path / "broker"
    assert conf["results"] == f"file://{tmp_path / 'results'}"
    assert (conf["acks_late"], conf["reject"], conf["prefetch"]) == (True, True, 1)
    assert conf["beat"] == "celery_grousset.purge_expired"
    assert conf["processor"] == "shop"


def test_servers_come_from_the_environment(tmp_path: Path) -> None:
    # Given DATABASE_URL and CELERY_BROKER_URL naming real servers (not contacted here)
    env = project_env(tmp_path, DATABASE_URL="postgres://shop:secret@db.example:5433/shop",
                      CELERY_BROKER_URL="redis://broker.example:6379/3",
                      CELERY_RESULT_BACKEND="redis://broker.example:6379/4")  # fmt: skip

    # When the settings are loaded
    conf = shell_json(env, _SETTINGS)

    # Then Django and Celery use them, with a visibility timeout above max_processing_time
    assert isinstance(conf, dict)
    assert conf["engine"] == "django.db.backends.postgresql"
    assert (conf["host"], conf["port"], conf["name"]) == ("db.example", "5433", "shop")
    assert conf["broker"] == "redis://broker.example:6379/3"
    assert conf["results"] == "redis://broker.example:6379/4"
    assert conf["options"]["visibility_timeout"] >= 60


# -- the demo ---------------------------------------------------------------------------------


def table_rows(output: str, title: str) -> list[list[str]]:
    """The rows of the demo's table under the heading that starts with ``title``."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"== {title}"))
    rows = []
    for line in lines[start + 3:]:  # heading, column names, rule
        if not line.startswith("  ") or not line.strip() or not re.search(r"\S {2,}\S", line):
            break
        rows.append(re.split(r" {2,}", line.strip()))
    return rows


def run_demo(env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    out = run([sys.executable, "-m", "example_project.demo"], env, timeout=150)
    return out, time.monotonic() - t0


def assert_demo_succeeded(out: subprocess.CompletedProcess[str], seconds: float) -> None:
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert seconds < 120, f"the demo took {seconds:.0f}s"
    journal = table_rows(out.stdout, "the outcome journal")
    # fingerprint, task, order, sent, status, deliveries, takeovers, memo
    assert sorted({row[1] for row in journal}) == ["book", "charge", "send_receipt",
                                                   "slow_receipt"]  # fmt: skip
    assert all(row[4] == "completed" for row in journal), journal
    assert all(int(row[5]) >= int(row[3]) for row in journal), journal
    assert any(int(row[5]) > 1 for row in journal if row[1] != "slow_receipt"), journal
    assert [int(row[6]) >= 1 for row in journal if row[1] == "slow_receipt"] == [True]
    effects = table_rows(out.stdout, "the effects")
    # call, effect, count, results, same value for all
    assert len(effects) == len(journal)
    assert all(row[2] == "1" and row[4] == "yes" for row in effects), effects
    assert "FAILED" not in out.stdout


@pytest.mark.slow
def test_demo_without_servers(tmp_path: Path) -> None:
    # Given a fresh demo folder and no server settings (SQLite + filesystem broker)
    env = project_env(tmp_path)

    # When the demo runs: a real worker, a killed pool process, duplicate deliveries
    out, seconds = run_demo(env)

    # Then it exits 0 within 2 minutes, the journal saw duplicates and a takeover, and
    # every key had exactly one effect
    assert_demo_succeeded(out, seconds)
    assert "SIGKILL" in out.stdout
    assert "the broker redelivered the message" in out.stdout
    assert (tmp_path / "worker.log").exists()


@pytest.fixture
def demo_postgres() -> str:
    """A fresh PostgreSQL database of its own for the demo (dropped afterwards)."""
    if not services.port_open("127.0.0.1", 5432):
        services.unavailable("PostgreSQL", "nothing listens on 127.0.0.1:5432")
    import psycopg

    name = os.environ.get("GROUSSET_TEST_PG_NAME", "grousset_test") + "_demo"
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres",
                         autocommit=True, connect_timeout=3) as conn:  # fmt: skip
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgres://postgres@127.0.0.1:5432/{name}"


@pytest.mark.slow
def test_demo_on_postgresql_and_redis(tmp_path: Path, demo_postgres: str) -> None:
    # Given DATABASE_URL on PostgreSQL and CELERY_BROKER_URL on Redis (db 13)
    if not services.port_open("127.0.0.1", 6379):
        services.unavailable("Redis", "nothing listens on 127.0.0.1:6379")
    env = project_env(tmp_path, DATABASE_URL=demo_postgres,
                      CELERY_BROKER_URL="redis://127.0.0.1:6379/13")  # fmt: skip

    # When the same demo runs on the real servers
    out, seconds = run_demo(env)

    # Then it tells the same story: one effect per key, a takeover, exit 0
    assert_demo_succeeded(out, seconds)
    assert "postgresql" in out.stdout and "redis://127.0.0.1:6379/13" in out.stdout
