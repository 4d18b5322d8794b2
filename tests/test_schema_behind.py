"""A journal database whose celery_grousset migrations are behind the installed package
(an upgrade deployed before its ``migrate``): claims fail closed naming ``migrate``, and
``check --database`` says which migrations are missing."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from celery_grousset.claim import ClaimRequest
from celery_grousset.exceptions import StoreUnavailable
from celery_grousset.store import get_store, reset_stores
from tests import services
from tests.test_checks import database

BEHIND = "0005_outcome_payload_hash"  # before 0006 added `duplicates` and `delivery`


def _scratch_settings(vendor: str, tmp_path: Path) -> dict[str, object]:
    if vendor == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "behind.sqlite3")}
    base = "postgresql" if vendor == "postgresql" else "mysql"
    services.require_database(base)
    name = f"grousset_behind_{uuid.uuid4().hex[:8]}"
    settings = {**connections.settings[base], "NAME": name, "TEST": {"NAME": name}}
    recreate = services._recreate_postgresql if vendor == "postgresql" else services._recreate_mysql
    recreate(settings)
    return settings


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def behind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A journal database migrated up to BEHIND only, GROUSSET's journal."""
    settings = _scratch_settings(request.param, tmp_path)
    alias = f"behind_{request.param}"
    with database(alias, **settings), override_settings(GROUSSET={"DATABASE": alias}):
        try:
            call_command("migrate", "celery_grousset", BEHIND, database=alias, verbosity=0)
            reset_stores()
            yield alias
        finally:
            reset_stores()
            if request.param != "sqlite":
                connections[alias].close()
                services.drop_database(request.param, str(settings["NAME"]))


def _request() -> ClaimRequest:
    return ClaimRequest(
        processor_id="p", fingerprint=uuid.uuid4().hex * 2, task_name="t", task_id="i",
        token=uuid.uuid4().hex, worker="w", args_repr="", max_processing_time=60.0,
        expires_after=3600.0, max_takeovers=3,
    )  # fmt: skip


def test_a_claim_on_a_journal_behind_its_migrations_fails_closed_naming_migrate(
    behind: str,
) -> None:
    # When a claim is made on a journal database behind its migrations
    with pytest.raises(StoreUnavailable) as error:
        get_store(behind).claim(_request())
    # Then it fails closed, saying why and naming the command that fixes it
    assert "migrations are not all applied" in str(error.value)
    assert f"migrate celery_grousset --database {behind}" in str(error.value)
    # And the log line's error field keeps the fix: the driver's statement context (its
    # LINE 1 and caret) is not quoted, the first line of its error is
    from celery_grousset.events import error_text

    assert "LINE 1" not in str(error.value) and "migrate celery_grousset" in error_text(error.value)


def test_check_database_names_the_missing_migrations_until_migrate(behind: str) -> None:
    def w009() -> list[checks.CheckMessage]:
        found = checks.run_checks(databases=[behind], tags=[checks.Tags.database])
        return [m for m in found if m.id == "celery_grousset.W009"]

    # When `check --database` runs on the journal database behind its migrations
    [warning] = w009()
    # Then it names the migrations missing and the command
    assert "0006_outcome_duplicates_delivery" in warning.msg and BEHIND not in warning.msg
    assert f"migrate celery_grousset --database {behind}" in (warning.hint or "")
    # And once migrated, the warning is gone and a claim goes through
    call_command("migrate", "celery_grousset", database=behind, verbosity=0)
    assert w009() == []
    get_store(behind).claim(_request())


@pytest.mark.parametrize("argv", [["grousset_stats"], ["grousset_inspect", "abcdef12"]])
def test_commands_on_a_journal_behind_its_migrations_name_them(
    behind: str, argv: list[str]
) -> None:
    from django.core.management.base import CommandError

    # When an operations command reads the journal database behind its migrations
    with pytest.raises(CommandError) as error:
        call_command(*argv, database=behind, stdout=io.StringIO())
    # Then it names the missing migrations and the command, not only the driver's text
    assert "0006_outcome_duplicates_delivery" in str(error.value)
    assert f"migrate celery_grousset --database {behind}" in str(error.value)
