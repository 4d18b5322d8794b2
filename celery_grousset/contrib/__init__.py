"""Optional integrations shipped with celery-grousset (``celery_grousset.contrib.pytest``)."""
