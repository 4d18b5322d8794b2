from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "tests.ledger"
    label = "ledger"
    default_auto_field = "django.db.models.BigAutoField"
