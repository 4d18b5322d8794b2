import os

from celery import Celery

from celery_grousset.worker import install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")

app = Celery("mysite")
app.config_from_object("django.conf:settings", namespace="CELERY")
install(app)  # registers the --grousset-* worker flags
app.autodiscover_tasks()
