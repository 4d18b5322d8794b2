#!/usr/bin/env bash
# The package as a user gets it: build the sdist and the wheel (python -m build), check
# them (twine check --strict), install the wheel with no extras in a fresh virtualenv
# (Django, Celery and blake3 come as its dependencies) and smoke-test it in a throwaway
# Django project: `manage.py check`, `manage.py migrate` on SQLite, one guarded call
# through protect() and one GroussetTask called eagerly (task_always_eager), each twice,
# and publish_unique()'s refusal of a task with no max_processing_time.
# Everything happens under a temporary directory, removed at the end.
#
# usage: scripts/wheel-smoke.sh [--all] [PYTHON...]
#   PYTHON...  interpreters to install the wheel into (default: python3)
#   --all      every python3.10 ... python3.13 found on PATH or under ~/.pyenv/versions
#              (the versions the classifiers name; a missing one is reported, not fatal)
# BUILD_PYTHON: the interpreter with `build` and `twine` (default: .venv/bin/python, the
# dev extra). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_PYTHON=${BUILD_PYTHON:-$ROOT/.venv/bin/python}

find_python() {  # find_python 3.12 -> a path, or nothing
    local v=$1 p
    for p in "python$v" "$HOME"/.pyenv/versions/"$v"*/bin/"python$v" "/usr/bin/python$v"; do
        if command -v "$p" >/dev/null 2>&1 &&
            "$p" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$v'" 2>/dev/null; then
            command -v "$p"
            return 0
        fi
    done
    return 1
}

pythons=()
for arg in "$@"; do
    if [ "$arg" = "--all" ]; then
        for v in 3.10 3.11 3.12 3.13; do
            if p=$(find_python "$v"); then
                pythons+=("$p")
            else
                echo "wheel-smoke: no python$v on this machine: not tested here"
            fi
        done
    else
        pythons+=("$arg")
    fi
done
[ "${#pythons[@]}" -gt 0 ] || pythons=(python3)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/grousset-wheel-smoke.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

echo "== build (sdist + wheel)"
"$BUILD_PYTHON" -m build --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 ||
    { cat "$WORK/build.log"; exit 1; }
ls -1 "$WORK/dist"
echo "== twine check"
"$BUILD_PYTHON" -m twine check --strict "$WORK/dist"/*
wheel=$(ls "$WORK"/dist/*.whl)

# The throwaway project's smoke test: run from the project directory with the venv's
# python, so the package can only come from the installed wheel.
cat >"$WORK/guarded_calls.py" <<'PY'
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "smoke.settings")
import django

django.setup()

from celery import Celery

import celery_grousset
from celery_grousset import GroussetTask, protect
from celery_grousset.contrib.monitoring import ALERT_RULES, DASHBOARD
from celery_grousset.models import Outcome

assert celery_grousset.__file__.startswith(sys.prefix), celery_grousset.__file__
assert DASHBOARD.is_file() and ALERT_RULES.is_file(), "monitoring files missing"

loads = []


def load(day):
    loads.append(day)
    return {"day": day, "rows": 42}


first = protect("import:2026-11-29", load, "2026-11-29", max_processing_time=60)
second = protect("import:2026-11-29", load, "2026-11-29", max_processing_time=60)
print("protect:", first, second, "runs:", len(loads))
assert first == second == {"day": "2026-11-29", "rows": 42} and loads == ["2026-11-29"]

app = Celery("smoke")
app.conf.task_always_eager = True
charges = []


@app.task(base=GroussetTask, bind=True, max_processing_time=60, name="smoke.charge")
def charge(self, order_id, cents):
    charges.append(order_id)
    return f"charged {cents} for order {order_id} (fence {self.grousset.fence})"


one = charge.delay(7, 1000).get()
two = charge.delay(7, 1000).get()
print("GroussetTask (eager):", repr(one), repr(two), "runs:", len(charges))
assert one == two and one.startswith("charged 1000 for order 7 (fence ") and charges == [7]

# an error inside publish_unique() comes out as itself, on every Python (3.10 has no
# BaseException.add_note)
from celery_grousset.exceptions import ConfigurationError


@app.task(base=GroussetTask, name="smoke.unbounded")
def unbounded():
    pass


try:
    unbounded.publish_unique([((), {})])
except ConfigurationError as exc:
    print("publish_unique refused:", type(exc).__name__, "with its report:", exc.grousset_report)
else:
    raise AssertionError("publish_unique published a task with no max_processing_time")

rows = sorted(Outcome.objects.values_list("task_name", "status", "deliveries"))
print("journal:", rows)
assert rows == [("protect", "completed", 2), ("smoke.charge", "completed", 2)], rows
print(f"wheel smoke ok: celery-grousset {celery_grousset.__version__} from {celery_grousset.__file__}")
PY

status=0
for py in "${pythons[@]}"; do
    version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    echo "== python $version ($py): install the wheel in a fresh venv"
    venv="$WORK/venv-$version"
    proj="$WORK/project-$version"
    if ! (
        set -e
        "$py" -m venv "$venv"
        "$venv/bin/python" -m pip install -qq --upgrade pip
        "$venv/bin/python" -m pip install -qq "$wheel"
        "$venv/bin/python" -c 'import django, celery; print("   django", django.get_version(), "celery", celery.__version__)'
        mkdir "$proj"
        cd "$proj"
        "$venv/bin/django-admin" startproject smoke .
        cat >>smoke/settings.py <<'SETTINGS'

INSTALLED_APPS += ["celery_grousset"]
GROUSSET = {"PROCESSOR_ID": "smoke"}
SETTINGS
        echo "   manage.py check"
        "$venv/bin/python" manage.py check
        echo "   manage.py migrate (SQLite)"
        "$venv/bin/python" manage.py migrate -v 0
        "$venv/bin/python" manage.py showmigrations celery_grousset
        echo "   guarded calls"
        cp "$WORK/guarded_calls.py" .
        "$venv/bin/python" guarded_calls.py
    ); then
        echo "== python $version: FAILED"
        status=1
    fi
done
exit $status
