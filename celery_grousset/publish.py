"""``task.publish_unique(calls)``: publish a batch of calls, minus the ones that need no message.

Two layers of deduplication at publish time (docs/producer.md), both an optimisation and
never the guarantee — the consumer-side claim still runs for every delivery:

1. **In the batch**: a call whose fingerprint was already seen in this run is
   skipped (``skipped_in_batch``). The calls are read ``chunk_size`` at a time; a
   chunk is always deduplicated completely, and the last ``window`` distinct
   fingerprints (default 100,000, ≈ 15 MB) are remembered across chunks, so memory
   stays bounded for a generator of any length. A copy that arrives more than
   ``window`` distinct calls after its first occurrence is caught by layer 2 only
   if the first copy was claimed by a worker in the meantime; otherwise it is
   published and the consumer's claim absorbs it.
   A keyed call whose payload hash (docs/configuration.md) differs from the one seen
   first for its key is published, not skipped (``payload_mismatches``): the worker's
   claim refuses it with ``PayloadMismatch``, so it is never dropped silently.
2. **Against the journal**: ONE indexed query per chunk asks which of the chunk's
   fingerprints the journal holds for the task's processor
   (``fingerprint = ANY(%s)`` on PostgreSQL, ``IN (…)`` elsewhere, on the Django
   connection of the journal's database). Skipped: completed rows and memoized
   failures still inside their retention window (``skipped_completed``) and fresh
   in-flight claims (``skipped_in_flight``: started less than
   ``max_processing_time`` ago, database clock). Expired rows, released failures
   and stale claims are published: their next delivery claims them again. So is a
   keyed call whose payload hash differs from its record's (``payload_mismatches``).

Everything else is published with ``task.apply_async`` in input order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import TYPE_CHECKING, Any

from celery_grousset import binding
from celery_grousset.claim import ClaimRequest, Kind, Prev, decide, payload_differs
from celery_grousset.delivery import KEY_HEADER
from celery_grousset.events import publish_payload_mismatch
from celery_grousset.exceptions import InvalidArgument
from celery_grousset.guard import fingerprint_and_payload

if TYPE_CHECKING:
    from celery_grousset.task import GroussetTaskMixin

#: distinct fingerprints remembered across chunks by layer 1 (≈ 150 bytes each)
DEFAULT_WINDOW = 100_000

COMPLETED = "completed"
IN_FLIGHT = "in_flight"


@dataclass
class PublishReport:
    """What :func:`publish_unique` did with the calls it was given."""

    published: int = 0
    skipped_in_batch: int = 0
    skipped_completed: int = 0
    skipped_in_flight: int = 0
    #: keyed calls published although their key was known, because their arguments differ
    #: from the record's or an earlier call's (the worker refuses them: PayloadMismatch)
    payload_mismatches: int = 0
    #: journal queries issued (at most one per chunk)
    queries: int = 0
    #: chunks read from ``calls``
    chunks: int = 0
    #: the AsyncResult of every published call, in order (empty with ``keep_results=False``)
    results: list[Any] = field(default_factory=list, repr=False)

    @property
    def total(self) -> int:
        """Calls read."""
        return (
            self.published
            + self.skipped_in_batch
            + self.skipped_completed
            + self.skipped_in_flight
        )

    @property
    def skipped(self) -> int:
        return self.total - self.published


@dataclass(frozen=True, slots=True)
class Call:
    """One call: its arguments, its optional idempotency key and its fingerprint."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    key: str | None
    fingerprint: str
    payload: str = ""  #: payload hash of a keyed call ('' otherwise, or validation off)


class _Window:
    """The last ``size`` distinct fingerprints seen, with their payload hashes (FIFO;
    ``size`` 0: only the chunk)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._order: deque[str] = deque()
        self._seen: dict[str, str] = {}

    def __contains__(self, fp: str) -> bool:
        return fp in self._seen

    def payload(self, fp: str) -> str:
        return self._seen[fp]

    def add(self, fp: str, payload: str = "") -> None:
        self._seen[fp] = payload
        self._order.append(fp)
        while len(self._order) > self.size:
            self._seen.pop(self._order.popleft(), None)

    def __len__(self) -> int:
        return len(self._seen)


def as_call(task: GroussetTaskMixin, item: Any, validate_payload: bool = True) -> Call:
    """``"key"`` → ``((key,), {}, key)``; ``(args, kwargs)`` or ``(args, kwargs, key)``."""
    if isinstance(item, str):
        args: tuple[Any, ...] = (item,)
        kwargs: dict[str, Any] = {}
        key: str | None = item
    elif (isinstance(item, (tuple, list)) and len(item) in (2, 3)
          and isinstance(item[0] or (), (tuple, list)) and isinstance(item[1] or {}, dict)):
        args, kwargs = tuple(item[0] or ()), dict(item[1] or {})
        key = item[2] if len(item) == 3 else None
    else:
        raise InvalidArgument(
            f"{task.name}.publish_unique: each call is (args, kwargs), (args, kwargs, "
            f"idempotency_key) or an idempotency key (str) — args a list or tuple, kwargs "
            f"a dict — got {type(item).__name__}"
        )
    check = getattr(task, "__header__", None) if getattr(task, "typing", False) else None
    if check is not None:  # Celery's own check, before the chunk is published
        try:
            check(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArgument(  # (the call's values not quoted: one may be a secret)
                f"{task.name}.publish_unique: a call with {len(args)} positional and "
                f"keyword arguments {sorted(kwargs)} does not fit the task's parameters: {exc}"
            ) from exc
    fp, payload = fingerprint_and_payload(task.grousset_call(args, kwargs, key), validate_payload)
    return Call(args, kwargs, key, fp, payload)


def classify(prev: Prev, now: datetime, max_takeovers: int) -> str | None:
    """Why a journal row makes a new message useless (None: publish). The claim's own
    decision table decides: only rows a claim would NOT take are skipped."""
    probe = ClaimRequest(
        processor_id="", fingerprint="", task_name="", task_id="", token="", worker="",
        args_repr="", max_processing_time=0.0, expires_after=0.0, max_takeovers=max_takeovers,
    )  # fmt: skip
    kind = decide(prev, now, probe)
    if kind is Kind.IN_FLIGHT:
        return IN_FLIGHT
    if kind in (Kind.COMPLETED, Kind.FAILED):
        return COMPLETED  # done, or a memoized failure: duplicates replay it
    return None


def journal_lookup(
    alias: str, processor_id: str, fingerprints: Sequence[str], max_takeovers: int
) -> dict[str, tuple[str, str]]:
    """ONE query: ``{fingerprint: (COMPLETED | IN_FLIGHT, payload hash)}`` for the rows
    that need no message."""
    from celery_grousset.store import get_store

    found: dict[str, tuple[str, str]] = {}
    rows = get_store(alias).lookup(processor_id, fingerprints)
    for fp, status, encoding, stale_at, expires_on, takeovers, payload, now in rows:
        prev = Prev(status, _aware(stale_at), _aware(expires_on), encoding, takeovers, "held")
        reason = classify(prev, _aware(now), max_takeovers)
        if reason is not None:
            found[fp] = (reason, payload)
    return found


def _aware(value: datetime) -> datetime:
    from datetime import timezone

    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def plan(
    task: GroussetTaskMixin,
    calls: Iterable[Any],
    report: PublishReport,
    *,
    chunk_size: int = 1000,
    window: int = DEFAULT_WINDOW,
) -> Iterator[list[Call]]:
    """Yield, chunk by chunk, the calls to publish; count the skipped ones in ``report``."""
    if chunk_size < 1:
        raise InvalidArgument("chunk_size must be at least 1")
    if window < 0:
        raise InvalidArgument("window must be 0 or more")
    opts = task.grousset_options()
    seen = _Window(window)
    for raw in _chunks(calls, chunk_size):
        report.chunks += 1
        chunk_seen: dict[str, str] = {}
        fresh: list[Call] = []
        ordered: list[Call] = []  # the calls that may be published, in input order
        for item in raw:
            call = as_call(task, item, opts.validate_payload)  # layer 1: chunk, then window
            fp = call.fingerprint
            first = chunk_seen[fp] if fp in chunk_seen else seen.payload(fp) if fp in seen else None
            if first is None:
                chunk_seen[fp] = call.payload
                fresh.append(call)
                ordered.append(call)
            elif payload_differs(first, call.payload):
                _mismatch(task.name, opts.processor_id, call, first, report)
                ordered.append(call)  # after the call it differs from: that one runs
            else:
                report.skipped_in_batch += 1
        del raw, chunk_seen
        skipped: set[int] = set()
        if fresh:
            report.queries += 1  # layer 2: one query for the whole chunk
            known = journal_lookup(
                opts.database, opts.processor_id, [c.fingerprint for c in fresh], opts.max_takeovers
            )
            for call in fresh:
                seen.add(call.fingerprint, call.payload)
                reason, stored = known.get(call.fingerprint, (None, ""))
                if reason is not None and payload_differs(stored, call.payload):
                    _mismatch(task.name, opts.processor_id, call, stored, report)
                    reason = None
                if reason == COMPLETED:
                    report.skipped_completed += 1
                    skipped.add(id(call))
                elif reason == IN_FLIGHT:
                    report.skipped_in_flight += 1
                    skipped.add(id(call))
        todo = [call for call in ordered if id(call) not in skipped]
        if todo:
            yield todo


def _mismatch(name: str, processor_id: str, call: Call, stored: str, report: PublishReport) -> None:
    report.payload_mismatches += 1
    publish_payload_mismatch(name, processor_id, call.fingerprint, stored, call.payload)


def _one_key_for_all(task: GroussetTaskMixin, options: dict[str, Any]) -> None:
    """A key in the options that go to every call would name them all one call: the
    batch deduplicates by each call's own key, the worker by that one."""
    headers = options.get("headers") or {}
    if "idempotency_key" in options or (isinstance(headers, dict) and KEY_HEADER in headers):
        raise InvalidArgument(
            f"{task.name}.publish_unique: an idempotency_key (or {KEY_HEADER!r} header) in "
            "the options would give every call one key. Give each call its own: an "
            "(args, kwargs, idempotency_key) triple, or the key alone as a str call."
        )
    if options.get("task_id") is not None:
        raise InvalidArgument(
            f"{task.name}.publish_unique: a task_id in the options would give every call "
            "one task id (their results overwrite each other, a revoke stops them all). "
            "Leave it out: each call gets its own."
        )


def publish_unique(
    task: GroussetTaskMixin,
    calls: Iterable[Any],
    *,
    chunk_size: int = 1000,
    window: int = DEFAULT_WINDOW,
    keep_results: bool = True,
    **options: Any,
) -> PublishReport:
    """Publish each distinct call of ``calls`` that the journal does not already answer.

    ``calls``: ``(args, kwargs)`` pairs, ``(args, kwargs, idempotency_key)`` triples,
    or idempotency keys (a ``str`` call is published as ``task.apply_async((key,),
    idempotency_key=key)``). ``options`` go to every ``apply_async`` (``queue``,
    ``countdown``…). ``keep_results=False`` keeps no AsyncResult (for generators of
    millions of calls: memory then stays bounded by ``chunk_size`` and ``window``).
    """
    binding.off_the_loop("publish_unique()", "`await sync_to_async(task.publish_unique)("
                         "calls)`", binding.READS)  # fmt: skip
    _one_key_for_all(task, options)
    report = PublishReport()
    app = task.app
    try:
        with app.producer_or_acquire(options.pop("producer", None)) as producer:
            for todo in plan(task, calls, report, chunk_size=chunk_size, window=window):
                for call in todo:
                    extra = {"idempotency_key": call.key} if call.key is not None else {}
                    result = task.apply_async(
                        call.args, call.kwargs, producer=producer, **extra, **options
                    )
                    report.published += 1
                    if keep_results:
                        report.results.append(result)
    except Exception as exc:  # what was published stays published: say how much
        exc.grousset_report = report  # type: ignore[attr-defined]
        note = getattr(exc, "add_note", None)  # (Python 3.11+; 3.10 keeps only the report)
        if note is not None:
            note(f"publish_unique: {report.published} call(s) were published before this "
                 "error (their report: exc.grousset_report)")  # fmt: skip
        raise
    return report
