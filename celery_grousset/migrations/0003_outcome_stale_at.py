"""Each journal row carries its own lease deadline, ``stale_at``.

The claim writes ``started_at + max_processing_time`` (database clock); the claim's
decision, the admin, the commands and the metrics all read "stale" from it. Rows
written before this migration get ``started_at`` + ``GROUSSET["MAX_PROCESSING_TIME"]``
(one hour when that is not set): only claims in flight during the upgrade care.
"""

from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.db.models import F


def _fallback() -> timedelta:
    value = (getattr(settings, "GROUSSET", None) or {}).get("MAX_PROCESSING_TIME")
    if isinstance(value, timedelta):
        return value
    try:
        return timedelta(seconds=float(value)) if value is not None else timedelta(hours=1)
    except (TypeError, ValueError):
        return timedelta(hours=1)


def backfill(apps, schema_editor):
    Outcome = apps.get_model("celery_grousset", "Outcome")
    Outcome.objects.using(schema_editor.connection.alias).filter(stale_at__isnull=True).update(
        stale_at=F("started_at") + _fallback()
    )


class Migration(migrations.Migration):

    dependencies = [
        ("celery_grousset", "0002_outboxmessage"),
    ]

    operations = [
        migrations.AddField(
            model_name="outcome",
            name="stale_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop,
                             hints={"model_name": "outcome"}),
        migrations.AlterField(
            model_name="outcome",
            name="stale_at",
            field=models.DateTimeField(
                help_text="When this claim turns stale (started_at + max_processing_time, "
                "database clock): another delivery may then take it over."
            ),
        ),
    ]
