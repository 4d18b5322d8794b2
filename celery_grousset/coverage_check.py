"""Checks of where a task's guarantee is narrower than its code suggests:

* ``W018``: a task whose signature reads ``(*args, **kwargs)`` (a decorator that
  wraps the function without ``functools.wraps``) has its calls fingerprinted as
  given, so ``f(1)`` and ``f(order_id=1)`` are two calls;
* ``W019``: a ``transactional=True`` task whose journal database is not one the
  project's models are written to: its effect's writes are outside the transaction
  that commits its outcome (docs/guarantee.md, "Transactional tasks: exactly once");
* ``W020``: a task without a key whose parameter defaults to a value the fingerprint
  cannot encode (a sentinel ``object()``): every call that leaves it out is refused.
"""

from __future__ import annotations

import inspect
from typing import Any

from django.core import checks

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
#: apps whose models say nothing of where a project's effects are written
_NOT_EFFECTS = ("django.", "celery_grousset", "django_celery_")


def messages(resolved: list[tuple[Any, Any, Any]]) -> list[checks.CheckMessage]:
    """``resolved``: (app, task, options) of the guarded tasks whose options resolve."""
    found = [w for _, task, _ in resolved if (w := _variadic(task)) is not None]
    found += [w for _, task, _ in resolved for w in _unencodable_defaults(task)]
    return found + _transactional_elsewhere(resolved)


def _unencodable_defaults(task: Any) -> list[checks.CheckMessage]:
    from celery_grousset.exceptions import FingerprintError
    from celery_grousset.fingerprint import canonical_bytes

    signature = task._signature()
    if task.grousset_key is not None or signature is None:
        return []
    found: list[checks.CheckMessage] = []
    for param in signature.parameters.values():
        if param.default is inspect.Parameter.empty:
            continue
        try:
            canonical_bytes(param.default, path=param.name)
        except FingerprintError as exc:
            found.append(checks.Warning(
                f"The task {task.name!r}: its parameter {param.name!r} defaults to "
                f"{param.default!r:.60}, which cannot be fingerprinted ({exc}): every call "
                "that leaves it out (without an idempotency_key) is refused with "
                "FingerprintError.",
                hint="Default it to None (or a value of a JSON type) and resolve it in the "
                "body, or name the call with grousset_key or idempotency_key=.",
                obj=task.name, id="celery_grousset.W020",
            ))  # fmt: skip
    return found


def _variadic(task: Any) -> checks.CheckMessage | None:
    if task.grousset_key is not None:  # a key names the call, not the arguments as given
        return None
    signature = task._signature()
    params = list(signature.parameters.values()) if signature is not None else []
    if not params or any(p.kind not in _VARIADIC for p in params):
        return None
    return checks.Warning(
        f"The task {task.name!r} takes {signature}: its calls are fingerprinted as "
        "given, so f(1) and f(order_id=1) are two calls, and each runs the effect.",
        hint="A decorator between @app.task and the function must keep its signature: "
        "decorate its wrapper with functools.wraps(fn). A task written (*args, **kwargs) "
        "on purpose: name the operation with grousset_key, a callable that gets each "
        "variadic parameter as one argument under its name (grousset_key=lambda args, "
        "kwargs: kwargs['order_id']), or with idempotency_key=.",
        obj=task.name,
        id="celery_grousset.W018",
    )


def _write_aliases() -> set[str]:
    """The databases the project's own models are written to (its routers decide; one
    that raises outside a request, a tenant router, says nothing)."""
    from django.apps import apps
    from django.db import router

    found = set()
    for config in apps.get_app_configs():
        if config.name.startswith(_NOT_EFFECTS):
            continue
        for model in config.get_models():
            try:
                found.add(router.db_for_write(model) or "default")
            except Exception:
                continue
    return found


def _transactional_elsewhere(resolved: list[tuple[Any, Any, Any]]) -> list[checks.CheckMessage]:
    by_alias: dict[str, list[str]] = {}
    for _, task, opts in resolved:
        if opts.transactional:
            by_alias.setdefault(opts.database, []).append(task.name)
    if not by_alias:
        return []
    written = _write_aliases()
    if not written:  # no models of the project's own: nothing to compare
        return []
    return [
        checks.Warning(
            f"transactional=True tasks ({', '.join(sorted(names)[:5])}"
            f"{', …' if len(names) > 5 else ''}) commit their outcome on the journal "
            f"database {alias!r}, but this project's models are written to "
            f"{', '.join(sorted(map(repr, written)))}: those writes are not in that "
            "transaction, so they are effectively once (a crash between them and the "
            "outcome runs them again), not exactly once.",
            hint="Put the journal on the database the tasks write to (GROUSSET['DATABASE'] "
            "or the task's database=), or route those models there: a transactional task "
            "covers the writes to its journal's database alone.",
            obj=alias,
            id="celery_grousset.W019",
        )
        for alias, names in sorted(by_alias.items())
        if alias not in written
    ]
