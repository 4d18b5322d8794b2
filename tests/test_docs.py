"""The documentation stays true: the settings table matches the code, every include
resolves, every Python sample is a file that is imported and run here.

The project-shaped samples (``docs/snippets/mysite``, ``docs/snippets/shop``) are
imported in a subprocess (they create a Celery app of their own) and followed
end to end by ``tests/test_getting_started.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from celery_grousset.conf import DEFAULTS
from celery_grousset.exceptions import PayloadMismatch
from celery_grousset.models import Outcome
from tests import services

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
INCLUDE = re.compile(r'^\s*-{1,}8<-{1,}\s+"([^"]+)"\s*$', re.MULTILINE)
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
#: a sample written out in a page (readable as plain Markdown), and the file it copies
INLINED = re.compile(r"^<!-- snippet: (\S+) -->\n```(\w*)[^\n]*\n(.*?)^```\s*$",
                     re.MULTILINE | re.DOTALL)  # fmt: skip
#: samples of other libraries: compiled, not imported (they are not dependencies)
COMPILE_ONLY = {"migrating_before_once.py", "migrating_before_singleton.py"}
#: a settings fragment, executed over a minimal settings namespace
FRAGMENTS = {"settings.py"}
#: a package-shaped sample project, imported in a subprocess
PROJECT_PACKAGES = ("mysite", "shop")


def pages() -> list[Path]:
    return sorted(DOCS.glob("**/*.md"))


def load_snippet(name: str) -> ModuleType:
    """Import ``docs/snippets/<name>.py`` as module ``grousset_docs_<name>``."""
    module_name = f"grousset_docs_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, SNIPPETS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def journal_db() -> Iterator[str]:
    services.require_database("default")
    with override_settings(GROUSSET={**settings.GROUSSET, "DATABASE": "default"}):
        yield "default"


# -- the configuration table ------------------------------------------------------------


def settings_table() -> list[list[str]]:
    text = (DOCS / "configuration.md").read_text()
    header = "| setting | task option | default | meaning |"
    assert header in text, "docs/configuration.md lost its settings table"
    rows = []
    for line in text[text.index(header):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_configuration_table_lists_exactly_the_defaults() -> None:
    from celery_grousset.task import _OPTION_NAMES

    # Given the table in docs/configuration.md
    rows = settings_table()
    documented: dict[str, Any] = {}
    options: dict[str, str] = {}
    for setting, option, default, meaning in rows:
        name = setting.strip("`")
        assert name not in documented, f"{name} is listed twice"
        match = re.match(r"`([^`]+)`", default)
        assert match, f"{name}: the default must be a literal in backticks, got {default!r}"
        documented[name] = ast.literal_eval(match.group(1))
        options[name] = option.strip("`")
        assert meaning, f"{name} has no meaning"
    # Then it lists every key of DEFAULTS, no other, with the same default
    assert sorted(documented) == sorted(DEFAULTS)
    for name, value in DEFAULTS.items():
        assert documented[name] == value, f"{name}: docs say {documented[name]!r}, code {value!r}"
        assert type(documented[name]) is type(value), name
    # And the task option column names the task attribute wherever one exists
    for name in DEFAULTS:
        expected = name.lower() if name.lower() in _OPTION_NAMES else "—"
        assert options[name] == expected, f"{name}: task option {options[name]!r}"
    assert set(_OPTION_NAMES) <= {name.lower() for name in DEFAULTS}


def test_configuration_states_the_precedence_of_the_code() -> None:
    from celery_grousset import conf

    # Given the precedence the code documents / Then the page lists the same levels in order
    code_order = " ".join((conf.__doc__ or "").split())
    assert "per call > task (decorator kwarg or class attribute) > worker flag > " in code_order
    assert "worker flag > ``settings.GROUSSET`` > built-in default" in code_order
    text = (DOCS / "configuration.md").read_text()
    section = text[text.index("## Precedence"):]
    levels = ["**per call**", "**the task**", "**the worker flag**", "**`settings.GROUSSET`**",
              "**the built-in default**"]  # fmt: skip
    positions = [section.index(level) for level in levels]
    assert positions == sorted(positions)


# -- includes and samples ----------------------------------------------------------------


def inliner() -> ModuleType:
    """``scripts/inline_snippets.py``: what a page shows of a snippet file, in one place."""
    spec = importlib.util.spec_from_file_location("grousset_inline_snippets",
                                                  ROOT / "scripts" / "inline_snippets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_page_includes_a_file_it_does_not_show() -> None:
    # Given every page / Then none uses an include (--8<--): GitHub and PyPI show the
    # page's Markdown as it is, where an include is one bare line
    for page in pages():
        assert not INCLUDE.findall(page.read_text()), (
            f"{page.name}: an include; run `python scripts/inline_snippets.py`"
        )


def test_every_python_sample_is_a_written_out_file() -> None:
    # Given every fenced code block of the docs
    for page in pages():
        text = page.read_text()
        inlined = {body for _, lang, body in INLINED.findall(text) if lang == "python"}
        for lang, body in FENCE.findall(text):
            # Then Python samples are files that this module tests, written out
            assert lang != "python" or body in inlined, (
                f"{page.name}: a Python sample of no file; put it in docs/snippets/, then "
                f"`<!-- snippet: docs/snippets/<file> -->` above its block:\n{body}"
            )


def test_inlined_samples_equal_their_files() -> None:
    module, seen = inliner(), 0
    for page in pages():
        text = page.read_text()
        for target, _, body in INLINED.findall(text):
            # Given a sample written out in a page under <!-- snippet: path[:region] -->
            path, _, region = target.partition(":")
            # Then its file exists, with the region marked in it
            source = ROOT / path
            assert source.is_file(), f"{page.name}: {path} does not exist"
            if region:
                file_text = source.read_text()
                assert f"[start:{region}]" in file_text and f"[end:{region}]" in file_text, (
                    f"{page.name}: no region {region!r} in {path}"
                )
            # And it is, character for character, that file (region) this module tests
            assert body == module.snippet_text(target), (
                f"{page.name}: the block under <!-- snippet: {target} --> differs from the "
                "file; run `python scripts/inline_snippets.py`"
            )
            seen += 1
        assert module.inlined(text) == text  # what the script would write: nothing
    # And Getting started's samples are all there
    assert len(INLINED.findall((DOCS / "getting-started.md").read_text())) == 9
    assert seen >= 25


def test_every_snippet_is_used_by_a_page() -> None:
    used = {t.partition(":")[0] for p in pages() for t, _, _ in INLINED.findall(p.read_text())}
    for path in SNIPPETS.glob("**/*.py"):
        if not path.read_text().strip():
            continue  # an empty package marker
        # Then each snippet file is shown somewhere
        assert str(path.relative_to(ROOT)) in used, f"{path} is not included by any page"


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in pages():
        assert f": {page.relative_to(DOCS)}" in nav, f"{page.name} is missing from the nav"
    assert ": performance.md" in nav


def test_each_case_has_a_sequence_diagram() -> None:
    text = (DOCS / "how-it-works.md").read_text()
    diagrams = [body for lang, body in FENCE.findall(text) if lang == "mermaid"]
    # Then first run, duplicate, in flight, takeover, zombie and store down each have one
    assert len(diagrams) >= 6
    assert all(body.lstrip().startswith("sequenceDiagram") for body in diagrams)
    for heading in ("## First run", "## Duplicate", "## In flight", "## Crashed worker",
                    "## Zombie", "## Store down"):  # fmt: skip
        assert heading in text


def test_log_events_and_check_ids_are_documented() -> None:
    from celery_grousset import events

    operations = (DOCS / "operations.md").read_text()
    configuration = (DOCS / "configuration.md").read_text()
    # Given the event names the code logs and the check ids it reports
    package = Path(events.__file__).parent
    code = [path.read_text() for path in package.glob("**/*.py")]
    logged = {name for text in code
              for name in re.findall(r'"(grousset\.[A-Za-z_]+)[ "]', text)}  # fmt: skip
    ids = {name for text in code for name in re.findall(r"celery_grousset\.[EW]\d{3}", text)}
    # Then every event is in the operations page, and the checks' table lists exactly the
    # check ids the code has
    assert len(logged) >= 9 and len(ids) >= 9
    for name in logged:
        assert f"`{name}`" in operations, f"{name} is not documented in operations.md"
    table = set(re.findall(r"^\| `(celery_grousset\.[EW]\d{3})` \|", configuration, re.M))
    assert table == ids, f"in the code only: {ids - table}; in the table only: {table - ids}"


def test_the_claims_metric_lists_exactly_the_outcome_labels_it_records() -> None:
    from celery_grousset.metrics import CLAIM_LABELS

    # Given the row of grousset_claims_total in the operations page
    text = (DOCS / "operations.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `grousset_claims_total`"))
    named = set(re.findall(r"`([a-z_]+)`", row.split("|")[4]))
    # Then it names every outcome label the code records, and no other
    assert named == set(CLAIM_LABELS), named ^ set(CLAIM_LABELS)


def test_snippet_modules_compile() -> None:
    for path in SNIPPETS.glob("**/*.py"):
        # Then every sample is valid Python
        compile(path.read_text(), str(path), "exec")
    assert (SNIPPETS / "migrating_before_once.py").name in COMPILE_ONLY


def test_readme_sample_names_what_it_uses(tmp_path: Path) -> None:
    # Given the README's Python sample (the first code a new user copies)
    blocks = [body for lang, body in FENCE.findall((ROOT / "README.md").read_text())
              if lang == "python"]  # fmt: skip
    assert blocks, "README.md lost its Python sample"
    for number, body in enumerate(blocks):
        sample = tmp_path / f"readme_{number}.py"
        sample.write_text(body)
        # Then pyflakes' rules find no undefined name in it (what it uses is imported)
        found = subprocess.run(
            [str(Path(sys.executable).parent / "ruff"), "check", "--no-cache", "--isolated",
             "--select", "F", str(sample)],
            capture_output=True, text=True, check=False)  # fmt: skip
        assert found.returncode == 0, found.stdout + found.stderr
        # And no task in it turns acks_late on by itself (the settings comment does, for all:
        # a task that sets it alone leaves its neighbours with warning W002)
        assert "acks_late=True" not in body


def test_settings_fragment_executes_over_a_new_project() -> None:
    from celery_grousset.conf import GroussetSettings

    # Given the settings of a new project
    namespace: dict[str, Any] = {"INSTALLED_APPS": ["django.contrib.admin"]}
    # When the fragment is executed after them
    exec(compile((SNIPPETS / "settings.py").read_text(), "settings.py", "exec"), namespace)
    # Then it adds the apps, valid GROUSSET keys and late acknowledgement
    assert namespace["INSTALLED_APPS"][-2:] == ["celery_grousset", "shop"]
    assert set(namespace["GROUSSET"]) <= set(DEFAULTS)
    assert namespace["CELERY_TASK_ACKS_LATE"] and namespace["CELERY_TASK_REJECT_ON_WORKER_LOST"]
    with override_settings(GROUSSET=namespace["GROUSSET"]):
        assert GroussetSettings().PROCESSOR_ID == "mysite"


def test_standalone_snippets_import() -> None:
    names = sorted(
        p.stem for p in SNIPPETS.glob("*.py") if p.name not in COMPILE_ONLY | FRAGMENTS
    )
    # When every standalone sample is imported / Then it loads
    modules = [load_snippet(name) for name in names]
    assert len(modules) >= 6


def test_project_snippets_import_in_a_fresh_process(tmp_path: Path) -> None:
    # Given a settings module that installs the sample app
    (tmp_path / "docs_settings.py").write_text(
        "from tests.settings import *  # noqa\nINSTALLED_APPS = [*INSTALLED_APPS, 'shop']\n"
    )
    code = (
        "import django; django.setup()\n"
        "import mysite, shop.models, shop.tasks, shop.test_tasks\n"
        "import shop.test_worker, shop.test_container_worker\n"
        "from celery_grousset.task import GroussetTaskMixin\n"
        "app = mysite.celery_app\n"
        "assert app.main == 'mysite'\n"
        "assert isinstance(shop.tasks.send_receipt, GroussetTaskMixin)\n"
        "assert shop.tasks.book.transactional is True\n"
        "flags = [o for o in app.user_options['worker']]\n"
        "assert flags, 'install(app) registered no worker options'\n"
        "print('ok', len(flags))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "docs_settings",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SNIPPETS), str(ROOT)])}  # fmt: skip
    # When the sample project is imported
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    # Then it loads, with guarded tasks and the worker flags
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")


# -- the samples run ---------------------------------------------------------------------


def test_protect_sample_runs_once(journal_db: str, grousset_journal: Any) -> None:
    sample = load_snippet("protect_example")
    day = date(2000, 1, 1) + timedelta(days=uuid.uuid4().int % 100_000)
    # Given the import_day() sample / When it is called three times for one day
    counts = [sample.import_day(day) for _ in range(3)]
    # Then the file was loaded once and every caller got the row count
    assert counts == [1200, 1200, 1200]
    assert sample.LOADED.count(day.isoformat()) == 1
    assert grousset_journal.protected(f"import:{day.isoformat()}").deliveries == 3


def test_payment_sample_survives_the_remaining_window(
    journal_db: str, grousset_journal: Any
) -> None:
    sample = load_snippet("payments")
    order = uuid.uuid4().int % 10**9
    # Given a charge, and a duplicate delivery (keyed on order_id); another amount for the
    # same order is refused, never answered with this charge
    first = sample.charge.apply((order, 1000)).get()
    assert sample.charge.apply((order, 1000)).get() == first
    with pytest.raises(PayloadMismatch):
        sample.charge.apply((order, 2500)).get()
    calls = sample.provider.calls
    # When the body runs again anyway (as after a crash past the completion: here the
    # record is made to expire, so the next delivery claims it anew)
    record = grousset_journal.get(sample.charge, order, 1000)
    Outcome.objects.using(journal_db).filter(pk=record.pk).update(
        expires_on=timezone.now() - timedelta(seconds=1)
    )
    again = sample.charge.apply((order, 1000)).get()
    # Then the provider was asked again with the same key and did not charge twice
    assert sample.provider.calls == calls + 1
    assert again == first
    assert list(sample.provider.charges.values()).count(first) == 1


def test_producer_samples_call_the_getting_started_task_as_it_takes_them(
    journal_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from celery_grousset import GroussetTask
    from celery_grousset.models import OutboxMessage
    from tests.celeryapp import app

    sample = load_snippet("producer")

    # Given the getting-started page's send_receipt(order_id, email)
    @app.task(base=GroussetTask, bind=True, max_processing_time=30, name="docs.send_receipt")
    def send_receipt(self: Any, order_id: int, email: str) -> str:
        return f"receipt {order_id}"

    made = SimpleNamespace(id=uuid.uuid4().int % 10**9, email="ann@example.com")
    order_model = SimpleNamespace(objects=SimpleNamespace(create=lambda **fields: made))
    published: list[Any] = []
    report = SimpleNamespace(published=0, skipped_in_batch=0, skipped_completed=0,
                             skipped_in_flight=0, results=[])  # fmt: skip
    monkeypatch.setattr(send_receipt, "publish_unique",
                        lambda calls: published.extend(calls) or report)  # fmt: skip
    # When the producer page's samples run with it
    sample.place_order(order_model, send_receipt, email=made.email)
    sample.send_todays_receipts(send_receipt, [made])
    # Then each call fits the task's signature (the outbox checks it as delay() does)
    from celery_grousset.published import arguments

    row = OutboxMessage.objects.using(journal_db).filter(task_name="docs.send_receipt").last()
    assert row is not None and arguments(row) == ([made.id, made.email], {})
    row.delete()
    assert [send_receipt.grousset_fingerprint(*call) for call in published]


def test_base_class_sample(journal_db: str) -> None:
    sample = load_snippet("base_class")
    order = uuid.uuid4().int % 10**9
    # Given the ShopTask base / When refund runs twice
    values = [sample.refund.apply((order,)).get() for _ in range(2)]
    # Then once, with the class-level options
    assert values == [f"refunded {order}"] * 2 and sample.REFUNDED.count(order) == 1
    opts = sample.refund.grousset_options()
    assert opts.max_processing_time == 120 and opts.expires_after == 30 * 24 * 3600


def test_migrating_sample(journal_db: str) -> None:
    sample = load_snippet("migrating_after")
    order = uuid.uuid4().int % 10**9
    # Given the migrated task keyed on order_id / When called twice, then with another email
    first = sample.send_receipt.apply((order, "a@example.com")).get()
    second = sample.send_receipt.apply((order, "a@example.com")).get()
    with pytest.raises(PayloadMismatch):
        sample.send_receipt.apply((order, "b@example.com")).get()
    # Then one mail, one message id; the other email is refused, not answered with it
    assert second == first
    assert [o for o, _ in sample.SENT].count(order) == 1


def test_settings_and_beat_samples() -> None:
    from celery import current_app

    import celery_grousset.tasks  # noqa: F401  (registers purge_expired)
    from celery_grousset.conf import GroussetSettings

    grousset = load_snippet("grousset_settings").GROUSSET
    beat = load_snippet("beat_schedule").CELERY_BEAT_SCHEDULE
    # Then the GROUSSET sample is valid and the beat entry names a real task
    with override_settings(GROUSSET=grousset):
        assert GroussetSettings().MAX_PROCESSING_TIME == 120
    assert beat["grousset-purge"]["task"] in current_app.tasks


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs built by mkdocs in strict mode (as `make docs` does)."""
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return site


def test_site_builds_strict(built_site: Path) -> None:
    # Given the docs / When mkdocs builds them in strict mode (the fixture)
    # Then no warning aborted it, and every page was written
    for page in pages():
        built = built_site / page.relative_to(DOCS).with_suffix("") / "index.html"
        assert page.name == "index.md" or built.exists(), f"{page.name} was not built"


def test_api_reference_is_generated_from_the_docstrings(built_site: Path) -> None:
    import celery_grousset.exceptions as exceptions_module
    from celery_grousset import exceptions, protect, signals
    from celery_grousset.fingerprint import fingerprint
    from celery_grousset.task import GroussetTask

    # Given the built API page as text
    html = (built_site / "api" / "index.html").read_text()
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    # Then the public entry points are there, each with the first line of its docstring
    public = [GroussetTask, protect, fingerprint]
    errors = [obj for obj in vars(exceptions_module).values()
              if isinstance(obj, type) and issubclass(obj, exceptions.GroussetError)]  # fmt: skip
    for obj in (*public, *errors):
        first = " ".join((obj.__doc__ or "").strip().splitlines()[0].split())
        first = re.sub(r":\w+:`~?([^`]+)`", r"\1", first).replace("``", "")
        assert obj.__name__ in text, obj
        assert first and first.split("(")[0][:40] in text, f"{obj.__name__}: {first!r}"
    assert len(errors) >= 7
    # And every signal, with the arguments its receivers get (from its #: comment)
    for name, value in vars(signals).items():
        if type(value).__name__ == "Signal":
            assert f"{name} module-attribute" in text or name in text, name
    assert "original_task_id" in text and "takeovers" in text
    # And the options of the task class are documented, with no raw Sphinx roles left
    assert "max_processing_time" in text and "Required: no default" in text
    assert ":class:" not in text and ":func:" not in text and ":mod:" not in text


def test_whole_worker_loss_is_explained_with_the_recommended_timeout() -> None:
    namespace: dict[str, Any] = {"INSTALLED_APPS": []}
    exec(compile((SNIPPETS / "settings.py").read_text(), "settings.py", "exec"), namespace)
    timeout = namespace["CELERY_BROKER_TRANSPORT_OPTIONS"]["visibility_timeout"]
    # Given the recommended Redis visibility_timeout / Then both pages state that value,
    # say the claim stays in flight until then, and name the three ways out
    for page in ("guarantee.md", "operations.md"):
        text = " ".join((DOCS / page).read_text().split())
        assert "whole worker" in text and f"{timeout} s" in text, page
        for remedy in ("grousset_release", "visibility_timeout", "RabbitMQ"):
            assert remedy in text, f"{page} does not mention {remedy}"
    operations = " ".join((DOCS / "operations.md").read_text().split())
    assert "## A whole worker killed (Redis `visibility_timeout`)" in (
        DOCS / "operations.md"
    ).read_text()
    assert "manage.py grousset_release <fingerprint>" in operations
    assert "celery_grousset.W001" in operations
