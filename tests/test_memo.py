"""Memos are data, never code: a memo is decoded only with a serializer the caller accepts
(a task: its app's accept_content; protect(): its own serializer), a memoized failure is
rebuilt without importing anything a row names, the admin and grousset_inspect only
display, stored error text is redacted, and on MariaDB a memo over max_allowed_packet is
recorded as "result not stored" instead of failing every completion. Real databases."""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from celery_grousset import memo, protect
from celery_grousset.claim import ENC_EXCEPTION, ENC_NOT_STORED, PROTECT_NAME, ClaimRequest, Kind
from celery_grousset.completion import finish_retrying
from celery_grousset.exceptions import (
    ClaimInFlight,
    MemoizedFailure,
    MemoNotAccepted,
    ResultNotStored,
    StoreUnavailable,
)
from celery_grousset.fingerprint import fingerprint
from celery_grousset.models import Outcome
from celery_grousset.store import get_store, reset_stores
from celery_grousset.store.base import Completion
from tests import services
from tests.celeryapp import app

PICKLE = "application/x-python-serialize;binary"


class _Plant:
    """Unpickling it runs ``os.mkdir(path)``: the directory existing is proof code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (os.mkdir, (self.path,))


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "code-ran"


@pytest.fixture
def planted_module(
    tmp_path: Path, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """An importable module whose import creates ``marker`` (a row names it)."""
    name = f"grousset_planted_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(f"import os\nos.mkdir({str(marker)!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def plant(
    alias: str, processor: str, fp: str, result: bytes, encoding: str, status: str = "completed"
) -> None:
    """A settled journal row with this memo, written through the real store."""
    store, token = get_store(alias), uuid.uuid4().hex
    store.claim(ClaimRequest(
        processor_id=processor, fingerprint=fp, task_name="tests.planted", task_id="t-1",
        token=token, worker="w:1", args_repr="()", max_processing_time=60.0,
        expires_after=3600.0, max_takeovers=3,
    ))  # fmt: skip
    assert store.finish(processor, fp, token, Completion(status, result, encoding, ""))


def exception_memo(module: str, qualname: str, message: str = "card declined") -> bytes:
    return json.dumps(
        {"exc_module": module, "exc_type": qualname, "exc_message": message}
    ).encode()


# -- defect 5: a planted pickle memo never runs -------------------------------------------


def test_protect_never_unpickles_a_planted_memo(
    alias: str, processor: str, marker: Path
) -> None:
    # Given a pickle memo planted on the row of protect("report")
    key, ran = "report", []
    fp = fingerprint(PROTECT_NAME, idempotency_key=key)
    plant(alias, processor, fp, pickle.dumps(_Plant(str(marker))), PICKLE)
    # When protect() (JSON, its default serializer) finds it
    with pytest.raises(MemoNotAccepted, match="x-python-serialize") as err:
        protect(key, lambda: ran.append(1), processor_id=processor,
                max_processing_time=30, database=alias)  # fmt: skip
    # Then nothing was unpickled, the effect did not run again, and the error says why
    assert not marker.exists() and ran == []
    assert err.value.content_type == "application/x-python-serialize"
    assert "accept" in str(err.value)


def test_json_task_never_unpickles_a_planted_memo(
    journal: str, temp_task: Any, marker: Path
) -> None:
    ran: list[str] = []

    def send(self: Any, order: str) -> str:
        ran.append(order)
        return f"sent {order}"

    task = temp_task(send, max_processing_time=30)  # the app accepts JSON only
    # Given a pickle memo planted on the row of send("o-1")
    fp, processor = task.grousset_fingerprint(("o-1",), {}), task.grousset_options().processor_id
    plant(journal, processor, fp, pickle.dumps(_Plant(str(marker))), PICKLE)
    # When the task is called eagerly
    result = task.apply(("o-1",))
    # Then the memo is refused, undecoded, and the body did not run
    assert isinstance(result.result, MemoNotAccepted)
    assert not marker.exists() and ran == []


def test_an_app_accepting_pickle_for_messages_never_unpickles_a_json_tasks_memo(
    journal: str, temp_task: Any, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []

    def send(self: Any, order: str) -> str:
        ran.append(order)
        return f"sent {order}"

    task = temp_task(send, max_processing_time=30)
    # Given an app that accepts pickle (for its task messages: result_accept_content
    # unset, so Celery takes accept_content) while its memos are written as JSON
    monkeypatch.setitem(task.app.conf, "accept_content", ["json", "pickle"])
    monkeypatch.setitem(task.app.conf, "result_accept_content", None)
    monkeypatch.setitem(task.app.conf, "result_serializer", "json")
    # and a pickle memo planted on the row of send("o-2") by someone who can write rows
    fp, processor = task.grousset_fingerprint(("o-2",), {}), task.grousset_options().processor_id
    plant(journal, processor, fp, pickle.dumps(_Plant(str(marker))), PICKLE)
    # When the task is called
    result = task.apply(("o-2",))
    # Then the pickle is not decoded (no memo of this task is one), and the body did not run
    assert isinstance(result.result, MemoNotAccepted), result.result
    assert not marker.exists() and ran == []
    assert "result_serializer" in str(result.result)


def test_a_pickle_task_decodes_its_own_pickled_memo(
    journal: str, temp_task: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def make(self: Any, order: str) -> tuple[str, int]:
        return (order, 1)

    task = temp_task(make, max_processing_time=30)
    monkeypatch.setitem(task.app.conf, "accept_content", ["json", "pickle"])
    monkeypatch.setitem(task.app.conf, "result_accept_content", None)
    monkeypatch.setitem(task.app.conf, "result_serializer", "pickle")
    # Given a completed call whose memo is a pickle (the app's result serializer)
    assert task.apply(("o-3",)).result == ("o-3", 1)
    # Then its duplicate decodes it: a tuple, as the first call returned
    assert task.apply(("o-3",)).result == ("o-3", 1)


def test_grousset_inspect_only_displays(alias: str, processor: str, marker: Path) -> None:
    # Given a pickle memo planted in the journal
    fp = uuid.uuid4().hex + uuid.uuid4().hex
    payload = pickle.dumps(_Plant(str(marker)))
    plant(alias, processor, fp, payload, PICKLE)
    # When grousset_inspect shows the row, as text and as JSON
    text, data = io.StringIO(), io.StringIO()
    call_command("grousset_inspect", fp, "--database", alias, stdout=text)
    call_command("grousset_inspect", fp, "--database", alias, "--json", stdout=data)
    # Then nothing was unpickled; what is stored is shown: its content type and size
    assert not marker.exists()
    assert "application/x-python-serialize" in text.getvalue()
    assert f"({len(payload)} bytes)" in text.getvalue()
    story = json.loads(data.getvalue())
    assert story["memo"] is None and story["memo_bytes"] == len(payload)
    assert story["result_encoding"] == PICKLE


def test_admin_detail_page_never_unpickles_nor_imports(
    processor: str, marker: Path, planted_module: str
) -> None:
    from tests.test_admin import URL, client_for, journal_on, make_user

    services.require_database("default")
    with journal_on("default"):
        # Given a planted pickle memo, and a memoized failure naming a planted module
        pickled, failed = (uuid.uuid4().hex * 2 for _ in range(2))
        plant("default", processor, pickled, pickle.dumps(_Plant(str(marker))), PICKLE)
        plant("default", processor, failed, exception_memo(planted_module, "Declined"),
              ENC_EXCEPTION, status="failed")  # fmt: skip
        client = client_for(make_user(superuser=True))
        for fp in (pickled, failed):
            pk = Outcome.objects.using("default").get(fingerprint=fp).pk
            # When the detail page is opened
            resp = client.get(f"{URL}{pk}/change/")
            assert resp.status_code == 200
            html = resp.content.decode()
            # Then it shows what is stored, and no code ran
            assert not marker.exists() and planted_module not in sys.modules
            if fp == pickled:
                assert "application/x-python-serialize memo (" in html
            else:
                assert f"{planted_module}.Declined: card declined" in html


def test_a_memoized_failure_never_imports_the_module_it_names(
    alias: str, processor: str, marker: Path, planted_module: str
) -> None:
    # Given a memoized failure naming a planted module, on protect("pay")'s row
    fp = fingerprint(PROTECT_NAME, idempotency_key="pay")
    plant(alias, processor, fp, exception_memo(planted_module, "Declined"), ENC_EXCEPTION,
          status="failed")  # fmt: skip
    # When protect() replays it
    with pytest.raises(MemoizedFailure) as err:
        protect("pay", lambda: None, processor_id=processor, max_processing_time=30,
                database=alias)  # fmt: skip
    # Then it was not imported; the error carries the stored type name and message
    assert not marker.exists() and planted_module not in sys.modules
    assert err.value.exc_type == f"{planted_module}.Declined"
    assert err.value.exc_message == "card declined"


@pytest.mark.parametrize(
    ("module", "qualname", "expected"),
    [
        ("builtins", "ValueError", ValueError),
        ("builtins", "KeyError", KeyError),
        ("celery_grousset.exceptions", "ResultNotStored", ResultNotStored),
        ("os", "system", MemoizedFailure),
        ("subprocess", "getoutput", MemoizedFailure),
        ("builtins", "__import__", MemoizedFailure),
        ("builtins", "SystemExit", MemoizedFailure),
        ("builtins", "eval", MemoizedFailure),
        ("celery_grousset.exceptions", "annotations", MemoizedFailure),
        ("os.path", "join", MemoizedFailure),
        ("django.core.exceptions", "ImproperlyConfigured", MemoizedFailure),
    ],
)
def test_rebuilt_exceptions_are_builtin_or_the_packages_own(
    module: str, qualname: str, expected: type[BaseException]
) -> None:
    # Given a stored failure naming a class (or a function, or a module path)
    before = set(sys.modules)
    exc = memo.rebuild_exception(exception_memo(module, qualname), "stored error")
    # Then only builtin exceptions and the package's own come back as themselves;
    # anything else is a MemoizedFailure naming it, and nothing was imported
    assert type(exc) is expected
    assert set(sys.modules) == before
    if expected is MemoizedFailure:
        assert qualname in str(exc) and "card declined" in str(exc)


@pytest.mark.parametrize(
    "raised",
    [KeyError("sku-7"), ValueError("card declined"), LookupError("a", 2), KeyError(),
     KeyError(5), StopIteration(3), ValueError("bad", 2.5, None, True),
     FileNotFoundError(2, "No such file or directory", "/x")],
)  # fmt: skip
def test_a_memoized_builtin_exception_comes_back_as_it_was_raised(raised: Exception) -> None:
    # Given a builtin failure memoized (KeyError's str() is the repr of its key)
    result, encoding, error = memo.encode_exception(raised)
    # When a duplicate rebuilds it
    with pytest.raises(type(raised)) as err:
        memo.decode(result, encoding, error, "f" * 64)
    # Then it has the message it was raised with: a KeyError's key not quoted twice
    assert str(err.value) == str(raised), (str(err.value), str(raised))
    # And its arguments: KeyError(5).args[0] is 5 (not "5"), an OSError keeps its errno
    assert err.value.args == raised.args
    assert getattr(err.value, "errno", None) == getattr(raised, "errno", None)


def test_a_memoized_exceptions_secret_arguments_keep_it_to_its_message() -> None:
    """A builtin's arguments are stored only when nothing of its text is secret: a
    secret argument's value (a card number passed as an int), or a secret split over
    two arguments (``ValueError("password=", "hunter2")``), leaves the redacted message."""
    for raised in [ValueError("declined", 4242424242424242, 7), ValueError("password=", "hunter2")]:
        token = memo.SECRETS.set(lambda: ["4242424242424242"])
        try:
            result, encoding, error = memo.encode_exception(raised)
        finally:
            memo.SECRETS.reset(token)
        assert "exc_args" not in json.loads(result), result
        with pytest.raises(ValueError) as err:
            memo.decode(result, encoding, error, "f" * 64)
        assert len(err.value.args) == 1 and "***" in err.value.args[0]
    assert b"4242424242424242" not in memo.encode_exception(ValueError(4242424242424242))[0]


def test_an_app_that_accepts_pickle_still_gets_its_pickled_memo(
    journal: str, temp_task: Any, alias: str, processor: str
) -> None:
    def load(self: Any, n: int) -> dict[str, Any]:
        return {"n": n, "when": {1, 2}}  # a set: only pickle keeps it

    task = temp_task(load, max_processing_time=30)
    saved = app.conf.accept_content, app.conf.result_serializer
    app.conf.accept_content, app.conf.result_serializer = ["json", "pickle"], "pickle"
    try:
        # Given an app that stores its results with pickle (and accepts pickle) / When a
        # task runs twice
        first, second = task.apply((3,)).get(), task.apply((3,)).get()
    finally:
        app.conf.accept_content, app.conf.result_serializer = saved
    # Then the duplicate got the memo, stored as the result backend stores the result
    # (result_serializer, not the task's message serializer) and decoded with pickle
    assert first == second == {"n": 3, "when": {1, 2}}
    # And protect(serializer="pickle") accepts its own serializer
    key = f"p-{uuid.uuid4().hex[:6]}"
    values = [protect(key, lambda: {"s": {1}}, serializer="pickle", processor_id=processor,
                      max_processing_time=30, database=alias) for _ in range(2)]  # fmt: skip
    assert values == [{"s": {1}}, {"s": {1}}]


# -- defect 13 (second half): stored error text is redacted --------------------------------


@pytest.mark.parametrize("on_failure", ["release", "memoize"])
def test_stored_error_text_is_redacted(journal: str, temp_task: Any, on_failure: str) -> None:
    def leak(self: Any) -> None:
        raise ValueError(
            "dsn postgres://u:s3cret@h/db failed; Authorization: Bearer abc.def.ghi"
        )

    task = temp_task(leak, max_processing_time=30, on_failure=on_failure)
    # When the task fails
    first = task.apply()
    assert isinstance(first.result, ValueError)
    # Then what the journal stores holds neither the password nor the token
    rec = Outcome.objects.using(journal).get(task_name=task.name)
    stored = rec.error + (bytes(rec.result).decode() if rec.result is not None else "")
    assert rec.error.startswith("ValueError: dsn postgres://u:")
    assert "s3cret" not in stored and "abc.def.ghi" not in stored
    if on_failure == "memoize":  # and a duplicate replays the redacted message
        replay = task.apply().result
        assert isinstance(replay, ValueError) and "s3cret" not in str(replay)


def test_stored_error_text_is_redacted_for_a_bearer_value(journal: str, temp_task: Any) -> None:
    def leak(self: Any) -> None:
        raise ValueError("dsn postgres://u:s3cret@h/db token=Bearer abc.def.ghi")

    task = temp_task(leak, max_processing_time=30)
    task.apply()
    error = Outcome.objects.using(journal).get(task_name=task.name).error
    assert "s3cret" not in error
    assert "abc.def.ghi" not in error


@pytest.mark.parametrize("on_failure", ["release", "memoize"])
def test_an_error_that_quotes_a_secret_argument_is_stored_without_it(
    journal: str, temp_task: Any, on_failure: str
) -> None:
    def authorize(self: Any, customer: str, card_number: str, options: dict[str, Any]) -> None:
        raise RuntimeError(f"PSP declined {customer}: card {card_number}, "
                           f"cvv {options['cvv']} (raw: {card_number}, "
                           f"ref {options['ref']['token'].upper()})")  # fmt: skip

    task = temp_task(authorize, max_processing_time=30, on_failure=on_failure)
    call = ("dave-7f1", "4242424242424242", {"cvv": "9731", "ref": {"token": "tk-ab12"}})
    # When a task fails with an error that quotes its sensitive arguments (a positional
    # card number, bound to its name; a cvv in a dict)
    assert isinstance(task.apply(call).result, RuntimeError)
    # Then the journal stores neither value, in the error or in the memo; the rest stays
    rec = Outcome.objects.using(journal).get(task_name=task.name)
    stored = rec.error + (bytes(rec.result).decode() if rec.result is not None else "")
    assert "4242424242424242" not in stored and "9731" not in stored, stored
    assert "TK-AB12" not in stored, stored  # quoted in another case
    assert rec.error == "RuntimeError: PSP declined dave-7f1: card ***, cvv *** (raw: ***, ref ***)"
    if on_failure == "memoize":  # and a duplicate is replayed the scrubbed message
        replay = task.apply(call).result
        assert str(replay) == "PSP declined dave-7f1: card ***, cvv *** (raw: ***, ref ***)"


# -- defect 10: MariaDB's max_allowed_packet ------------------------------------------------


@pytest.fixture
def packet_limit() -> Iterator[int]:
    """MariaDB's max_allowed_packet for new connections (lowered to 1 MiB when huge)."""
    import MySQLdb
    from django.db import connections

    services.require_database("mysql")
    settings = connections.settings["mysql"]
    root = MySQLdb.connect(host=str(settings["HOST"]), port=int(str(settings["PORT"])),
                           user="root", passwd="")  # fmt: skip
    cur = root.cursor()
    cur.execute("SELECT @@global.max_allowed_packet")
    original = int(cur.fetchone()[0])
    lowered = original >= 64 * 1024 * 1024
    if lowered:
        cur.execute("SET GLOBAL max_allowed_packet = 1048576")
    reset_stores()  # the store's next connection reads the limit
    try:
        yield 1048576 if lowered else original
    finally:
        if lowered:
            cur.execute(f"SET GLOBAL max_allowed_packet = {original}")
        root.close()
        reset_stores()


@pytest.mark.serial  # SET GLOBAL max_allowed_packet: every MariaDB client
@pytest.mark.parametrize("transactional", [False, True])
def test_memo_over_max_allowed_packet_is_not_stored(
    packet_limit: int, processor: str, transactional: bool
) -> None:
    runs: list[int] = []

    def export() -> str:
        runs.append(1)
        return "x" * (packet_limit + 1024)

    def call() -> Any:
        return protect("export", export, processor_id=processor, max_processing_time=4,
                       max_result_bytes=4 * packet_limit, transactional=transactional,
                       database="mysql")  # fmt: skip

    # Given a memo larger than the server's max_allowed_packet (max_result_bytes raised)
    # When the call runs: it returns its value, and the outcome is recorded without it
    assert len(call()) == packet_limit + 1024
    rec = Outcome.objects.using("mysql").get(processor_id=processor)
    assert (rec.status, rec.result_encoding, rec.result) == ("completed", ENC_NOT_STORED, None)
    assert "max_allowed_packet" in rec.error
    # And a duplicate is told the result was not stored; the effect ran once
    with pytest.raises(ResultNotStored, match="max_allowed_packet"):
        call()
    assert runs == [1]


@pytest.mark.serial  # SET GLOBAL max_allowed_packet: every MariaDB client
def test_memo_just_under_max_allowed_packet_is_stored_and_read_back(
    packet_limit: int, processor: str
) -> None:
    from celery_grousset.store.mysql import PACKET_MARGIN

    store = get_store("mysql")
    fits = b"y" * (packet_limit - PACKET_MARGIN - 4096)
    quoted = b'"' * (packet_limit // 2)  # each quote is escaped: twice the bytes on the wire
    for raw, stored in ((fits, True), (quoted, False)):
        fp, token = uuid.uuid4().hex * 2, uuid.uuid4().hex
        request = ClaimRequest(
            processor_id=processor, fingerprint=fp, task_name="tests.big", task_id="t-big",
            token=token, worker="w:1", args_repr="()", max_processing_time=60.0,
            expires_after=3600.0, max_takeovers=3,
        )  # fmt: skip
        store.claim(request)
        assert store.finish(processor, fp, token, Completion("completed", raw, "x/y;binary"))
        again = store.claim(ClaimRequest(**{**_fields(request), "token": uuid.uuid4().hex}))
        assert again.kind is Kind.COMPLETED
        assert (again.result == raw) is stored
        assert (again.result_encoding == ENC_NOT_STORED) is not stored


def _fields(req: ClaimRequest) -> dict[str, Any]:
    return {f: getattr(req, f) for f in ClaimRequest.__dataclass_fields__}


# -- a memo the database refuses for its data ------------------------------------------------


def test_a_memo_the_database_refuses_is_recorded_as_not_stored(
    alias: str, processor: str
) -> None:
    if alias == "default":
        pytest.skip("SQLite does not enforce column lengths")
    store, fp, token = get_store(alias), uuid.uuid4().hex * 2, uuid.uuid4().hex
    request = ClaimRequest(
        processor_id=processor, fingerprint=fp, task_name="tests.odd", task_id="t-odd",
        token=token, worker="w:1", args_repr="()", max_processing_time=2.0,
        expires_after=3600.0, max_takeovers=3,
    )  # fmt: skip
    store.claim(request)
    # Given a completion whose result_encoding the column cannot hold (a data error)
    refused = Completion("completed", b"1", "x" * 100 + ";utf-8")
    # When it is written / Then it lands as "result not stored", never StoreUnavailable
    try:
        assert finish_retrying(store, request, refused)
    except StoreUnavailable as exc:  # the old behaviour: retried as an outage
        pytest.fail(f"a data error was treated as an outage: {exc}")
    rec = Outcome.objects.using(alias).get(processor_id=processor, fingerprint=fp)
    assert (rec.status, rec.result_encoding) == ("completed", ENC_NOT_STORED)
    assert rec.error.startswith("result not stored: the journal refused it")


def test_a_given_up_record_names_the_command_that_releases_it() -> None:
    from celery_grousset.claim import ENC_GAVE_UP, gave_up_message
    from celery_grousset.exceptions import GaveUp

    fp = uuid.uuid4().hex * 2
    # When a duplicate meets a record given up after max_takeovers
    with pytest.raises(GaveUp) as gave_up:
        memo.decode(None, ENC_GAVE_UP, gave_up_message(3), fp)
    # Then the error names the command with this record's fingerprint, ready to run
    assert f"`manage.py grousset_release {fp} --force`" in str(gave_up.value)
    # And the exception's text does not name its own type again ("GaveUp: GaveUp: …" in
    # a traceback); the record's error keeps it, as every memoized failure's does
    assert str(gave_up.value).startswith("the claim was taken over 3 times"), gave_up.value


@pytest.mark.parametrize(
    "value",
    [{"__type__": "custom", "__value__": 1}, [{"x": {"__type__": "bytes", "__value__": "eA=="}}]],
)
def test_a_result_shaped_like_kombus_marker_is_not_stored_as_another_value(
    journal: str, temp_task: Any, value: Any
) -> None:
    """Such a memo was stored, then every duplicate raised kombu's DecodeError ('Unsupported
    type') or got bytes back for a dict: arguments of that shape were refused already."""
    runs: list[int] = []

    def body(self: Any) -> Any:
        runs.append(1)
        return value

    task = temp_task(body, max_processing_time=30)
    # Given a body that returns a dict with exactly the keys of kombu's JSON marker
    assert task.apply().get() == value
    # Then the outcome is recorded without the memo, saying why
    rec = Outcome.objects.using(journal).get(task_name=task.name)
    assert (rec.status, rec.result_encoding, rec.result) == ("completed", ENC_NOT_STORED, None)
    assert '"__type__" and "__value__"' in rec.error
    # And a duplicate is told so, not handed another value; the body ran once
    with pytest.raises(ResultNotStored, match="__type__"):
        task.apply().get()
    assert runs == [1]


def test_a_failure_whose_str_raises_is_still_memoized(journal: str, temp_task: Any) -> None:
    """on_failure="memoize" fell back to releasing the claim when the exception could not
    be written as text: a duplicate ran the (partly done) effect again."""
    runs: list[int] = []

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    def body(self: Any) -> None:
        runs.append(1)
        raise Unprintable("declined")

    task = temp_task(body, max_processing_time=30, on_failure="memoize")
    # Given a memoizing task that fails with an exception whose str() raises
    assert task.apply().failed()
    # Then the failure is memoized, and a duplicate gets it back instead of a second run
    rec = Outcome.objects.using(journal).get(task_name=task.name)
    assert (rec.status, rec.result_encoding) == ("failed", ENC_EXCEPTION), rec.error
    replay = task.apply().result
    assert isinstance(replay, MemoizedFailure) and "str() of the Unprintable" in str(replay)
    assert runs == [1]


def test_the_journals_trouble_in_a_body_is_never_memoized(journal: str, temp_task: Any) -> None:
    """A nested guarded call's StoreUnavailable (or ClaimInFlight) raised out of a
    memoizing body was replayed to every duplicate for the retention window: the call
    never ran again once the journal was back."""
    runs: list[int] = []

    def body(self: Any) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise StoreUnavailable("the journal of a nested call is away")
        return "done"

    task = temp_task(body, max_processing_time=30, on_failure="memoize")
    # Given a memoizing task whose first run fails with the journal's trouble
    assert isinstance(task.apply().result, StoreUnavailable)
    # Then its claim is released, not memoized: the next delivery runs it
    assert task.apply().get() == "done" and runs == [1, 1]
    assert memo.never_memoized(ClaimInFlight("k")) and not memo.never_memoized(ValueError())


def test_a_soft_time_limit_while_the_value_is_encoded_does_not_blame_the_value() -> None:
    """The soft time limit fired while the return value was encoded (a slow ``__json__``):
    the memo said "json cannot encode Slow: SoftTimeLimitExceeded()", and every duplicate
    raised ResultNotStored for a value that encodes (a review)."""
    from billiard.exceptions import SoftTimeLimitExceeded

    from celery_grousset import memo

    class Slow:
        calls = 0

        def __json__(self) -> dict[str, int]:
            Slow.calls += 1
            if Slow.calls == 1:  # the limit fires once, mid-encoding
                raise SoftTimeLimitExceeded()
            return {"n": 1}

    # When the limit fires while the value is encoded
    raw, encoding, error = memo.encode(Slow(), serializer="json", memoize=True, max_bytes=1000)
    # Then the value is encoded once more and stored
    assert (error, raw) == ("", b'{"n": 1}'), error
    assert encoding.startswith("application/json")
