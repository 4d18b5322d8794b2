"""The package as the index shows it: the sdist and the wheel built with ``python -m
build`` pass ``twine check``, carry the licence, the type marker and the monitoring
assets; the metadata names the licence, the URLs, the tested versions and a driver
extra without a binary build; the README's links work outside the repository.

The built wheel installed in a clean virtualenv (check, migrate, guarded calls) is
``scripts/wheel-smoke.sh`` (``make wheel-smoke``, a CI step of its own)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
REPO_URL = "https://github.com/celery-grousset/celery-grousset"
MONITORING = (
    "celery_grousset/contrib/monitoring/__init__.py",
    "celery_grousset/contrib/monitoring/grafana-dashboard.json",
    "celery_grousset/contrib/monitoring/prometheus-alerts.yml",
)


def test_license_is_mit_for_the_developers() -> None:
    text = (ROOT / "LICENSE").read_text()
    # Given the LICENSE file / Then it is the MIT licence of the project's developers
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 celery-grousset developers" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "MIT"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_sdist_and_wheel_contents(dist: Path) -> None:
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    # Given the sdist and the wheel `python -m build` made
    with tarfile.open(sdist) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
        metadata = Parser().parsestr(
            whl.read(next(n for n in in_wheel if n.endswith(".dist-info/METADATA"))).decode()
        )
        entry_points = whl.read(
            next(n for n in in_wheel if n.endswith(".dist-info/entry_points.txt"))
        ).decode()
    # Then the sdist has the licence, the changelog, the README and the package
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"} <= in_sdist
    assert {"celery_grousset/py.typed", *MONITORING} <= in_sdist
    # And the wheel has the type marker, the monitoring assets, the migrations, the
    # admin's templates and the licence
    assert {"celery_grousset/py.typed", *MONITORING} <= in_wheel
    assert "celery_grousset/migrations/0001_initial.py" in in_wheel
    assert any(n.startswith("celery_grousset/templates/") for n in in_wheel)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in in_wheel)
    assert not any(n.startswith(("tests/", "docs/", "bench/")) for n in in_wheel)
    # And it registers the pytest plugin: no `pytest_plugins` line in a user's project
    assert (
        "[pytest11]\ncelery_grousset.contrib.pytest = celery_grousset.contrib.pytest"
        in entry_points
    )
    # And the metadata names the licence, the URLs and the tested versions
    assert metadata["License-Expression"] == "MIT"
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Documentation", "Source", "Changelog"}
    assert all(u.startswith(REPO_URL) for u in urls.values())
    classifiers = set(metadata.get_all("Classifier") or [])
    for minor in (10, 11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    for django in ("4.2", "5.2", "6.0"):
        assert f"Framework :: Django :: {django}" in classifiers
    assert {"Development Status :: 4 - Beta", "License :: OSI Approved :: MIT License",
            "Operating System :: OS Independent", "Framework :: Celery"} <= classifiers  # fmt: skip
    # And the postgres extra asks for psycopg, leaving the build (binary, C) to the project
    requires = metadata.get_all("Requires-Dist") or []
    postgres = [r for r in requires if "extra == 'postgres'" in r or 'extra == "postgres"' in r]
    assert postgres and all(r.startswith("psycopg>=3.1") for r in postgres), postgres
    # And twine (as the package index) accepts both, README included
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(sdist),
                           str(wheel)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_binary_psycopg_is_only_in_dev_and_example() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    # Then only the project's own environments pin the binary build
    binary = {name for name, reqs in extras.items() if any("psycopg[binary]" in r for r in reqs)}
    assert binary == {"dev", "example"}
    assert extras["postgres"] == ["psycopg>=3.1.12"]  # the floor Django 6.0 requires
    # And the drivers' and the Redis extra's floors are the ones that work: kombu's own
    # redis extra keeps Celery 5.3/5.4 off kombu 5.7 (whose Redis transport wants redis-py 6)
    assert extras["mysql"] == ["mysqlclient>=2.2.1"]
    assert extras["redis"] == ["celery[redis]>=5.3", "kombu[redis]"]
    # And psycopg2 (a project's own driver, never required) only in the dev environment
    psycopg2 = {name for name, reqs in extras.items() if any("psycopg2" in r for r in reqs)}
    assert psycopg2 == {"dev"}
    assert {"build>=1.2", "twine>=5"} <= set(extras["dev"])


def test_readme_links_work_outside_the_repository() -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    # Given the README's links / Then none is relative to the repository
    assert links and all(link.startswith("https://") for link in links), links
    # And each link into the repository names a file that exists on this branch
    prefix = f"{REPO_URL}/blob/main/"
    into_repo = [link[len(prefix):] for link in links if link.startswith(prefix)]
    assert "docs/getting-started.md" in into_repo and "CHANGELOG.md" in into_repo
    for path in into_repo:
        assert (ROOT / path.split("#")[0]).is_file(), f"README links to missing {path}"
    # And it says how to install, and keeps its two commands
    assert 'pip install "celery-grousset[postgres]"' in text
    assert "make demo" in text and "make test" in text


def test_changelog_keeps_a_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    # Then an Unreleased section comes first, then the last release, with link targets
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.MULTILINE)
    released = headings[1]
    assert headings[0] == "Unreleased"
    assert f"[{released}]: {REPO_URL}/releases/tag/v{released}" in text
    # And the package's version is that release, or a development version after it (an
    # unreleased build never calls itself the release before it)
    from packaging.version import Version

    assert version == released or (Version(version).is_devrelease
                                   and Version(version) > Version(released)), version
    assert "[Unreleased]: " in text and "keepachangelog.com" in text


def test_ci_runs_the_wheel_smoke_test_after_the_suite() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    make = (ROOT / "Makefile").read_text()
    # Then .ci/run has a step of its own after `make test`, and make has the target
    assert ci.index('step "make test" make test') < ci.index('step "wheel smoke" make wheel-smoke')
    assert re.search(r"^wheel-smoke: .*##", make, re.MULTILINE)
    assert "scripts/wheel-smoke.sh" in make


def test_a_typed_project_gets_the_public_apis_types() -> None:
    """The package ships py.typed: a project under `mypy --strict` (django-stubs,
    celery-types) got ``Any`` from a guarded task's ``apply_async``, ``apply`` and
    ``publish_unique`` (whose ``window`` and ``keep_results`` it could not see)."""
    from mypy import api

    # Given user code written as the docs show, with assert_type on what it gets back
    # When mypy --strict (the project's configuration) checks it
    out, err, status = api.run([str(ROOT / "tests" / "typed_usage.py")])
    # Then every type is the precise one
    assert status == 0, out + err
    assert "Success: no issues found in 1 source file" in out, out
