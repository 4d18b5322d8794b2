"""The chaos suite: real workers, real databases, real brokers, injected faults.

Every scenario counts effects in the ledger (``tests.ledger.models.Effect``, no
unique constraint) and reads the journal (``Outcome``) to assert its expected
outcome. ``python -m tests.chaos`` (``make chaos``) runs the suite ``CHAOS_RUNS``
times and writes ``tests/chaos/REPORT.md``.
"""
