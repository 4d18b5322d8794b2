"""Side-by-side benchmarks of celery-grousset against plain Celery and the usual
alternatives (``python -m bench --help``; results are appended to bench/RESULTS.md)."""
