"""What a failed publish of the outbox relay means (an outage of the broker, or a call
the broker can never take), and the relay's durations checked (docs/producer.md)."""

from __future__ import annotations

import contextlib
from typing import Any

from celery_grousset.exceptions import InvalidArgument


def broker_down(app: Any, exc: BaseException) -> bool:
    """A connection-level error (also its transport's own: RabbitMQ's NOT_ALLOWED for a
    vhost without permissions), or the result store's (a Redis result backend subscribes
    to the task's result before the publish, and gives up with a RuntimeError raised from
    its connection error): nothing was published, and the next rows would fail the same
    way, so no row is charged an attempt for it."""
    from kombu.exceptions import OperationalError

    errors: tuple[type[BaseException], ...] = (OperationalError, ConnectionError, OSError)
    with contextlib.suppress(Exception):  # (the transport class only: no connection)
        errors += tuple(app.connection_for_write().connection_errors)
    with contextlib.suppress(Exception):
        errors += tuple(app.backend.connection_errors)
    return isinstance(exc, errors) or (
        isinstance(exc, RuntimeError) and isinstance(exc.__cause__, errors)
    )


def permanent(app: Any, exc: BaseException) -> bool:
    """The call itself is wrong (its arguments, a value that cannot be encoded):
    publishing it again cannot help, so the row goes dead at once."""
    from kombu.exceptions import EncodeError

    return isinstance(exc, (TypeError, ValueError, EncodeError)) and not broker_down(app, exc)


def check_seconds(**values: object) -> None:
    """Each of the relay's durations is a positive, finite number of seconds (a negative
    interval polled without a pause; a zero backoff made a broker blip dead rows)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                0 < value < float("inf")):  # (NaN too)  # fmt: skip
            flag = f" (--{name.replace('_', '-')})" if name != "confirm_timeout" else ""
            raise InvalidArgument(f"{name}{flag} must be a positive number of seconds; got "
                                  f"{value!r}")  # fmt: skip
