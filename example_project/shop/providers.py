"""Two fake external providers that run locally and write down what they did.

``mailer`` stands for an e-mail API: every call sends (records) one mail and
returns the provider's message id. It has no idempotency of its own, so only the
guard stands between a duplicate delivery and a second mail.

``payments`` stands for a card processor that honours idempotency keys: a second
request with the same key returns the first charge. The ``charge`` task passes
``self.grousset.fingerprint`` as that key, which closes the one window the guard
cannot (a worker killed after the charge, before the completion commits).
"""

from __future__ import annotations

import uuid

from django.db import IntegrityError, transaction
from django.db.models import F

from shop.models import ProviderCharge, SentMail


class FakeMailer:
    """A mail provider without idempotency keys."""

    def send(self, *, to: str, subject: str) -> str:
        """Send one mail; return the provider's message id."""
        mail = SentMail.objects.create(
            message_id=f"msg_{uuid.uuid4().hex}", recipient=to, subject=subject
        )
        return mail.message_id


class FakePaymentProvider:
    """A payment provider that deduplicates requests by idempotency key."""

    def charge(self, *, amount_cents: int, reference: str, idempotency_key: str) -> str:
        """Charge once per ``idempotency_key``; return the charge id."""
        try:
            with transaction.atomic():
                charge = ProviderCharge.objects.create(
                    idempotency_key=idempotency_key, charge_id=f"ch_{uuid.uuid4().hex[:24]}",
                    reference=reference, amount_cents=amount_cents,
                )  # fmt: skip
            return charge.charge_id
        except IntegrityError:
            # Seen this key before: answer with the first charge, charge nothing.
            ProviderCharge.objects.filter(idempotency_key=idempotency_key).update(
                requests=F("requests") + 1
            )
            return ProviderCharge.objects.get(idempotency_key=idempotency_key).charge_id


mailer = FakeMailer()
payments = FakePaymentProvider()
