"""How fast the journal admin answers on a large PostgreSQL journal.

    .venv/bin/python -m bench.admin_changelist --rows 1000000

Fills the journal of the ``postgresql`` alias (database ``GROUSSET_TEST_PG_NAME``,
via ``tests.settings``) with ``--rows`` rows in one ``INSERT … SELECT
generate_series`` statement, runs ``VACUUM ANALYZE``, then times (median of 5,
after one warm-up) the changelist, each filter, the fingerprint-prefix search,
the task-id search and a detail page through Django's test client, with the
admin reading the journal from ``GROUSSET["DATABASE"] = "postgresql"``. Users
and sessions stay on the SQLite ``default`` database. Prints one line per page
and whether it answered in under a second.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILL = """
INSERT INTO celery_grousset_outcome (processor_id, fingerprint, task_name, task_id, status,
    fence, claim_token, started_at, completed_at, expires_on, deliveries, takeovers, result,
    result_encoding, error, worker, args_repr, stale_at)
SELECT 'svc-' || (i %% 5),
       md5(i::text) || md5((i + 1)::text),
       'app.tasks.task_' || (i %% 40),
       'task-' || i,
       CASE WHEN i %% 100 = 0 THEN 'in_flight' WHEN i %% 10 = 0 THEN 'failed' ELSE 'completed' END,
       1 + i %% 3,
       md5('token' || i::text),
       now() - make_interval(secs => i),
       CASE WHEN i %% 100 = 0 THEN NULL ELSE now() - make_interval(secs => i - 2) END,
       now() - make_interval(secs => i) + interval '7 days',
       1 + i %% 4,
       (i %% 50 = 0)::int,
       CASE WHEN i %% 10 = 0 THEN NULL ELSE convert_to('{"id": ' || i || '}', 'UTF8') END,
       CASE WHEN i %% 10 = 0 THEN '' ELSE 'application/json;utf-8' END,
       CASE WHEN i %% 100 <> 0 AND i %% 10 = 0 THEN 'ValueError: boom' ELSE '' END,
       'worker-' || (i %% 8) || '@host',
       '(' || i || ',)', now()
FROM generate_series(1, %s) AS i
"""


def setup() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    os.environ["GROUSSET_TEST_DB"] = "postgresql"  # the admin reads the journal from here
    import django

    django.setup()


def fill(rows: int) -> float:
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", database="postgresql", verbosity=0, interactive=False)
    call_command("migrate", database="default", verbosity=0, interactive=False)
    started = time.perf_counter()
    conn = connections["postgresql"]
    with conn.cursor() as cur:
        cur.execute("TRUNCATE celery_grousset_outcome")
        cur.execute(FILL, [rows])
    conn.close()
    with connections["postgresql"].cursor() as cur:  # autocommit: VACUUM cannot run in a block
        cur.execute("VACUUM ANALYZE celery_grousset_outcome")
    return time.perf_counter() - started


def pages(
    rows: int, task: str = "app.tasks.task_7", processor: str = "svc-3"
) -> list[tuple[str, str]]:
    from celery_grousset.models import Outcome

    url = "/admin/celery_grousset/outcome/"
    pk = Outcome.objects.using("postgresql").order_by("-started_at").values_list("pk", flat=True)[0]
    probe = f"{rows // 2}"
    return [
        ("changelist (unfiltered)", url),
        ("page 50", f"{url}?p=50"),
        ("filter status=in_flight", f"{url}?status=in_flight"),
        ("filter status=completed", f"{url}?status=completed"),
        ("filter status=failed", f"{url}?status=failed"),
        ("filter task", f"{url}?task={task}"),
        ("filter processor", f"{url}?processor={processor}"),
        ("filter started=1h", f"{url}?started=1h"),
        ("filter started=older7d", f"{url}?started=older7d"),
        ("status + task", f"{url}?status=failed&task=app.tasks.task_10"),
        ("search fingerprint prefix", f"{url}?q=3f2a9c"),
        ("search task id (exact)", f"{url}?q=task-{probe}"),
        ("search junk (no match)", f"{url}?q=" + "%25_" * 50),
        ("detail page", f"{url}{pk}/change/"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-fill", action="store_true", help="reuse the rows already there")
    parser.add_argument("--task", default="app.tasks.task_7", help="the task filter's value")
    parser.add_argument("--processor", default="svc-3", help="the processor filter's value")
    args = parser.parse_args(argv)
    setup()
    from django.contrib.auth.models import User
    from django.test import Client

    if not args.no_fill:
        print(f"filling {args.rows:,} rows ...", flush=True)
        print(f"  filled and analysed in {fill(args.rows):.1f} s", flush=True)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    user = User.objects.db_manager("default").create_superuser(name, f"{name}@example.com", "x")
    client = Client()
    client.force_login(user)
    print(f"\n{'page':<28} {'median ms':>10} {'max ms':>8}  < 1 s   rows={args.rows:,}")
    worst = 0.0
    try:
        for label, url in pages(args.rows, args.task, args.processor):
            resp = client.get(url)  # warm-up
            assert resp.status_code == 200, (label, resp.status_code)
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                resp = client.get(url)
                times.append(time.perf_counter() - started)
                assert resp.status_code == 200, (label, resp.status_code)
            median = statistics.median(times)
            worst = max(worst, median)
            ok = "yes" if median < 1.0 else "NO"
            body = resp.content.decode()
            marks = {'data-grousset-note="warning"': "narrowed", 'data-grousset-note="error"': "unfiltered"}  # noqa: E501
            note = "".join(f"  (shown {how} by the query budget)" for mark, how in marks.items()
                           if mark in body)  # fmt: skip
            print(f"{label:<28} {median * 1000:>10.1f} {max(times) * 1000:>8.1f}  {ok}{note}")
    finally:
        user.delete()
    return 0 if worst < 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
