"""``manage.py grousset_purge``, ``grousset_inspect``, ``grousset_release``, ``grousset_stats``."""
