"""What a guarded call is checked for, and given, before it is published: by
``apply_async()``/``delay()``; before the commit by ``delay_on_commit()`` and
``apply_async_on_commit()`` (their publish runs in a ``transaction.on_commit`` callback,
after the commit: a call refused there would be lost, and Django skips the callbacks
after a failing one); and by ``outbox.enqueue()``, whose row would otherwise be written
and only go dead at the relay.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta
from typing import Any

from celery_grousset import binding, guard
from celery_grousset.conf import GroussetSettingsError, grousset_settings
from celery_grousset.delivery import KEY_HEADER, RETRY_OF_HEADER, header
from celery_grousset.exceptions import FingerprintError, InvalidArgument
from celery_grousset.publish_check import refuse_misspelt_key, refuse_misspelt_links

#: a header this package adds: set when argsrepr/kwargsrepr were written by this package
#: (redacted) or by the caller
REPR_HEADER = "grousset_repr"
#: the ``apply_async`` options that hold signatures, each with arguments of its own
SIGNATURE_OPTIONS = ("link", "link_error", "chain", "chord")
#: options that cannot outlive this process (the outbox stores the others)
_REFUSED = ("producer", "connection", "publisher", "router")


def carry_key(
    name: str, options: dict[str, Any], anywhere: bool = False, method: str = "apply_async"
) -> str | None:
    """Move ``idempotency_key`` from ``options`` into the headers the request carries."""
    refuse_misspelt_key(name, options, anywhere=anywhere, method=method)
    key = _checked_key(name, options.pop("idempotency_key", None))
    headers = dict(options.get("headers") or {})
    if key is not None:
        headers[KEY_HEADER] = key
    options["headers"] = headers
    return key


def eager(task: Any, options: dict[str, Any]) -> None:
    """``apply()`` (and ``delay()``/``apply_async()`` under ``task_always_eager``): the
    task runs here, so never in an event loop's thread (refused to the caller, whatever
    ``task_eager_propagates`` says); its key moved into the headers."""
    try:
        unguarded = bypassed(task.app)  # (no journal: nothing waits)
    except GroussetSettingsError:  # a refused GROUSSET: the call reports it, as it did
        unguarded = False
    if not unguarded:
        where = (f"task {task.name!r} run eagerly (apply(); delay() and apply_async() too "
                 "under task_always_eager)")  # fmt: skip
        binding.off_the_loop(where, "`await sync_to_async(task.apply)(args)`")
    carry_key(task.name, options, method="apply")


def bypassed(app: Any) -> bool:
    """Whether the guarded tasks of ``app`` run unguarded: the worker's
    ``--grousset-bypass`` first (with it, a GROUSSET that fails validation still runs
    tasks), then ``GROUSSET["BYPASS"]``."""
    return bool(getattr(app.conf, "grousset_bypass", False) or grousset_settings.BYPASS)


def on_commit(task: Any, args: Any, kwargs: Any, options: dict[str, Any], name: str) -> None:
    """``delay_on_commit()``/``apply_async_on_commit()`` (``name``): never in an event
    loop's thread (Django's ``on_commit`` is refused there); the call checked now
    (:func:`prepare`)."""
    binding.off_the_loop(f"{task.name}.{name}()", binding.WRAP_ATOMIC, binding.WRITES)
    prepare(task, args, kwargs, options, anywhere=True)


def _checked_key(name: str, key: object) -> str | None:
    if key is not None and not (isinstance(key, str) and key):
        raise FingerprintError(f"{name}: idempotency_key must be a non-empty str, got {key!r}")
    return key


def prepare(
    task: Any, args: Any, kwargs: Any, options: dict[str, Any], anywhere: bool = False
) -> None:
    """Check a call of the guarded ``task`` now (``FingerprintError``: arguments that
    cannot be fingerprinted, a bad key; the calls it carries for the worker, also in a
    task with ``anywhere``) and give ``options`` what ``apply_async`` publishes it with:
    the key as a header, a redacted ``argsrepr``."""
    key = carry_key(task.name, options, anywhere)
    refuse_misspelt_links(task.app, task.name, options, anywhere)
    options["headers"][REPR_HEADER] = 1
    call = task.grousset_call(tuple(args or ()), dict(kwargs or {}), key)
    if key is None and not grousset_settings.BYPASS:
        # Fail at publish time for arguments that cannot be fingerprinted; Celery
        # would show saferepr(args) in logs, events and monitors: redact it.
        text = guard.identify(call)[1]
    else:  # a key names the call (or BYPASS): bound by name for the repr alone
        text = guard.redacted(call.args, call.kwargs, guard.named(call))
    options["argsrepr"], options["kwargsrepr"] = f"({text})", "{}"


def mark_retry(task: Any, request: Any, sig: Any, retried: str) -> None:
    """Mark ``sig``, the message of a Celery retry of the call ``retried`` (a
    fingerprint), so that it stays that call: ``[its task id, retried, the fingerprint
    its own arguments give]`` (:func:`celery_grousset.delivery.retry_of`)."""
    try:
        call = task.grousset_call(sig.args, sig.kwargs, header(request, KEY_HEADER), request)
        own = guard.fingerprint_of(dataclasses.replace(call, retry_of=None))
    except Exception:  # arguments that cannot be fingerprinted: the retry fails on its own
        return
    headers = dict(sig.options.get("headers") or {})
    headers[RETRY_OF_HEADER] = [str(request.id), retried, own]
    sig.options["headers"] = headers


def unheader(sig: Any) -> None:
    """What the worker's main process put in a delivery for its pool child (its claim,
    its decision with the memo: :mod:`celery_grousset.preclaim`) is not sent again with
    a copy of it (``retry()``, a requeue): Celery copies a request's own fields into the
    copy's headers."""
    from celery_grousset.preclaim import DECIDED, FIELD

    headers = sig.options.get("headers")
    if isinstance(headers, dict) and (FIELD in headers or DECIDED in headers):
        sig.options["headers"] = {k: v for k, v in headers.items() if k not in (FIELD, DECIDED)}


def check_enqueued(task: Any, args: Any, kwargs: Any, options: dict[str, Any]) -> None:
    """``outbox.enqueue()``'s checks, before its row is written: as ``delay()`` checks
    a call (Celery's own signature check; :func:`prepare` for a guarded task)."""
    name = task if isinstance(task, str) else task.name
    for value, kind, shape in ((args, (list, tuple), "a list or tuple"), (kwargs, dict, "a dict")):
        if value is not None and not isinstance(value, kind):
            raise InvalidArgument(
                f"outbox.enqueue({name!r}, args, kwargs): {'kwargs' if kind is dict else 'args'} "
                f"must be {shape}, got {type(value).__name__}: enqueue(task, [order.pk]), "
                "not enqueue(task, order.pk)"
            )
    guarded = not isinstance(task, str) and hasattr(task, "grousset_options")
    refuse_misspelt_key(name, options, guarded=guarded, anywhere=True)
    if not isinstance(task, str) and getattr(task, "typing", False):
        task.__header__(*(args or ()), **(kwargs or {}))  # Celery's own check (delay())
    if guarded:
        prepare(task, args, kwargs, dict(options), anywhere=True)
    else:
        _checked_key(name, options.get("idempotency_key"))
        if not isinstance(task, str):  # the guarded calls it carries for the worker
            refuse_misspelt_links(task.app, name, options, anywhere=True)
    _encodable(task, args, kwargs, options)


def _encodable(task: Any, args: Any, kwargs: Any, options: dict[str, Any]) -> None:
    """A task's own serializer takes the call (a datetime is no msgpack value): else the
    row would go dead at the relay, which cannot publish it."""
    from kombu.serialization import dumps

    serializer = options.get("serializer") or getattr(task, "serializer", None)
    if isinstance(task, str) or serializer in (None, "json"):
        return  # (json: stored() writes it as that serializer does)
    try:
        dumps((list(args or ()), dict(kwargs or {})), serializer=serializer)
    except Exception as exc:
        raise InvalidArgument(f"outbox.enqueue({task.name}): its arguments cannot be "
                              f"encoded by the task's serializer {serializer!r}: {exc}") from exc


def stored(name: str, what: str, value: Any) -> str:
    """``value`` as the row keeps it: a JSON text written as Celery's ``json`` serializer
    writes it (kombu's: a datetime, Decimal, UUID or bytes comes back as itself), kept
    as a JSON string, which no database rewrites (jsonb would turn ``1e16`` into an int,
    another value with another fingerprint than ``delay()``'s)."""
    from kombu.utils.json import dumps

    try:
        return str(dumps(value))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"outbox.enqueue({name}): its {what} cannot be written as JSON ({exc}). Pass "
            "values Celery's json serializer takes (str, numbers, lists, dicts, datetime, "
            "Decimal, UUID, bytes), e.g. a model's primary key instead of the object."
        ) from exc


def arguments(row: Any) -> tuple[list[Any], dict[str, Any]]:
    """A row's ``args`` and ``kwargs`` as the task receives them (rows written before
    :func:`stored` hold them as JSON values)."""
    from kombu.utils.json import loads

    args, kwargs = (loads(v) if isinstance(v, str) else v for v in (row.args, row.kwargs))
    return list(args or []), dict(kwargs or {})


def stored_options(options: dict[str, Any]) -> dict[str, Any]:
    """``apply_async`` options as ``outbox.enqueue()`` stores them, in JSON: a countdown
    becomes an absolute ``eta``."""
    from django.utils import timezone

    if refused := [name for name in _REFUSED if name in options]:
        raise InvalidArgument(f"outbox.enqueue: the option(s) {refused} cannot be stored")
    out = dict(options)
    countdown = out.pop("countdown", None)
    if countdown is not None:
        if isinstance(countdown, bool) or not isinstance(countdown, (int, float)):
            raise InvalidArgument(f"outbox.enqueue: countdown must be a number of seconds, "
                                  f"got {countdown!r}")  # fmt: skip
        out["eta"] = timezone.now() + timedelta(seconds=float(countdown))
    expires = out.get("expires")
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        out["expires"] = timezone.now() + timedelta(seconds=float(expires))
    for name in ("eta", "expires"):
        if isinstance(out.get(name), datetime):
            out[name] = out[name].isoformat()
    try:
        json.dumps(out, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:  # (a JSON column refuses a lone surrogate's escape)
        raise InvalidArgument(
            "outbox.enqueue: an option (a header, the idempotency key) holds a lone "
            f"surrogate ({exc.object[exc.start:exc.end]!a}), text UTF-8 cannot write: clean "
            "the value it came from (json.loads of a form's input can make one)"
        ) from exc
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"outbox.enqueue: options must be JSON-serializable ({exc})") from exc
    return out
