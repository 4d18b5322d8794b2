"""Duplicates counted apart from redeliveries, the first claim's time, and a table of the
deliveries that are not a row's own (docs/operations.md, "Deliveries, duplicates and
redeliveries"); fences never go back (docs/guarantee.md, "Fencing tokens": the ``fence``
column is unchanged, only its help text).

Rows written before this migration keep ``first_claimed_at`` NULL (shown as their
``started_at``) and count their duplicates from now on: on PostgreSQL and MySQL/MariaDB
nothing is rewritten, so the migration's time does not grow with the journal (SQLite
copies the table: docs/operations.md, "Migrations and locks"). Adding the columns takes the table's
exclusive lock briefly, but it waits for every open transaction that touched the
journal, and claims queue behind it (docs/operations.md, "Migrations and locks").

On PostgreSQL and MySQL/MariaDB ``duplicates`` also keeps 0 as its database default (as
``payload_hash`` does, 0005), so an ``INSERT`` from a worker of a release that already
had 0005 works during a rolling upgrade (on MySQL/MariaDB but for the instant between
two statements, where it fails closed). From 0.1.0 there is no rolling upgrade (it does
not write 0003's ``stale_at``): stop its workers before ``migrate`` (docs/operations.md,
"Upgrading from 0.1.0").
"""

from django.db import migrations, models

_SET = "ALTER TABLE celery_grousset_outcome ALTER COLUMN duplicates SET DEFAULT 0"
_DROP = "ALTER TABLE celery_grousset_outcome ALTER COLUMN duplicates DROP DEFAULT"


def _alter(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor in ("postgresql", "mysql"):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("celery_grousset", "0005_outcome_payload_hash"),
    ]

    operations = [
        migrations.AddField(
            model_name="outcome",
            name="duplicates",
            field=models.BigIntegerField(
                default=0,
                help_text="Other deliveries of the same key answered from the memo or the in-flight policy (each listed under Deliveries by its task id).",
            ),
        ),
        # at once after the column (Django drops the default it adds it with): on MySQL,
        # whose DDL is not transactional, an INSERT between the two fails closed, is retried.
        # Not atomic: MySQL refuses DDL inside a transaction (it cannot roll DDL back)
        migrations.RunPython(_alter(_SET), _alter(_DROP), atomic=False,
                             hints={"model_name": "outcome"}),
        migrations.AddField(
            model_name="outcome",
            name="first_claimed_at",
            field=models.DateTimeField(
                blank=True,
                help_text="The first claim of the key since its row was written or expired (database clock); takeovers and reclaims keep it.",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="outcome",
            name="deliveries",
            field=models.BigIntegerField(
                default=1,
                help_text="Every claim of the key since its row was written or expired: the first, duplicates, redeliveries (the same task id again, in-flight requeues) and re-claims.",
            ),
        ),
        migrations.AlterField(
            model_name="outcome",
            name="fence",
            field=models.BigIntegerField(
                help_text="Fencing token, growing on every claim of the key, also across a purge: max(previous fence + 1, the claim's database clock in microseconds since the epoch); a new row gets the clock value (as long as that clock does not step back)."
            ),
        ),
        migrations.AlterField(
            model_name="outcome",
            name="started_at",
            field=models.DateTimeField(
                help_text="When the current attempt claimed the row (database clock)."
            ),
        ),
        migrations.CreateModel(
            name="Delivery",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("processor_id", models.CharField(max_length=128)),
                ("fingerprint", models.CharField(max_length=64)),
                ("task_id", models.CharField(max_length=255)),
                (
                    "decision",
                    models.CharField(
                        help_text="The claim's decision code (celery_grousset.claim.Kind.code): i in flight, c completed, f failed, g gave up — this delivery was answered; t taken over, r reclaimed, x expired — this delivery's claim was taken by a later one.",
                        max_length=1,
                    ),
                ),
                (
                    "at",
                    models.DateTimeField(
                        help_text="Database clock. Purged once the journal row of its key is gone or was claimed afresh after it."
                    ),
                ),
            ],
            options={
                "verbose_name": "delivery",
                "verbose_name_plural": "deliveries",
                "db_table": "celery_grousset_delivery",
                "indexes": [models.Index(fields=["task_id"], name="grousset_delivery_task_id")],
            },
        ),
    ]
