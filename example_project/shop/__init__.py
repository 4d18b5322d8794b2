"""The shop: guarded Celery tasks with real effects (a mail, a booking, a charge)."""
