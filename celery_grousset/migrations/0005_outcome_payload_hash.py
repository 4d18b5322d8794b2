"""Each journal row carries the payload hash of the call that claimed it.

``payload_hash`` is the BLAKE3 of all the bound arguments of a keyed call
(``idempotency_key``, ``grousset_key``): a later call with the same key and other
arguments is refused with ``PayloadMismatch`` instead of getting the first call's memo.
Rows written before this migration get ``''``: they are not validated.

On PostgreSQL and MySQL/MariaDB the column also keeps ``''`` as its database default
(Django drops the default it adds the column with), so an ``INSERT`` that does not name
the column — a worker still running the previous release during a rolling upgrade, a
bulk load — still works. SQLite cannot change a column's default in place.
"""

from django.db import migrations, models

_SET = "ALTER TABLE celery_grousset_outcome ALTER COLUMN payload_hash SET DEFAULT ''"
_DROP = "ALTER TABLE celery_grousset_outcome ALTER COLUMN payload_hash DROP DEFAULT"


def _alter(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor in ("postgresql", "mysql"):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ("celery_grousset", "0004_outboxmessage_message_id"),
    ]

    operations = [
        migrations.AddField(
            model_name="outcome",
            name="payload_hash",
            field=models.CharField(
                blank=True,
                default="",
                help_text="BLAKE3 of all the arguments of a keyed call (idempotency_key, "
                "grousset_key), written by the claim that took the row: a call with the same "
                "key and other arguments is refused (PayloadMismatch). Empty: a plain call, "
                "or not validated.",
                max_length=64,
            ),
        ),
        # not atomic: MySQL refuses DDL inside a transaction (it cannot roll DDL back)
        migrations.RunPython(_alter(_SET), _alter(_DROP), atomic=False,
                             hints={"model_name": "outcome"}),
    ]
