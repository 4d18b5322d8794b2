"""The package's log lines parse as logfmt: ``event key=value …``, a value quoted when
it holds a space, a quote, ``=`` or a character that does not print; the record keeps
the raw values for JSON formatters."""

from __future__ import annotations

import json
import logging
import re

import pytest

from celery_grousset import events

#: a logfmt field: key=value, the value plain or a quoted (JSON) string
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')


def test_a_value_with_a_space_is_quoted_and_the_record_keeps_it_raw(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given fields with spaces, quotes, '=' and a newline, and plain ones
    values = {"task": "shop.tasks.charge", "action": "requeued with its outcome",
              "reason": 'bad "input" a=b', "task_id": "t\\n1\nx", "n": 3, "empty": ""}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="celery_grousset"):
        events.emit(logging.INFO, "grousset.test_event", values, note="free text to the end")
    [record] = [r for r in caplog.records if r.getMessage().startswith("grousset.test_event")]
    line = record.getMessage()
    # Then a logfmt reader splits the line into the same fields
    head, _, note = line.partition(" note=")
    parsed = {k: json.loads(v) if v.startswith('"') else v for k, v in FIELD.findall(head)}
    assert parsed == {k: str(v) for k, v in values.items()}
    assert note == "free text to the end" and "\n" not in line
    # ... plain values stay unquoted, and the record's fields are the raw values
    assert "task=shop.tasks.charge " in line and " n=3 " in line
    assert record.grousset_action == "requeued with its outcome"  # type: ignore[attr-defined]
    assert record.grousset["reason"] == 'bad "input" a=b'  # type: ignore[attr-defined]


def test_a_value_with_a_lone_surrogate_is_a_line_utf8_can_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task id or key holding a lone surrogate was written into the line as it is: a
    UTF-8 log file's handler failed on it ("--- Logging error ---") and the line was
    lost (a review)."""
    with caplog.at_level(logging.INFO, logger="celery_grousset"):
        events.emit(logging.INFO, "grousset.test_event", {"task_id": "t-\ud800-1"})
    [record] = [r for r in caplog.records if r.getMessage().startswith("grousset.test_event")]
    line = record.getMessage()
    # Then the line encodes, the surrogate written as its escape
    assert line.encode("utf-8") and "t-\\ud800-1" in line, line


def test_a_lost_claim_that_never_committed_is_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    from celery_grousset.claim import ClaimRequest

    req = ClaimRequest(
        processor_id="p", fingerprint="f" * 64, task_name="t", task_id="id", token="tok",
        worker="w", args_repr="", max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="celery_grousset"):
        # When a delivery settles a lost claim that had not committed (every outage's),
        # then one that had
        events.lost_claim(req, False)
        events.lost_claim(req, True)
    levels = [r.levelno for r in caplog.records if r.getMessage().startswith("grousset.lost_")]
    # Then only the one that had committed (and was released) is a warning
    assert levels == [logging.INFO, logging.WARNING]


def test_a_journal_error_is_logged_redacted(caplog: pytest.LogCaptureFixture) -> None:
    from celery_grousset.claim import ClaimRequest
    from celery_grousset.exceptions import StoreUnavailable

    req = ClaimRequest(
        processor_id="p", fingerprint="f" * 64, task_name="t", task_id="id", token="tok",
        worker="w", args_repr="", max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
    )  # fmt: skip
    # Given a driver's error text that quotes a DSN's password and a bearer token
    exc = StoreUnavailable("could not connect to postgres://app:DsnHunter2@db:5432/j; "
                           "proxy said: Authorization: Bearer TokHunter2")  # fmt: skip
    with caplog.at_level(logging.INFO, logger="celery_grousset"):
        # When the journal's trouble is logged
        events.store_error(req, "claim", exc)
    [record] = [r for r in caplog.records if r.getMessage().startswith("grousset.store_unava")]
    # Then the line and the record's fields say what failed, without the secrets
    shown = record.getMessage() + repr(record.grousset)  # type: ignore[attr-defined]
    assert "DsnHunter2" not in shown and "TokHunter2" not in shown, shown
    assert "could not connect to postgres://app:***@db" in shown


def test_no_line_about_a_call_formats_its_fields_by_hand() -> None:
    """A task id, a carried fingerprint or an outbox error comes from whoever published
    the call: formatted with %s, a newline in it forged a whole log line (a fake
    grousset.fenced_out). Every such line goes through events.emit, which quotes it."""
    from pathlib import Path

    import celery_grousset

    root = Path(celery_grousset.__file__).parent
    by_hand = re.compile(r"\b(task_id|task|fingerprint|carried|error|processor)=%[sr]")
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in sorted(root.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if by_hand.search(line)
    ]
    assert found == []


def test_the_bypass_line_quotes_a_forged_task_id(caplog: pytest.LogCaptureFixture) -> None:
    # Given a task id that carries a line of its own
    forged = "t-1\ngrousset.fenced_out fingerprint=forged task=evil"
    # When the BYPASS line names it
    with caplog.at_level(logging.WARNING, logger="celery_grousset"):
        events.bypassed("shop.tasks.charge", forged)
    [line] = [r.getMessage() for r in caplog.records if "grousset.BYPASS" in r.getMessage()]
    # Then it is one line, the id quoted
    assert "\n" not in line and f"task_id={json.dumps(forged)}" in line


def test_each_event_has_its_own_message_template(caplog: pytest.LogCaptureFixture) -> None:
    """Sentry (and other tools that group log records by their unformatted message)
    filed every event of the package under one issue, "%s %s"."""
    with caplog.at_level(logging.INFO, logger="celery_grousset"):
        events.emit(logging.ERROR, "grousset.fenced_out", {"task": "a", "fence": 2})
        events.emit(logging.ERROR, "grousset.gave_up", {"task": "a", "takeovers": 3})
    templates = [r.msg for r in caplog.records if r.name == "celery_grousset"]
    assert templates == ["grousset.fenced_out %s", "grousset.gave_up %s"]
    assert caplog.records[-1].getMessage() == "grousset.gave_up task=a takeovers=3"
