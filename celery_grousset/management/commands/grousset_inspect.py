"""``manage.py grousset_inspect <fingerprint|task_id>``: what happened to this message.

Matches a task id exactly, a fingerprint exactly, or a fingerprint prefix of at
least 8 hex characters. One match prints its story (or a JSON object with
``--json``); several matches are listed (a JSON array with ``--json``).
"""

from __future__ import annotations

import json
import pprint
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_grousset.claim import ENC_EXCEPTION, ENC_GAVE_UP, ENC_NOT_MEMOIZED, ENC_NOT_STORED
from celery_grousset.management import (
    MIN_PREFIX,
    add_database_argument,
    database_errors,
    describe_matches,
    find,
    human_seconds,
    iso,
    journal_alias,
    other_journals,
    printable,
    timestamp,
)
from celery_grousset.textcut import clean_and_cut, encodable

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from celery_grousset.models import Outcome


def decode_memo(rec: Outcome, now: datetime) -> tuple[Any, str | None]:
    """``(value, None)`` or ``(None, why there is no value)``. Display only: JSON memos are
    decoded, any other is described by its content type and size, nothing is imported."""
    from celery_grousset import journal

    ok, value = journal.memo_value(rec, now)
    return (value, None) if ok else (None, str(value))


def story(rec: Outcome, now: datetime, asked: Sequence[Any] = ()) -> dict[str, Any]:
    """Everything the journal knows about one entry, JSON-ready; ``asked``: the recorded
    deliveries (``Delivery``) of the task id looked up, when it is not the row's own."""
    from celery_grousset import journal

    value, memo_error = decode_memo(rec, now)
    first = rec.first_claimed_at or rec.started_at
    return {
        "fingerprint": rec.fingerprint,
        "processor_id": rec.processor_id,
        "task_name": rec.task_name,
        "task_id": rec.task_id,
        "status": rec.status,
        "summary": summary(rec, now),
        "fence": rec.fence,
        "deliveries": rec.deliveries,
        "duplicates": rec.duplicates,
        "redeliveries": max(rec.deliveries - 1 - rec.duplicates, 0),
        "takeovers": rec.takeovers,
        "first_claimed_at": iso(first),
        "started_at": iso(rec.started_at),
        "completed_at": iso(rec.completed_at),
        "stale_at": iso(rec.stale_at),
        "stale": rec.status == "in_flight" and rec.stale_at <= now,
        "expires_on": iso(rec.expires_on),
        "expired": rec.expires_on <= now,
        "age_seconds": round((now - rec.started_at).total_seconds(), 3),
        "worker": rec.worker,
        "args_repr": rec.args_repr,
        "error": rec.error or None,
        "result_encoding": rec.result_encoding,
        "memo_bytes": len(rec.result) if rec.result is not None else None,
        "memo": value,
        "memo_error": memo_error,
        "this_delivery": [
            {"task_id": d.task_id, "at": iso(d.at), "fate": journal.delivery_fate(d.decision)}
            for d in asked
            if (d.processor_id, d.fingerprint) == (rec.processor_id, rec.fingerprint)
        ],
    }


def summary(rec: Outcome, now: datetime) -> str:
    """One sentence: what the next delivery of this fingerprint will do."""
    if rec.status == "in_flight":
        held = human_seconds((now - rec.started_at).total_seconds())
        if rec.stale_at <= now:
            return (
                f"an attempt has held the claim for {held}; it is stale (past its "
                "max_processing_time): the next delivery takes it over"
            )
        left = human_seconds((rec.stale_at - now).total_seconds())
        return (
            f"an attempt has held the claim for {held}; duplicates wait, and take over "
            f"if it has not finished when it turns stale in {left}"
        )
    if rec.expires_on <= now:
        return "expired: the next delivery runs the task again (grousset_purge deletes it)"
    if rec.status == "completed":
        if rec.result_encoding == ENC_NOT_MEMOIZED:
            return "duplicates get None (memoize=False) and never re-run the effect"
        if rec.result_encoding == ENC_NOT_STORED:
            return ("the effect ran, but its value could not be stored (below): duplicates "
                    "raise ResultNotStored and never re-run the effect")
        return "duplicates get the memo below and never re-run the effect"
    if rec.result_encoding == ENC_GAVE_UP:
        return (
            "gave up after repeated takeovers; duplicates raise GaveUp until "
            "`grousset_release --force`"
        )
    if rec.result_encoding == ENC_EXCEPTION:
        return "the failure is memoized and replayed to duplicates"
    return ("released: the next delivery of this call runs the task again (a failed "
            "delivery was acknowledged: publish the call again if none is coming)")


class Command(BaseCommand):
    help = "Show what happened to a message: by task id, fingerprint or fingerprint prefix."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "needle",
            metavar="fingerprint-or-task-id",
            help=f"A task id, a fingerprint, or a fingerprint prefix (≥ {MIN_PREFIX} hex chars).",
        )
        parser.add_argument("--processor-id", default=None, help="Only this processor's entry.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = journal_alias(options["database"])
        with database_errors(alias, "could not read the journal"):
            self.handle_on(alias, **options)

    def handle_on(self, alias: str, **options: Any) -> None:
        from celery_grousset import journal

        needle = str(options["needle"]).strip()
        records = find(alias, needle, options["processor_id"])
        if not records:
            hint = (
                ""
                if len(needle) >= MIN_PREFIX
                else (f" (fingerprint prefixes need at least {MIN_PREFIX} hex characters)")
            )
            raise CommandError(
                f"no journal entry matches {clean_and_cut(repr(needle), 200)} in {alias!r}"
                + (f" for processor {clean_and_cut(repr(proc), 100)}"
                   if (proc := options["processor_id"]) is not None else "")
                + f"{hint}{other_journals(alias)}"
            )
        now = journal.now(alias)
        asked = journal.deliveries_of(alias, needle)
        if options["json"]:
            data: Any = (
                story(records[0], now, asked)
                if len(records) == 1
                else [story(rec, now, asked) for rec in records]
            )
            # (ASCII: a bidirectional override in the journal's text is an escape here)
            self.stdout.write(json.dumps(data, indent=2, default=repr))
        elif len(records) == 1:
            self.stdout.write(self.render(story(records[0], now, asked)))
        else:
            self.stdout.write(describe_matches(records))
            self.stdout.write("Pass a full fingerprint, a task id or --processor-id to pick one.")

    @staticmethod
    def render(data: dict[str, Any]) -> str:
        completed = data["completed_at"]
        rows = [
            ("status", f"{data['status']} — {data['summary']}"),
            ("task", data["task_name"]),
            ("task id", data["task_id"] or "—"),
            ("processor", data["processor_id"]),
            *(("this delivery", f"{d['task_id']}: {d['fate']} ({_when(d['at'])})")
              for d in data["this_delivery"]),
            ("deliveries", _deliveries(data)),
            ("takeovers", str(data["takeovers"])),
            ("fence", str(data["fence"])),
            ("first claim", _when(data["first_claimed_at"])),
            ("started", _when(data["started_at"]) + " (the current attempt)"),
            ("completed", _when(completed) if completed else "—"),
            ("expires", _when(data["expires_on"]) + (" (expired)" if data["expired"] else "")),
            ("age", human_seconds(data["age_seconds"])),
            ("worker", data["worker"] or "—"),
            ("arguments", data["args_repr"] or "—"),
            ("error", data["error"] or "—"),
            ("memo", _memo_text(data)),
        ]
        width = max(len(label) for label, _ in rows) + 2
        lines = [f"Journal entry {data['fingerprint']}"]
        for label, text in rows:  # (only these may run over several lines)
            shown = printable(str(text), lines=label in ("arguments", "error", "memo"))
            first, *rest = shown.split("\n")
            lines.append(f"  {label.ljust(width)}{first}")
            lines.extend(" " * (width + 2) + line for line in rest)
        return "\n".join(lines)


def _when(value: str) -> str:
    from datetime import datetime

    return timestamp(datetime.fromisoformat(value))


def _memo_text(data: dict[str, Any]) -> str:
    if data["memo_error"] is not None:
        return f"(none: {data['memo_error']})"
    value = data["memo"]
    try:
        return encodable(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))
    except (TypeError, ValueError):
        return pprint.pformat(value, width=80)


def _deliveries(data: dict[str, Any]) -> str:
    n, dup, again = data["deliveries"], data["duplicates"], data["redeliveries"]
    return (
        f"{n} {'delivery' if n == 1 else 'deliveries'} ({dup} duplicate{'' if dup == 1 else 's'}, "
        f"{again} redeliver{'y' if again == 1 else 'ies'} or requeue{'' if again == 1 else 's'})"
    )
