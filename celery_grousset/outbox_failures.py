"""What a failed publish of the outbox relay means (an outage of the broker, a message
it refused, or a call it can never take), the relay's durations checked, and its broker
connection, whose every wait is bounded (docs/producer.md)."""

from __future__ import annotations

import contextlib
import re
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


def refused(app: Any, exc: BaseException) -> bool:
    """The broker answered, refusing this message (a RabbitMQ nack: a full queue that
    rejects publishes; a Redis error reply about its key: of another type): its
    connection works and the next rows may go elsewhere, so this one is charged an
    attempt and the batch goes on (kombu raises both as its OperationalError, as it does
    an outage; Redis out of memory or read-only is one)."""
    refusals: tuple[type[BaseException], ...] = ()
    with contextlib.suppress(Exception):
        from amqp.exceptions import MessageNacked

        refusals += (MessageNacked,)
    with contextlib.suppress(Exception):  # (the transport class only: no connection)
        refusals += tuple(app.connection_for_write().channel_errors)
    seen: BaseException | None = exc
    for _ in range(4):  # (the cause kombu's error carries, and that one's)
        if seen is None or isinstance(seen, refusals):
            return seen is not None and not whole_broker(seen)
        seen = seen.__cause__ or seen.__context__
    return False


#: Redis errors about the whole server or the relay's rights, not one message or queue:
#: an outage, never charged (the class redis-py raises, or the reply's code)
_WHOLE_CLASSES = {"OutOfMemoryError", "ReadOnlyError", "MasterDownError", "ClusterDownError",
                  "TryAgainError", "BusyLoadingError", "MaxClientsReachedError",
                  "NoPermissionError", "AuthenticationError", "AuthorizationError"}  # fmt: skip
_WHOLE_CODES = {"OOM", "LOADING", "BUSY", "READONLY", "MASTERDOWN", "NOREPLICAS", "CLUSTERDOWN",
                "TRYAGAIN", "MISCONF", "NOAUTH", "NOPERM", "WRONGPASS"}  # fmt: skip
#: a reply's code: its first word (after a pipeline's "… caused error: ")
_CODE = re.compile(r"(?:^|caused error: )([A-Z]+)\b")


def whole_broker(error: BaseException) -> bool:
    """``error`` (a broker's answer) is about the whole server or the relay's rights."""
    code = _CODE.search(str(error))
    return type(error).__name__ in _WHOLE_CLASSES or bool(code and code[1] in _WHOLE_CODES)


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


def confirmed_connection(app: Any, timeout: float) -> Any:
    """A broker connection with AMQP publisher confirms: a publish returns once RabbitMQ
    has the message (else an error after ``timeout``), not once its bytes are in the
    socket, which a network may drop. Redis answers each push, within ``timeout`` unless
    ``broker_transport_options`` says otherwise (kombu's default waits for ever)."""
    options: dict[str, Any] = {"confirm_publish": True}
    if app.connection_for_write().transport.driver_type == "redis":
        options = {"socket_timeout": timeout, "socket_connect_timeout": timeout,
                   **(app.conf.broker_transport_options or {}), **options}  # fmt: skip
    return app.connection_for_write(transport_options=options)
