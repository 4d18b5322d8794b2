"""Binding a call's arguments to its signature, by name, with defaults applied: the one
binding the guard fingerprints and renders (redacted) from (docs/how-it-works.md)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery_grousset.exceptions import (
    ArgumentsMismatch,
    FingerprintError,
    InvalidArgument,
    NotAwaited,
)

_EMPTY = inspect.Parameter.empty
_VAR_POSITIONAL = inspect.Parameter.VAR_POSITIONAL
_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD
_KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY
_POSITIONAL_ONLY = inspect.Parameter.POSITIONAL_ONLY
_POSITIONAL_OR_KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD


def _fast_bind(
    signature: inspect.Signature, args: Sequence[object], kwargs: Mapping[str, object]
) -> dict[str, object] | None:
    """Bind the common case (no ``*args``/``**kwargs``, no error) fast; None: use inspect."""
    parameters = signature.parameters
    positional = len(args)
    if positional > len(parameters):
        return None
    bound: dict[str, object] = {}
    from_kwargs = 0
    for index, (name, parameter) in enumerate(parameters.items()):
        kind = parameter.kind
        if kind is _VAR_POSITIONAL or kind is _VAR_KEYWORD:
            return None
        if index < positional:
            if kind is _KEYWORD_ONLY or name in kwargs:
                return None
            bound[name] = args[index]
        elif kind is not _POSITIONAL_ONLY and name in kwargs:
            bound[name] = kwargs[name]
            from_kwargs += 1
        elif parameter.default is not _EMPTY:
            bound[name] = parameter.default
        else:
            return None
    return bound if from_kwargs == len(kwargs) else None


def bind_arguments(
    signature: inspect.Signature | None,
    args: Sequence[object],
    kwargs: Mapping[str, object],
    name: str = "",
) -> dict[str, object]:
    """Bind ``args``/``kwargs`` to ``signature`` by name, with defaults applied.

    ``f(1)``, ``f(x=1)`` and ``f()`` (``x`` defaulting to 1) bind the same. Pass the
    run function's signature *without* a leading ``self`` (``inspect.signature(
    task.run)`` of a bound task already omits it). ``*args`` binds to a list under
    its name, ``**kwargs`` to a dict; without a signature the result is
    ``{"args": list(args), "kwargs": dict(kwargs)}``. Raises ArgumentsMismatch (a
    FingerprintError and a TypeError) naming ``name``, the task or function.
    """
    if signature is None:
        return {"args": list(args), "kwargs": dict(kwargs)}
    bound = _fast_bind(signature, args, kwargs)
    if bound is not None:
        return bound
    params = signature.parameters.values()
    try:
        arguments = signature.bind(*args, **kwargs)
    except TypeError as exc:
        bare = [p.replace(default=_EMPTY, annotation=_EMPTY) for p in params]
        names = str(signature.replace(parameters=bare, return_annotation=_EMPTY))
        who = f"{name}: " if name else ""
        first = next(iter(signature.parameters), "")
        hint = (" (a first parameter named self: a task gets itself as self only with "
                "bind=True in its decorator)" if first == "self" else "")  # fmt: skip
        raise ArgumentsMismatch(
            f"{who}the arguments do not match the parameters {names}: {exc}{hint}"
        ) from None
    arguments.apply_defaults()
    result: dict[str, object] = {}
    for name, value in arguments.arguments.items():
        kind = signature.parameters[name].kind
        is_var = kind is _VAR_POSITIONAL or kind is _VAR_KEYWORD
        result[name] = (list if kind is _VAR_POSITIONAL else dict)(value) if is_var else value
    return result


class _Unnamed:
    """A positional value that no parameter of the signature names: not shown (it may
    be a secret)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<not shown: no parameter at its position>"


UNNAMED = _Unnamed()


def loose_bind(
    signature: inspect.Signature, args: Sequence[object], kwargs: Mapping[str, object]
) -> dict[str, object]:
    """Arguments that do not fit ``signature`` (a call its idempotency key names, say a
    message sent before a deploy changed the task), named as far as the signature names
    them, for redaction alone: a positional value by the parameter at its position (so a
    positional secret is redacted by its name), a keyword one by its own name; a
    positional value no parameter names is not shown (:data:`UNNAMED`)."""
    params = list(signature.parameters.values())
    positional = [p.name for p in params if p.kind in (_POSITIONAL_ONLY, _POSITIONAL_OR_KEYWORD)]
    star = next((p.name for p in params if p.kind is _VAR_POSITIONAL), None)
    named: dict[str, object] = dict(zip(positional, args, strict=False))
    extra = list(args[len(positional):])
    if extra:
        if star is not None:
            named[star] = extra
        else:
            named.update((f"<{len(positional) + i}>", UNNAMED) for i in range(len(extra)))
    for name, value in kwargs.items():
        named.setdefault(name, value)
    return named


def validate_key_names(
    signature: inspect.Signature | None, key: Sequence[str] | Callable[..., object] | None
) -> None:
    """Check up front that a ``key=`` sequence only names parameters of ``signature``.

    A ``str`` counts as one name; callables and None pass. Without a signature the
    names are ``args`` and ``kwargs``. Raises FingerprintError (unknown or no name).
    """
    if key is None or callable(key):
        return
    names = (key,) if isinstance(key, str) else tuple(key)
    if not names:
        raise FingerprintError("grousset_key= names no argument; name at least one")
    valid = ("args", "kwargs") if signature is None else tuple(signature.parameters)
    unknown = [name for name in names if name not in valid]
    if unknown:
        raise FingerprintError(
            f"grousset_key= names unknown argument(s) {', '.join(map(repr, unknown))}; "
            f"valid names are: {', '.join(valid) or '(none)'}{_var_hint(signature, unknown)}"
        )


def _var_hint(signature: inspect.Signature | None, unknown: Sequence[str]) -> str:
    """How to key by a value a ``*args``/``**kwargs`` parameter holds: a callable, which
    gets that parameter as one argument under its name."""
    kinds = {p.kind: p.name for p in (signature.parameters.values() if signature else ())}
    if (var := kinds.get(inspect.Parameter.VAR_KEYWORD)) is not None:
        return (f". A keyword argument the other parameters do not name is inside "
                f"{var!r} (the **{var} parameter): key by it with a callable, "
                f"grousset_key=lambda {var}, **rest: {var}[{unknown[0]!r}]")  # fmt: skip
    return ""


def check_call_arguments(where: str, args: object, kwargs: object) -> None:
    """``args`` and ``kwargs`` as ``apply_async`` takes them (a tuple or list, a dict or
    None), or :class:`InvalidArgument` naming ``where`` and an example."""
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, (dict, type(None))):
        raise InvalidArgument(
            f"{where}(args, kwargs) takes the call's arguments as apply_async does, a tuple "
            f"and a dict (got {type(args).__name__} and {type(kwargs).__name__}): e.g. "
            f"{where.rsplit('.', 1)[-1]}((42,), {{'email': 'a@example.com'}})."
        )


def signature_of(fn: object) -> inspect.Signature | None:
    """``inspect.signature(fn)``, or None where it has none (a builtin, a C function)."""
    try:
        return inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def key_function(cls: type) -> None:
    """A callable given as ``grousset_key`` to the task decorator (or ``GROUSSET["TASKS"]``)
    lands in the task's class, where a function (or an ``lru_cache`` of one) would become
    a method: keep it a plain callable, called with the bound arguments alone. A ``def
    grousset_key(...)`` written in a class body stays the method it is written as."""
    key = cls.__dict__.get("grousset_key")
    if not callable(key) or isinstance(key, (staticmethod, classmethod, type)):
        return
    if not hasattr(type(key), "__get__"):
        return  # (not a descriptor: it never became a method)
    written = getattr(inspect.unwrap(key), "__qualname__", "")
    if written != f"{cls.__qualname__}.grousset_key":  # not a def in this class's body
        setattr(cls, "grousset_key", staticmethod(key))  # noqa: B010


def refuse_task_class_first(cls: type, mixin: type, task: type) -> None:
    """Refuse (``TypeError``) a guarded task class that lists Celery's ``task`` class
    before ``mixin``: ``Task.__call__`` would run every delivery unguarded. (A class of
    the project's that does so is the check ``E024``'s: celery_grousset.unguarded_check.)"""
    mro = cls.__mro__
    if task in mro and mro.index(task) < mro.index(mixin):
        raise TypeError(
            f"{cls.__qualname__}: list GroussetTaskMixin before the Celery task class "
            f"in its bases (class {cls.__name__}(GroussetTaskMixin, YourTask)).")  # fmt: skip


_SYNC_FIX = (
    "The guard runs a body synchronously and records what it returns: write it as a def, "
    "and run async code inside it with asgiref (`async_to_sync(fetch)(...)`)."
)


_GEN_FIX = (
    "Calling it runs none of its body (its effect would happen only when something "
    "iterates it, outside the guard), and the journal would record the call completed: "
    "return a list instead, e.g. a function that consumes it (`lambda: list(rows(day))`)."
)

#: why a guarded call cannot run in an event loop's thread (:func:`off_the_loop`)
WAITS = ("waits on the journal database and cannot run in an event loop's thread (it "
         "would block the loop, and fail when it meets a claim in flight)")  # fmt: skip
#: why a call that reads the journal before it publishes cannot (``publish_unique()``)
READS = ("queries the journal database, which would block the loop (Django refuses "
         "its ORM in an event loop's thread)")  # fmt: skip
#: why a call that writes in the caller's transaction cannot (``outbox.enqueue()``,
#: ``delay_on_commit()``): Django refuses the ORM and ``on_commit`` there
WRITES = ("uses this thread's database connection and transaction, which Django "
          "refuses in an event loop's thread")  # fmt: skip
#: the way out for those: the transaction and the call inside one wrapped function
WRAP_ATOMIC = "`await sync_to_async(fn)()` where fn holds the transaction.atomic() block"


def off_the_loop(where: str, how: str, why: str = WAITS) -> None:
    """Refuse a guarded call made in an event loop's thread, as Django's ``async_unsafe``
    does (``DJANGO_ALLOW_ASYNC_UNSAFE`` lifts it): the guard waits on the journal
    database, which would block the loop, and the body's ORM calls would fail. Refused
    here, before anything is claimed, written or published, with the way out."""
    import asyncio
    import os

    if os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"):
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    from django.core.exceptions import SynchronousOnlyOperation

    raise SynchronousOnlyOperation(
        f"celery-grousset: {where} {why}. Call it through asgiref: {how}."
    )


def synchronous(fn: object, where: str) -> None:
    """Refuse an ``async def`` body before it claims (a task: as its options resolve,
    check ``E019``; ``protect()``: its function): it would never be awaited, its effect
    never happen, and the journal record the call as completed."""
    if not callable(fn):
        return
    if _coroutine_function(fn):  # (a sync wrapper of one is not)
        raise NotAwaited(f"celery-grousset: {where} is an async def function. {_SYNC_FIX}")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise NotAwaited(f"celery-grousset: {where} is a generator function. {_GEN_FIX}")


def _coroutine_function(fn: object) -> bool:
    """``fn`` returns a coroutine when called: an ``async def`` function (or a partial of
    one), asgiref's ``sync_to_async(…)`` (marked as one), or an object whose ``__call__``
    is an ``async def``."""
    from asgiref.sync import iscoroutinefunction  # (inspect's, and asgiref's own marker)

    if iscoroutinefunction(fn):
        return True
    kind: Any = type(fn)  # (fn is callable: its class has a __call__)
    return inspect.iscoroutinefunction(kind.__call__)


def not_awaitable(value: object, where: str) -> object:
    """``value``, the body's return value, unless it is an awaitable (a coroutine it did
    not await) or a generator: then it is closed and refused (:class:`NotAwaited`)."""
    if inspect.isgenerator(value) or inspect.isasyncgen(value):
        if inspect.isgenerator(value):
            value.close()
        raise NotAwaited(f"celery-grousset: {where} returned a {type(value).__name__}. "
                         f"{_GEN_FIX}")  # fmt: skip
    if not inspect.isawaitable(value):
        return value
    close = getattr(value, "close", None)
    if callable(close):
        close()  # (no "coroutine was never awaited" warning: it is said here)
    raise NotAwaited(
        f"celery-grousset: {where} returned {type(value).__name__} {value!r:.80}, an "
        "awaitable it did not await: what it awaits never ran (code before the return "
        "did; the attempt fails as any failure does under its on_failure: released, so "
        f"the next delivery or call runs it again, or memoized and replayed). {_SYNC_FIX}"
    )
