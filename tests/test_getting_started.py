"""docs/getting-started.md (then docs/testing.md), followed literally in a new project.

The test reads the pages, not a copy of them: it runs their shell commands in
order (``django-admin startproject``, ``manage.py startapp / migrate /
makemigrations / check``), writes every sample (written out in the page under a
``<!-- snippet: path -->`` comment) to the file the page names
(``settings.py`` regions are appended to ``mysite/settings.py``), runs the
page's interactive session in ``manage.py shell``, and finally runs the testing
page's pytest sample with pytest-django. A change to the docs that breaks the
path breaks this test.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
#: a Python block written out in the page, with the snippet file it copies named above it
INLINED = re.compile(r"^<!-- snippet: (\S+) -->\n```python[^\n]*\n(.*?)^```\s*$",
                     re.MULTILINE | re.DOTALL)  # fmt: skip


def blocks(page: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block of a docs page, in order."""
    return FENCE.findall((DOCS / page).read_text())


def destination(path: str) -> str | None:
    """Which project file an included sample is (None: append to mysite/settings.py)."""
    rel = Path(path).relative_to("docs/snippets")
    if rel in (Path("settings.py"), Path("beat_schedule.py")):  # (settings fragments)
        return None
    return str(rel)


class Project:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = {k: v for k, v in os.environ.items()
                    if k != "DJANGO_SETTINGS_MODULE" and not k.startswith("GROUSSET_")}  # fmt: skip
        # Stands in for `pip install celery-grousset`: the package from this checkout.
        self.env["PYTHONPATH"] = str(ROOT)
        self.log: list[str] = []
        self.worker_help = ""
        self.shell_out = ""

    def run(self, *argv: str, timeout: float = 180) -> str:
        done = subprocess.run(argv, cwd=self.path, env=self.env, capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip
        self.log.append(f"$ {shlex.join(argv)}\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
        assert done.returncode == 0, "\n".join(self.log[-3:])
        return done.stdout

    def shell_line(self, line: str) -> None:
        """One command line of a ```bash block."""
        argv = shlex.split(line)
        if argv[:2] == ["pip", "install"]:
            assert any(a.startswith("celery-grousset") for a in argv)
        elif argv[0] == "django-admin":
            self.run(str(BIN / "django-admin"), *argv[1:])
        elif argv[0] == "python":
            self.run(sys.executable, *argv[1:])
        elif argv[0] == "celery":
            # A worker needs a broker: ask it for its options instead of starting it.
            assert argv[1:4] == ["-A", "mysite", "worker"]
            self.worker_help = self.run(str(BIN / "celery"), *argv[1:], "--help")
        else:
            raise AssertionError(f"unexpected command in the docs: {line}")

    def include(self, target: str, text: str) -> None:
        """Write a sample to the project: the page's own text of it (``text``)."""
        dest = destination(target.partition(":")[0])
        if dest is None:
            with open(self.path / "mysite" / "settings.py", "a") as fh:
                fh.write("\n" + text)
        else:
            (self.path / dest).parent.mkdir(parents=True, exist_ok=True)
            (self.path / dest).write_text(text)

    def session(self, body: str) -> list[str]:
        """Run the ``>>>`` lines of a pycon block in ``manage.py shell``; return the reprs."""
        script = []
        for line in body.splitlines():
            if not line.startswith(">>> "):
                continue
            code = line[4:].split("  #")[0]
            if isinstance(ast.parse(code).body[0], ast.Expr):
                code = f"print('RESULT', repr({code}))"
            script.append(code)
        out = self.run(sys.executable, "manage.py", "shell", "-c", "\n".join(script))
        self.shell_out = out
        return [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]


def follow(project: Project, page: str) -> list[list[str]]:
    sessions = []
    inlined = {body: target for target, body in INLINED.findall((DOCS / page).read_text())}
    for lang, body in blocks(page):
        if lang == "bash":
            for line in body.splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    project.shell_line(line.strip())
        elif lang == "python":
            assert body in inlined, f"{page}: a Python block of no snippet:\n{body}"
            project.include(inlined[body], body)
        elif lang == "ini":
            first = body.splitlines()[0]
            assert first == "[pytest]"
            (project.path / "pytest.ini").write_text(body)
        elif lang == "pycon":
            sessions.append(project.session(body))
    return sessions


def test_getting_started_literally(tmp_path: Path) -> None:
    project = Project(tmp_path / "site")
    project.path.mkdir()
    # Given a new Django project set up exactly as docs/getting-started.md says
    sessions = follow(project, "getting-started.md")
    # (the worker it starts has the --grousset-* flags)
    for flag in ("processor-id", "max-processing-time", "metrics-port", "bypass"):
        assert f"--grousset-{flag}" in project.worker_help
    # When its shell session calls the guarded task twice (eager mode)
    assert len(sessions) == 1
    first, second = sessions[0]
    # Then the email was sent once, and both calls returned the same Message-ID
    assert first == second and first.endswith("@shop.example>'")
    assert project.shell_out.count("Subject: Your receipt for order 42") == 1
    # And the journal (the project's SQLite file) shows one record, two deliveries
    import sqlite3

    with sqlite3.connect(project.path / "db.sqlite3") as db:
        rows = db.execute(
            "SELECT task_name, status, deliveries, processor_id FROM celery_grousset_outcome"
        ).fetchall()
    assert rows == [("shop.tasks.send_receipt", "completed", 2, "mysite")]
    # When the testing page is followed in the same project (pytest-django)
    follow(project, "testing.md")
    # (no conftest.py: the plugin's fixtures come from its pytest11 entry point)
    assert not (project.path / "conftest.py").exists()
    out = project.run(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                      "shop/test_tasks.py", "shop/test_worker.py", timeout=300)  # fmt: skip
    # Then its sample tests pass: one email, one booking, deliveries counted, eagerly
    # and on Celery's in-process worker
    assert "3 passed" in out
