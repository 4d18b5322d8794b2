"""Fences never go back for a key, also across a purge (docs/guarantee.md, "Fencing
tokens"): the claim writes max(previous fence + 1, the database clock in microseconds
since the epoch). The column is unchanged; only its help text says so."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("celery_grousset", "0005_outcome_payload_hash"),
    ]

    operations = [
        migrations.AlterField(
            model_name="outcome",
            name="fence",
            field=models.BigIntegerField(
                help_text="Fencing token, growing on every claim of the key, also across a purge: max(previous fence + 1, the claim's database clock in microseconds since the epoch); a new row gets the clock value (as long as that clock does not step back)."
            ),
        ),
    ]
