"""The deployment check (``manage.py check --deploy``): fingerprints without a key.

Unkeyed, a fingerprint is a plain hash of the call's arguments: whoever reads one (the
admin, a log line, a payment provider given it as the idempotency key) can confirm a
guess of a low-entropy argument, a PIN or a card number, by hashing it (docs/guarantee.md).
"""

from __future__ import annotations

from typing import Any

from django.core import checks


@checks.register(checks.Tags.security, deploy=True)
def check_fingerprint_key(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W023 when ``GROUSSET["FINGERPRINT_KEY"]`` is not set (``check --deploy`` only)."""
    from celery_grousset.conf import GroussetSettingsError, grousset_settings

    try:
        if grousset_settings.FINGERPRINT_KEY is not None:
            return []
    except GroussetSettingsError:  # reported by the other checks (E004/E010/E011)
        return []
    return [checks.Warning(
        "GROUSSET['FINGERPRINT_KEY'] is not set: fingerprints are unkeyed hashes of the "
        "task arguments, so whoever can read one (the admin, a log line, a provider given "
        "it as an idempotency key) can confirm a guess of a low-entropy argument (a PIN, "
        "a card number) by hashing it.",
        hint="Set GROUSSET['FINGERPRINT_KEY'] to a secret of 32 bytes or more (from the "
        "environment, kept like SECRET_KEY) before the first deploy, or later with a full "
        "stop: a call fingerprinted under another key is another call, so a duplicate of a "
        "call made before the change runs again (for EXPIRES_AFTER; not in the deploy of "
        "an upgrade, whose queued messages would). Silence celery_grousset.W023 if no "
        "guarded task takes such an argument.",
        id="celery_grousset.W023",
    )]  # fmt: skip
