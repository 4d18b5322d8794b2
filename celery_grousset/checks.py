"""System checks (``manage.py check``), ids ``celery_grousset.E001``…"""

from __future__ import annotations
