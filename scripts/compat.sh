#!/usr/bin/env bash
# Run the core behaviour tests against the other supported stacks, each in a venv of
# its own (.venv-compat-NAME), next to the main one (Python 3.11, Django 5.2, Celery latest):
#   dj42     Python 3.11, Django 4.2 LTS, Celery 5.3 (the oldest supported)
#   dj60     Python 3.12, Django 6.0 (skipped, with a message, when no python3.12 exists)
# usage: scripts/compat.sh [dj42] [dj60]
set -euo pipefail
cd "$(dirname "$0")/.."
CORE=(tests/test_store_contract.py tests/test_task.py tests/test_protect.py
      tests/test_fingerprint.py tests/test_migrations.py tests/test_pg_roundtrips.py)
status=0

find_python312() {
  for p in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$p"; return 0
    fi
  done
  return 1
}

run_stack() {  # name python django-spec celery-spec
  local name=$1 py=$2 django=$3 celery=$4 venv=".venv-compat-$1"
  echo "== compat $name: $("$py" --version) $django $celery"
  if [ ! -x "$venv/bin/python" ]; then "$py" -m venv "$venv"; "$venv/bin/python" -m pip install -qq --upgrade pip; fi
  "$venv/bin/python" -m pip install -qq -e ".[postgres,mysql,redis]" "$django" "$celery" \
      "pytest>=8" "pytest-django>=4.8" "pytest-timeout>=2.3" "hypothesis>=6.100"
  "$venv/bin/python" -c 'import django, celery; print("   django", django.get_version(), "celery", celery.__version__)'
  # own database names: never drop the main suite's databases
  if ! GROUSSET_TEST_PG_NAME="grousset_$name" GROUSSET_TEST_MYSQL_NAME="grousset_$name" \
       GROUSSET_TEST_TMP="/tmp/grousset-$name" \
       "$venv/bin/python" -m pytest -q -p no:cacheprovider "${CORE[@]}" -k "not race"; then
    status=1
  fi
}

for stack in "${@:-dj42 dj60}"; do
  case $stack in
    dj42) run_stack dj42 python3 "Django>=4.2,<4.3" "celery[redis]>=5.3,<5.4" ;;
    dj60)
      if py312=$(find_python312); then
        run_stack dj60 "$py312" "Django>=6.0,<6.1" "celery[redis]>=5.3"
      elif [ -n "${CI:-}" ]; then
        echo "== compat dj60: no python3.12 on this machine: Django 6 not tested here"
      else
        echo "== compat dj60: skipped (no python3.12)"
      fi ;;
    *) echo "unknown stack $stack"; exit 2 ;;
  esac
done
exit $status
