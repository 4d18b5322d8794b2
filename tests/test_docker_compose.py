"""docker-compose.yml, checked without a Docker engine: structure, names and commands.

The file is parsed with PyYAML; what it names (settings variables, the Celery app,
worker flags) is checked against the example project itself.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ROOT / "example_project" / "proj" / "settings.py"
WORKER_FLAGS = {
    "--grousset-processor-id": "shop",
    "--grousset-max-processing-time": "60",
    "--grousset-metrics-port": "9808",
}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return dict(compose["services"])


def argv(service: dict[str, Any]) -> list[str]:
    """The service's command as the shell inside ``sh -c "…"`` would split it."""
    command = service["command"]
    words = shlex.split(command) if isinstance(command, str) else list(command)
    if words[:2] == ["sh", "-c"]:
        words = shlex.split(words[2])
    return words


def program(service: dict[str, Any], name: str) -> list[str]:
    """The words of the ``&&``-separated part of the command that starts with ``name``."""
    words = argv(service)
    parts: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            parts.append([])
        else:
            parts[-1].append(word)
    matches = [p for p in parts if p[:1] == [name] or p[:3] == ["python", "manage.py", name]]
    assert matches, f"no {name!r} in {words}"
    return matches[0]


def test_every_service_is_there_with_its_image(services: dict[str, Any]) -> None:
    # Given the compose file / Then it has the five services, on the agreed images
    assert set(services) == {"postgres", "redis", "web", "worker", "beat"}
    assert services["postgres"]["image"] == "postgres:16"
    assert services["redis"]["image"] == "redis:7"
    for name in ("web", "worker", "beat"):
        assert services[name]["image"] == "python:3.11-slim"
        assert services[name]["working_dir"] == "/app"
        assert ".:/app" in services[name]["volumes"]


def test_servers_have_healthchecks_and_everyone_waits_for_them(services: dict[str, Any]) -> None:
    # Given the two servers' healthchecks
    pg = " ".join(services["postgres"]["healthcheck"]["test"])
    redis = " ".join(services["redis"]["healthcheck"]["test"])

    # Then they are the servers' own probes
    assert "pg_isready" in pg
    assert "redis-cli ping" in redis

    # And every Python service starts only once both are healthy
    for name in ("web", "worker", "beat"):
        depends = services[name]["depends_on"]
        for server in ("postgres", "redis"):
            assert depends[server] == {"condition": "service_healthy"}, (name, server)


def test_environment_names_are_the_ones_settings_read(services: dict[str, Any]) -> None:
    # Given the variables the compose file sets and the text of the example settings
    text = SETTINGS.read_text()
    read = set(re.findall(r'env\.\w+\(\s*"([A-Z_]+)"', text))

    for name in ("web", "worker", "beat"):
        env = services[name]["environment"]
        # Then the server URLs are passed under the names settings.py reads …
        for var in ("DATABASE_URL", "CELERY_BROKER_URL"):
            assert var in env and var in read, (name, var)
        # … every DJANGO_/CELERY_/DATABASE_ variable set is one settings.py reads …
        ours = {v for v in env if v.startswith(("DJANGO_ALLOWED", "CELERY_", "DATABASE_"))}
        assert ours <= read, ours - read
        # … and they point at the compose services
        assert "@postgres:5432/" in env["DATABASE_URL"]
        assert env["CELERY_BROKER_URL"].startswith("redis://redis:6379/")


def test_database_url_matches_the_postgres_service(services: dict[str, Any]) -> None:
    # Given the postgres service's user, password and database
    pg = services["postgres"]["environment"]
    url = services["web"]["environment"]["DATABASE_URL"]

    # Then DATABASE_URL names exactly those
    assert url == (f"postgres://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}"
                   f"@postgres:5432/{pg['POSTGRES_DB']}")  # fmt: skip


def test_web_installs_migrates_and_serves(services: dict[str, Any]) -> None:
    # Given the web service's command
    words = argv(services["web"])

    # Then it installs the package with its server extras, migrates, then serves on 0.0.0.0
    assert words[:4] == ["pip", "install", "-q", "-e"]
    assert words[4].startswith(".[") and {"postgres", "redis"} <= set(words[4][2:-1].split(","))
    assert program(services["web"], "migrate") == ["python", "manage.py", "migrate"]
    assert program(services["web"], "runserver")[-1] == "0.0.0.0:8000"
    assert (ROOT / "manage.py").exists()


def test_worker_command_names_the_app_and_the_grousset_flags(services: dict[str, Any]) -> None:
    # Given the worker's celery command line
    celery = program(services["worker"], "celery")

    # Then it runs the example project's app (proj/celery.py defines Celery("proj")) …
    app = celery[celery.index("-A") + 1]
    module = ROOT / "example_project" / app / "celery.py"
    assert module.exists(), module
    assert f'Celery("{app}")' in module.read_text()
    assert celery[celery.index("-A") + 2] == "worker"
    # … with each grousset flag and its value, the processor id being the settings' one
    for flag, value in WORKER_FLAGS.items():
        assert celery[celery.index(flag) + 1] == value, flag
    assert '"PROCESSOR_ID": "shop"' in SETTINGS.read_text()
    assert "9808:9808" in services["worker"]["ports"]


def test_beat_runs_the_same_app(services: dict[str, Any]) -> None:
    # Given beat's celery command line
    celery = program(services["beat"], "celery")

    # Then it runs beat for the same app, importable the way the containers set PYTHONPATH
    assert celery[:4] == ["celery", "-A", "proj", "beat"]
    assert services["beat"]["environment"]["PYTHONPATH"] == "/app/example_project"


def test_the_worker_flags_exist(tmp_path: Path, services: dict[str, Any]) -> None:
    # Given the example project's Celery app, loaded as the container loads it
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(GROUSSET_DEMO_DIR=str(tmp_path), PYTHONPATH=str(ROOT / "example_project"))

    # When `celery -A proj worker --help` lists the worker's options
    out = subprocess.run([sys.executable, "-m", "celery", "-A", "proj", "worker", "--help"],
                         cwd=ROOT / "example_project", env=env, capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip

    # Then every --grousset-* flag the compose file passes is one the worker accepts
    assert out.returncode == 0, out.stderr
    for flag in WORKER_FLAGS:
        assert flag in out.stdout, flag
