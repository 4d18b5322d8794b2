"""``GroussetTask``: a Celery task whose side effect happens once. Every delivery runs
:func:`celery_grousset.guard.guarded` (docs/how-it-works.md); this module is the Celery
glue around it: options, the hooks that re-queue a delivery, bypass, eager mode, and the
publish-time checks."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, cast

from celery import Task
from celery.exceptions import Reject, Retry

from celery_grousset import binding, carry, events, exceptions, guard, memo, periodic, publish_check
from celery_grousset.claim import ClaimRequest, Kind
from celery_grousset.conf import on_reload
from celery_grousset.delivery import (
    COUNTED_HEADER,
    REQUEUES_HEADER,
    broker_countdown,
    carried_headers,
    delivery_fields,
    in_flight_countdown,
    key_of,
    rejected,
    republish_failed,
    republished,
    stop_canvas,
    store_countdown,
    wait_within,
)
from celery_grousset.delivery import header as _header
from celery_grousset.exceptions import PoisonDelivery, StoreUnavailable
from celery_grousset.fingerprint import validate_key_names
from celery_grousset.options import NAMES as _OPTION_NAMES
from celery_grousset.options import Options
from celery_grousset.publish import publish_unique as _publish_unique
from celery_grousset.published import bypassed, eager, mark_retry, on_commit, prepare, unheader
from celery_grousset.store import ClaimResult

_instances: list[GroussetTaskMixin] = []

#: (task name, attempt) of the guarded attempt running in this context
_ATTEMPT: ContextVar[tuple[str, guard.Attempt] | None] = ContextVar("grousset_attempt", default=None)  # noqa: E501
#: inside retry(): the fingerprint its message keeps (taken by signature_from_request)
_RETRYING: ContextVar[list[str] | None] = ContextVar("grousset_retrying", default=None)

_PLAIN_CALL: dict[type, bool] = {}


def _plain_call(cls: type) -> bool:
    """Whether ``cls.__call__`` is ours and the next one in the MRO is Celery's own
    ``Task.__call__`` (no user ``__call__`` to honour on either side)."""
    known = _PLAIN_CALL.get(cls)
    if known is None:
        owners = [k for k in cls.__mro__ if "__call__" in vars(k)]
        known = owners[:2] == [GroussetTaskMixin, Task]
        _PLAIN_CALL[cls] = known
    return known


class GroussetTaskMixin:
    """The guard, as a mixin for any Celery task class (see :class:`GroussetTask`).

    Every option below may be set as a decorator keyword, a class attribute, a
    ``GROUSSET`` setting (upper case; not ``grousset_key``) or — ``max_processing_time`` and
    ``processor_id`` — a worker flag. Precedence: per call > task > worker flag >
    ``settings.GROUSSET`` > built-in default.
    """

    #: Seconds (or timedelta) an attempt may hold its claim before another delivery
    #: takes it over. Required: no default.
    max_processing_time: float | timedelta | None = None
    #: Retention window of a completed record (default 7 days).
    expires_after: float | timedelta | None = None
    #: Who deduplicates (default: the Celery app's main name).
    processor_id: str | None = None
    #: Argument names (or a callable over the bound arguments) that identify a call;
    #: default: every argument.
    grousset_key: Sequence[str] | Callable[..., Any] | None = None
    #: A duplicate that finds a fresh claim: ``"retry"`` (re-queue) or ``"wait"``.
    on_in_flight: str | None = None
    #: Run the body and the completion in one transaction on the journal's database.
    transactional: bool | None = None
    #: Store the return value for duplicates (default True).
    memoize: bool | None = None
    #: When the body raises: ``"release"`` (run again) or ``"memoize"`` (replay); the
    #: decorator's ``on_failure=`` lands here (Celery's ``on_failure`` keeps its name).
    grousset_on_failure: str | None = None
    #: Encoded results larger than this are not memoized (default 256 KiB).
    max_result_bytes: int | None = None
    #: Takeovers before a record is marked failed (default 3).
    max_takeovers: int | None = None
    #: Django database alias of the journal (default ``GROUSSET["DATABASE"]``).
    database: str | None = None
    #: Refuse a keyed call whose arguments differ from its record's (default True).
    validate_payload: bool | None = None
    #: Key a run that celery beat published by its schedule slot too (default True).
    periodic_slot: bool | None = None

    _grousset_opts: Options | None = None
    _grousset_bypass: bool | None = None
    _grousset_sig: inspect.Signature | None = None

    # Provided by celery.Task
    name: str
    request: Any
    app: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        binding.refuse_task_class_first(cls, GroussetTaskMixin, Task)
        binding.key_function(cls)  # @app.task(grousset_key=fn): fn gets the bound arguments alone
        # @app.task(on_failure="memoize") would replace Celery's on_failure handler: move it
        value = cls.__dict__.get("on_failure")
        if isinstance(value, str):
            cls.grousset_on_failure = value
            delattr(cls, "on_failure")

    # -- options ---------------------------------------------------------------------------

    def grousset_options(self) -> Options:
        """Options resolved once per process (dropped when settings change)."""
        opts = self._grousset_opts
        if opts is None:
            worker = dict(getattr(self.app.conf, "grousset_worker", None) or {})
            explicit = {}
            for name in _OPTION_NAMES:
                attr = "grousset_on_failure" if name == "on_failure" else name
                value = getattr(self, attr, None)
                explicit[name] = value if value is not None else worker.get(name)
            opts = Options.resolve(
                f"the task {self.name!r}", explicit, default_processor=self.app.main or "default"
            )
            sig = self._signature()  # (refuses an async def body)
            if self.grousset_key is not None and not callable(self.grousset_key):
                validate_key_names(sig, self.grousset_key)
            self._grousset_opts = opts
            _instances.append(self)
        return opts

    def _signature(self) -> inspect.Signature | None:
        if self._grousset_sig is None:  # an async def body refused at publish too (E019)
            binding.synchronous(self.run, f"task {self.name!r}")  # type: ignore[attr-defined]
            self._grousset_sig = binding.signature_of(self.run)  # type: ignore[attr-defined]
        return self._grousset_sig

    def grousset_call(
        self,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        idempotency_key: str | None = None,
        request: Any = None,
    ) -> guard.Call:
        """One call of this task, as the guard sees it."""
        return guard.Call(
            name=self.name,
            task_id=str(request.id or uuid.uuid4()) if request is not None else "",
            args=args,
            kwargs=kwargs,
            signature=self._signature(),
            key=self.grousset_key,
            idempotency_key=idempotency_key,
            serializer=self.app.conf.result_serializer or "json",  # as the result backend
            **delivery_fields(request),
            slot=periodic.run_slot(self, _header(request, periodic.SLOT_HEADER)),
        )

    def grousset_fingerprint(self, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
                             idempotency_key: str | None = None) -> str:  # fmt: skip
        """The fingerprint of one call of this task: ``grousset_fingerprint((42,),
        {"email": "a@b"})``, as ``apply_async`` takes ``args`` and ``kwargs``."""
        binding.check_call_arguments(f"{self.name}.grousset_fingerprint", args, kwargs)
        return guard.fingerprint_of(self.grousset_call(args, kwargs or {}, idempotency_key))

    @property
    def grousset(self) -> guard.Attempt:
        """Inside a running attempt: ``fingerprint``, ``fence``, ``deliveries``…"""
        current = _ATTEMPT.get()
        attempt = current[1] if current is not None and current[0] == self.name else None
        if attempt is None:
            from celery_grousset.exceptions import GroussetError

            raise GroussetError(
                f"{self.name}: self.grousset exists only while a guarded attempt runs "
                "(inside the task body, after the claim)."
            )
        return attempt

    # -- publishing ------------------------------------------------------------------------

    def apply(self, args: Any = None, kwargs: Any = None, *a: Any, **options: Any
              ) -> EagerResult[Any]:  # fmt: skip
        """``apply(…, idempotency_key="order-42")``, as :meth:`apply_async` takes it."""
        eager(self, options)
        return super().apply(args, kwargs, *a, **options)  # type: ignore[misc,no-any-return]

    def apply_async(self, args: Any = None, kwargs: Any = None, *a: Any, **options: Any
                    ) -> AsyncResult[Any]:  # fmt: skip
        """``apply_async(…, idempotency_key="order-42")`` names the call's identity."""
        prepare(self, args, kwargs, options)
        publish_check.in_transaction(self, options)
        return super().apply_async(args, kwargs, *a, **options)  # type: ignore[misc,no-any-return]

    #: ``celery_grousset.publish.publish_unique`` as the task's method: publish the calls the
    #: journal does not already answer, one query per chunk (``window``, ``keep_results``)
    publish_unique = _publish_unique

    def retry(self, args: Any = None, kwargs: Any = None, exc: Any = None, throw: bool = True,
              *a: Any, **options: Any) -> Any:  # fmt: skip
        """Celery's retry; its message stays the call it retries, whatever its arguments."""
        current = _ATTEMPT.get()
        mine = current is not None and current[0] == self.name
        held = [current[1].fingerprint] if throw and current and mine else []
        if mine and not throw:  # (its retry, with the same arguments, gets the memo)
            events.retry_not_raised(self.name, self.request.id)
        token = _RETRYING.set(held)
        try:
            return super().retry(args, kwargs, exc, throw, *a, **options)  # type: ignore[misc]
        finally:
            _RETRYING.reset(token)

    def signature_from_request(self, request: Any = None, *a: Any, **options: Any) -> Any:
        sig = super().signature_from_request(request, *a, **options)  # type: ignore[misc]
        unheader(sig)
        if held := _RETRYING.get():  # the message of retry(), built once
            mark_retry(self, self.request if request is None else request, sig, held.pop())
        return sig

    # -- running ---------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        # Celery's tracer calls a task that overrides __call__ through it, and
        # Task.__call__ then pushes a copy of the request the tracer has just pushed
        # (a Context built from ~60 keys: a measurable share of a no-op task). Under the
        # tracer (called_directly is False) the task and its request are already on
        # their stacks, so run() is called as the tracer calls plain tasks.
        if request.called_directly is False and _plain_call(type(self)):
            run = self.run  # type: ignore[attr-defined]
        else:
            run = super().__call__  # type: ignore[misc]
        bypass = self._grousset_bypass
        if bypass is None:  # read once per process: Celery's config lookups are slow
            bypass = self._grousset_bypass = bypassed(self.app)
            _instances.append(self)
        call = self.grousset_call(args, kwargs, key_of(request), request)
        if bypass:
            return self._bypassed(call, lambda: run(*args, **kwargs))
        return guard.guarded(_TaskCaller(self, request, lambda: run(*args, **kwargs)), call)

    def _bypassed(self, call: guard.Call, body: Callable[[], Any]) -> Any:
        """No claim, no journal; the body still gets its fingerprint (an external key)."""
        events.bypassed(self.name, call.task_id)
        attempt = guard.Attempt(
            fingerprint=guard.fingerprint_of(call), fence=0, deliveries=0, takeovers=0,
            kind=Kind.BYPASSED, processor_id=str(self.processor_id or self.app.main or "default"),
            token="")  # fmt: skip
        return self._with_attempt(attempt, body)

    def _with_attempt(self, attempt: guard.Attempt, body: Callable[[], Any]) -> Any:
        """Run ``body`` with ``self.grousset`` bound to ``attempt`` (a context variable:
        Celery < 5.4 pushes a fresh request context inside Task.__call__)."""
        reset = _ATTEMPT.set((self.name, attempt))
        try:
            return body()
        finally:
            _ATTEMPT.reset(reset)

    def _requeue(
        self, countdown: float, exc: BaseException | None, extra: Any = None, request: Any = None,
        latest: float | None = None, started: bool = False,
    ) -> NoReturn:
        """Send this delivery (``request``, default: the one running) again after
        ``countdown`` (to arrive within ``latest`` s, if given) without using up max_retries.
        ``started``: the copy carries its attempt's outcome (the effect ran): it has no
        ``expires``, so that the outcome is written whenever it arrives."""
        request = self.request if request is None else request
        countdown = broker_countdown(self.app, countdown, latest)
        n = int(_header(request, REQUEUES_HEADER) or 0)
        headers = carried_headers(request, {REQUEUES_HEADER: n + 1, **(extra or {})})
        sig = self.signature_from_request(request, None, None, countdown=countdown,
                                          retries=request.retries, headers=headers,
                                          **({"expires": None} if started else {}))  # fmt: skip
        try:
            sig.apply_async()
        except Exception as publish_exc:
            # Could not re-publish: hand the message back after a growing wait (no hot loop)
            republish_failed(self.name, countdown, publish_exc, latest)
            raise Reject(publish_exc, requeue=True) from publish_exc
        republished()
        raise Retry(exc=cast(Any, exc), when=cast(Any, countdown), sig=sig)


class _TaskCaller:
    """One delivery's hooks (:class:`guard.Caller`); eager and direct calls wait or raise."""
    __slots__ = ("body", "local", "request", "task")
    accept = property(lambda c: memo.app_accept(c.task.app))  # memos: what the app accepts
    carried = property(lambda c: _header(c.request, carry.HEADER))  # an outcome to write
    wait_within = property(lambda c: None if c.local else wait_within(c.task, c.request))

    def __init__(self, task: GroussetTaskMixin, request: Any, body: Callable[[], Any]) -> None:
        self.task, self.request, self.body = task, request, body
        self.local = bool(request.is_eager or request.called_directly)
        if self.local:  # in the caller's process: never in its event loop's thread
            binding.off_the_loop(f"task {task.name!r}", "`await sync_to_async(task.apply)(args)`")

    def options(self) -> Options:
        return self.task.grousset_options()

    def in_flight_policy(self, opts: Options) -> str:
        return "wait" if opts.on_in_flight == "wait" or self.local else "retry"


    def defer(self, req: ClaimRequest, res: ClaimResult) -> NoReturn:
        countdown = in_flight_countdown(self.request, res.retry_in)
        why = exceptions.ClaimInFlight.requeued(req.task_name, req.fingerprint, res.retry_in,
                                                countdown)  # Celery logs it as a retry's
        self.task._requeue(countdown, why, {COUNTED_HEADER: 1}, self.request)

    def store_unavailable(self, exc: StoreUnavailable, outcome: Any = None) -> NoReturn:
        if self.local:
            raise exc
        wait = carry.countdown(outcome or {}, store_countdown(self.request))
        extra = {carry.HEADER: outcome} if outcome is not None else None
        self.task._requeue(wait, exc, extra, self.request, carry.time_left(outcome),
                           started=carry.ran(outcome))

    def carry(self, outcome: dict[str, Any], exc: StoreUnavailable) -> NoReturn:
        self.store_unavailable(exc, outcome)  # celery_grousset.carry

    def run(self, attempt: guard.Attempt) -> Any:
        return self.task._with_attempt(attempt, self.body)

    def stop_canvas(self, req: ClaimRequest, encoding: str, first: str | None) -> None:
        stop_canvas(self.request, req, encoding, first)

    def poison(self, exc: PoisonDelivery) -> NoReturn:
        if self.local:
            raise exc
        raise rejected(self.task, self.request, exc) from exc


def worker_caller(task: GroussetTaskMixin, context: Any) -> _TaskCaller:
    """The hooks of a delivery the worker's main process decides (``WORKER_CLAIM``),
    ``context`` its request's ``celery.app.task.Context``: as a pool child's, not a
    direct call's."""
    from celery.app.task import Context

    return _TaskCaller(task, Context(vars(context), called_directly=False), lambda: None)


if TYPE_CHECKING:
    from celery.contrib.django.task import DjangoTask
    from celery.result import AsyncResult, EagerResult

    _Task = DjangoTask[Any, Any]
else:
    try:  # Celery >= 5.4 ships a Django task class: delay_on_commit, apply_async_on_commit
        from celery.contrib.django.task import DjangoTask as _Task
    except ImportError:  # pragma: no cover - Celery 5.3
        _Task = Task


class GroussetTask(GroussetTaskMixin, _Task):
    """A Celery task guarded by the outcome journal, and Celery's ``DjangoTask`` (with
    ``delay_on_commit``) where Celery ships one (5.4+): ``@app.task(base=GroussetTask,
    bind=True, max_processing_time=60)``."""

    abstract = True

    if _Task is not Task:  # its *_on_commit publish in on_commit: check the call now

        def delay_on_commit(self, *args: Any, **kwargs: Any) -> Any:
            on_commit(self, args, kwargs, {}, "delay_on_commit")
            return super().delay_on_commit(*args, **kwargs)

        def apply_async_on_commit(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:  # type: ignore[override]  # noqa: E501
            on_commit(self, args, kwargs, dict(options), "apply_async_on_commit")
            return super().apply_async_on_commit(args, kwargs, **options)


GroussetDjangoTask = GroussetTask  #: the same class (a DjangoTask on Celery 5.4 and later)


def reset_resolved_options() -> None:
    """Forget every task's resolved options (settings or worker flags changed)."""
    for task in _instances:
        task._grousset_opts = None
        task._grousset_bypass = None
    _instances.clear()


on_reload(reset_resolved_options)

from celery_grousset import revoked as _revoked  # noqa: E402,F401  (connects its handler)
