"""System checks on the options a task's decorator gives it. Celery keeps unknown
decorator keywords as class attributes, and nothing reads them:

* ``celery_grousset.W011``: a task that is given celery-grousset options
  (``@shared_task(max_processing_time=30, transactional=True)``) but is not guarded — no
  ``base=GroussetTask`` and no ``GROUSSET["TASKS"]`` entry: every delivery runs the effect;
* ``celery_grousset.E022``: a guarded task's decorator keyword that reads like a misspelt
  option (``max_procesing_time=60``, ``grousset_keys=…``, ``transactonal=True``): the
  task would run with the setting's value or the default instead (a shorter
  ``max_processing_time`` lets a duplicate take over a running attempt; a lost
  ``grousset_key`` keys every argument; a lost ``transactional`` runs the body outside
  the claim's transaction). Only the values the task's own class holds (where Celery
  puts decorator keywords) are read, not methods or base classes. An error, so the
  worker does not start with a weaker guard than the task asks for; a name of your own
  that looks like one is silenced in ``SILENCED_SYSTEM_CHECKS``;
* ``celery_grousset.W017``: a ``GROUSSET["TASKS"]`` entry that selects no registered task
  (a typo leaves the task it meant unguarded), with the task name it reads like;
* ``celery_grousset.E024``: a guarded task whose class, or a base listed before the
  guard, defines ``__call__`` without passing the call on (no ``super()`` in it: a
  ``return self.run(*args, **kwargs)``, which Celery allows): every delivery runs
  unguarded; ``celery_grousset.W022`` the same for ``apply_async`` (one that publishes
  with ``send_task`` drops the call's ``idempotency_key``). Read from the method's code
  (and the functions it nests or wraps): the method of ``super()``, of a guarded class
  or of a class before the guard that passes it on, so one that passes the call on
  through a helper method is silenced in ``SILENCED_SYSTEM_CHECKS``;
* ``celery_grousset.E023``: an app whose own tasks (``celery.chord_unlock``,
  ``celery.backend_cleanup``…) are guarded, because its task class (``task_cls``,
  ``app.Task``) is a guarded class: a chord fails to publish (its unlock task cannot be
  fingerprinted), and Celery's internal tasks take claims and journal records.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.core import checks

from celery_grousset.conf import TASK_OPTIONS
from celery_grousset.options import reads_like

ID = "celery_grousset.W011"
MISSPELT_ID = "celery_grousset.E022"
BUILTIN_ID = "celery_grousset.E023"
#: a base's method that takes the call around the guard -> (level, check id, what
#: follows)
BYPASS: dict[str, tuple[Callable[..., checks.CheckMessage], str, str]] = {
    "__call__": (checks.Error, "celery_grousset.E024", "every delivery runs its body unguarded"),
    "apply_async": (checks.Warning, "celery_grousset.W022", "a call's idempotency_key is "
                    "dropped: the worker keys the call by its arguments (those its "
                    "grousset_key names, if it has one)"),
}

#: options a plain Celery task never has (``on_failure`` is Celery's own handler)
OWN_OPTIONS = tuple(name for name in (*TASK_OPTIONS, "grousset_key") if name != "on_failure")


def unguarded_messages(apps: Iterable[Any]) -> list[checks.CheckMessage]:
    """W011 for each task of ``apps`` that has celery-grousset options and no guard;
    E024 / W022 for each guarded one that a base takes around the guard; E023 for each
    app whose own tasks are guarded."""
    from celery_grousset.install import OWN_PREFIXES
    from celery_grousset.task import GroussetTaskMixin

    apps = list(apps)
    found: list[checks.CheckMessage] = builtin_messages(apps)
    seen: set[int] = set()
    for app in apps:
        for name, task in list(app.tasks.items()):
            if id(task) in seen:
                continue
            seen.add(id(task))
            if isinstance(task, GroussetTaskMixin):
                found.extend(_bypass_messages(name, type(task)))
                continue
            given = [opt for opt in OWN_OPTIONS if getattr(type(task), opt, None) is not None]
            if given and not name.startswith(OWN_PREFIXES):
                found.append(_warning(name, given))
    return found


def _bypass_messages(name: str, cls: type) -> Iterator[checks.CheckMessage]:
    """E024 / W022 for each class before the guard in ``cls``'s bases (``cls`` too) whose
    ``__call__`` / ``apply_async`` does not pass the call on."""
    from celery_grousset.task import GroussetTaskMixin

    mro = cls.__mro__
    before = mro[: mro.index(GroussetTaskMixin)]
    for base in before:
        for method, (level, check_id, harm) in BYPASS.items():
            if method not in vars(base) or _passes_on(vars(base)[method], method, before):
                continue
            own = base is cls
            yield level(
                f"Task {name!r}: {base.__qualname__}.{method} "
                + ("" if own else "comes before the guard in its bases and ")
                + f"does not call super().{method}(…): {harm}.",
                hint=f"Call super().{method}(…) in it"
                + ("." if own else f", or list GroussetTask first ({base.__name__} after it).")
                + " If it passes the call on another way, silence the check.",
                obj=name,
                id=check_id,
            )


def _passes_on(
    method: Any, name: str, before: tuple[type, ...] = (), depth: int = 0, hops: int = 0
) -> bool:
    """``method`` passes the call on to the ``name`` method of ``super``, or of a class
    called by name (``BaseTask.__call__(self, …)``, ``pkg.bases.BaseTask.__call__``)
    whose ``name`` is the guard's or, defined by a guarded class or a class ``before`` the
    guard, passes it on (a ``Grousset…`` name the package does not have counts,
    ``GroussetError`` does not), in its code or the code it nests (a lambda, an inner
    def), or in a function it wraps (a decorator's closure); a method that never reads
    ``name`` (``isinstance(self, GroussetTask)`` only) does not; one we cannot read
    passes."""
    method = inspect.unwrap(getattr(method, "__func__", method))
    code = getattr(method, "__code__", None)
    if code is None:
        return True
    cells = getattr(method, "__closure__", None) or ()
    names = {**getattr(method, "__globals__", {}),
             **dict(zip(code.co_freevars, map(_contents, cells), strict=False))}  # fmt: skip
    if _code_passes(code, names, name, before, hops):
        return True
    wrapped = [f for f in map(_contents, cells) if inspect.isfunction(f)]
    return depth < 3 and any(_passes_on(f, name, before, depth + 1, hops) for f in wrapped)


def _code_passes(
    code: Any, names: dict[str, Any], name: str, before: tuple[type, ...], hops: int
) -> bool:
    nested = _codes(code)
    used = {n for c in nested for n in (*c.co_names, *c.co_freevars)}
    if name not in used and name not in {k for c in nested for k in c.co_consts}:
        return False  # never reads the method (nor getattr(super(), "…")): no call on
    return any(_names_a_way_on(n, _resolved(n, names, used), name, before, hops)
               for n in used)  # fmt: skip


def _codes(code: Any, depth: int = 0) -> list[Any]:
    """``code`` and the code it nests (lambdas, inner defs), three levels deep."""
    inner = [c for c in code.co_consts if inspect.iscode(c)] if depth < 3 else []
    return [code, *(c for i in inner for c in _codes(i, depth + 1))]


def _resolved(n: str, names: dict[str, Any], used: set[str]) -> list[Any]:
    """What ``n`` is: the code's global or free name, else an attribute of a module the
    code names (``bases.GuardedBase``, ``pkg.bases.GuardedBase``, an alias of
    celery_grousset) or of the package's modules that hold ``Grousset…`` names."""
    import celery_grousset
    from celery_grousset import conf, exceptions

    if n in names:
        return [names[n]]
    modules = [m for m in (names.get(u) for u in used) if isinstance(m, types.ModuleType)]
    modules += [celery_grousset, exceptions, conf]
    seen: set[int] = set()
    for module in modules:  # (grows: a module's modules, as far as the code names them)
        if id(module) in seen or len(seen) >= 32:
            continue
        seen.add(id(module))
        modules += [a for a in (_attribute(module, u) for u in used)
                    if isinstance(a, types.ModuleType)]  # fmt: skip
    return [a for a in (_attribute(m, n) for m in modules) if a is not None]


def _attribute(module: Any, n: str) -> Any:
    try:  # (a module's __getattr__ may raise anything: a lazy import that fails)
        return getattr(module, n, None)
    except Exception:
        return None


def _names_a_way_on(
    n: str, found: list[Any], name: str, before: tuple[type, ...], hops: int
) -> bool:
    from celery_grousset.task import GroussetTaskMixin

    if n == "super":
        return True
    if not found:  # a Grousset… name we cannot resolve: passes
        return n.startswith("Grousset")
    for f in found:
        if not isinstance(f, type):
            continue
        # the class that defines the method f has (its own, or one it inherits)
        definer = next((k for k in f.__mro__ if name in vars(k)), None)
        if definer is GroussetTaskMixin:  # the guard's own
            return True
        if definer is None or hops >= 4:
            continue
        # a guarded class's own, or one of a class before the guard: passes it on?
        if (definer in before or issubclass(definer, GroussetTaskMixin)) and _passes_on(
            vars(definer)[name], name, before, 0, hops + 1
        ):
            return True
    return False


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def builtin_messages(apps: Iterable[Any]) -> list[checks.CheckMessage]:
    """E023 for each app whose own tasks (named ``celery.…``) are guarded."""
    from celery_grousset.install import OWN_PREFIXES
    from celery_grousset.task import GroussetTaskMixin

    found: list[checks.CheckMessage] = []
    for app in apps:
        if not (isinstance(app.Task, type) and issubclass(app.Task, GroussetTaskMixin)):
            continue  # (a task of Celery's named in GROUSSET["TASKS"] is guarded on purpose)
        own = sorted(name for name, task in list(app.tasks.items())
                     if name.startswith(OWN_PREFIXES)
                     and isinstance(task, GroussetTaskMixin))  # fmt: skip
        if own:
            found.append(checks.Error(
                f"Celery app {app.main!r} guards its own tasks ({', '.join(own[:3])}"
                f"{', …' if len(own) > 3 else ''}): its task class (task_cls, app.Task) is "
                "a guarded class. A chord fails to publish (its unlock task cannot be "
                "fingerprinted), and Celery's internal tasks take claims and journal "
                "records.",
                hint="Leave the app's task class Celery's and guard your own tasks: "
                "base=GroussetTask on their decorators, or GROUSSET['TASKS'] "
                "({'yourapp.tasks.*': {...}}: patterns never select Celery's own tasks).",
                id=BUILTIN_ID,
            ))  # fmt: skip
    return found


def _warning(name: str, given: list[str]) -> checks.CheckMessage:
    return checks.Warning(
        f"Task {name!r} is given celery-grousset options ({', '.join(given)}) but is not "
        "guarded: nothing reads them, and every delivery runs its effect.",
        hint="Add base=GroussetTask to its decorator (@shared_task(base=GroussetTask, ...)), "
        f"or name it in GROUSSET['TASKS'] ({{{name!r}: {{...}}}}) to guard a task you do "
        "not own.",
        obj=name,
        id=ID,
    )


#: the names a task's decorator may give for celery-grousset
KNOWN = frozenset((*OWN_OPTIONS, "on_failure", "grousset_on_failure"))


def misspelt_messages(apps: Iterable[Any]) -> list[checks.CheckMessage]:
    """E022 for each guarded task's decorator keyword that reads like a misspelt option."""
    from celery import Task

    from celery_grousset.task import GroussetTaskMixin

    celery_names = {name for klass in Task.__mro__ for name in vars(klass)}  # no descriptor run
    found: list[checks.CheckMessage] = []
    seen: set[int] = set()
    for app in apps:
        for name, task in list(app.tasks.items()):
            if id(task) in seen or not isinstance(task, GroussetTaskMixin):
                continue
            seen.add(id(task))
            for attr, meant in _misspelt(type(task), celery_names):
                found.append(_misspelt_error(name, type(task), attr, meant))
    return found


#: the task options of the libraries a project moves from (docs/migrating.md) -> ours
FOREIGN = {
    "once": "grousset_key (its keys) and max_processing_time (its timeout)",  # celery-once
    "unique_on": "grousset_key",  # celery-singleton
    "lock_expiry": "max_processing_time",
    "raise_on_duplicate": "nothing",
}
#: what a task left with that option does here
_FOREIGN_EFFECT = {
    "lock_expiry": "how long an attempt may hold its claim is max_processing_time",
    "raise_on_duplicate": "a publish is never refused here; a duplicate's delivery gets "
    "the first call's result instead of running",
}


def _foreign_effect(cls: type, attr: str) -> str:
    if attr in _FOREIGN_EFFECT:
        return _FOREIGN_EFFECT[attr]
    if getattr(cls, "grousset_key", None):
        return "a call is keyed by the task's grousset_key, not by what it names"
    return "a call is keyed by all its arguments, not by the ones it names"


def _misspelt_error(name: str, cls: type, attr: str, meant: str) -> checks.CheckMessage:
    if attr in FOREIGN:
        text = (f"Task {name!r} is given {attr!r}, an option of celery-once / "
                f"celery-singleton that nothing reads here: {_foreign_effect(cls, attr)}.")
        fix = (f"Replace {attr!r} with {meant}" if meant != "nothing" else
               f"Remove {attr!r}: nothing replaces it") + " (docs/migrating.md)."  # fmt: skip
    else:
        runs = (f"the task's own {meant!r}" if meant in vars(cls)
                else f"{meant!r} from GROUSSET or its default")  # fmt: skip
        text = (f"Task {name!r} is given {attr!r}, which is no option: did you mean "
                f"{meant!r}? Nothing reads {attr!r}: the task would run with {runs}.")
        fix = f"Rename it to {meant!r} in the task's decorator"
        fix += " (or remove it)." if meant in vars(cls) else "."
    return checks.Error(text, obj=name, id=MISSPELT_ID, hint=(
        f"{fix} A name of your own: silence celery_grousset.E022 in SILENCED_SYSTEM_CHECKS."))


def _misspelt(cls: type, celery_names: set[str]) -> Iterable[tuple[str, str]]:
    """(attribute, the option it reads like) for the plain values of the task's own class
    (where Celery puts the decorator's keywords) that no Celery task has."""
    for attr, value in vars(cls).items():
        if attr in KNOWN or attr.startswith("_") or attr in celery_names or callable(value):
            continue
        if isinstance(value, (property, staticmethod, classmethod)):
            continue
        meant = FOREIGN.get(attr) or reads_like(attr, KNOWN)
        if meant is not None:
            yield attr, meant


def unmatched_messages(apps: Iterable[Any]) -> list[checks.CheckMessage]:
    """W017 for each ``GROUSSET["TASKS"]`` entry that selects no task of ``apps``."""
    from celery_grousset.install import _table, unmatched, unmatched_text

    names = {name for app in apps for name in app.tasks}
    if not names:  # no Celery app in this process: nothing to match
        return []
    return [
        checks.Warning(
            unmatched_text(entry, meant),
            hint="Name the task as Celery registers it (its name= or module.function: "
            "`celery -A proj inspect registered`), or write a pattern ('shop.tasks.*').",
            obj=f"GROUSSET['TASKS'][{entry!r}]",
            id="celery_grousset.W017",
        )
        for entry, meant in unmatched(_table(), names)
    ]
