"""Testing page: the ``conftest.py`` at the root of your project."""

# --8<-- [start:plugins]
pytest_plugins = ["celery_grousset.contrib.pytest"]
# --8<-- [end:plugins]
