"""Operations page: purge expired journal entries from Celery beat (Django settings)."""

# --8<-- [start:beat]
CELERY_BEAT_SCHEDULE = {
    "grousset-purge": {
        "task": "celery_grousset.purge_expired",
        "schedule": 3600.0,  # every hour
    },
}
# --8<-- [end:beat]
