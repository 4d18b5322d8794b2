"""Each outbox row carries a random ``message_id``, written with the row.

The relay's default idempotency key was ``outbox:<id>``; ids restart at 1 in every
database (and every producer service), so a second service's message 1 was answered
with the first one's memo and never ran. The key is now ``outbox:<message_id>``.
Rows written before this migration get a random ``message_id`` each. (A later release
stopped keying messages by the outbox at all: a message's identity is its call's, as
with ``delay()``.)
"""

import uuid

from django.db import migrations, models

BATCH = 1000


def backfill(apps, schema_editor):
    OutboxMessage = apps.get_model("celery_grousset", "OutboxMessage")
    rows = OutboxMessage.objects.using(schema_editor.connection.alias)
    while True:
        batch = list(rows.filter(message_id__isnull=True).order_by("pk").only("pk")[:BATCH])
        if not batch:
            return
        for row in batch:
            row.message_id = uuid.uuid4()
        rows.bulk_update(batch, ["message_id"])


class Migration(migrations.Migration):

    dependencies = [
        ("celery_grousset", "0003_outcome_stale_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="message_id",
            field=models.UUIDField(null=True, editable=False),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop,
                             hints={"model_name": "outboxmessage"}),
        migrations.AlterField(
            model_name="outboxmessage",
            name="message_id",
            field=models.UUIDField(
                default=uuid.uuid4,
                editable=False,
                # (help text as of the release that stopped keying messages by it: a
                # text only, no schema change, so no migration of its own)
                help_text="Random, written with the row: names the message across databases "
                "(ids restart at 1 in every database).",
                unique=True,
            ),
        ),
    ]
