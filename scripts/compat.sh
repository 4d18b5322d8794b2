#!/usr/bin/env bash
# Run the core behaviour tests against the other supported stacks, each in a venv of
# its own (.venv-compat-NAME), next to the main one (Python 3.11, Django 5.2, Celery latest):
#   dj42     Python 3.11, Django 4.2 LTS, Celery 5.3 (the oldest supported)
#   dj60     Python 3.12, Django 6.0 (skipped, with a message, when no python3.12 exists)
#   dj61     Python 3.12, Django 6.1 (the same)
#   pg2      Python 3.11, Django 5.2, PostgreSQL on psycopg2 only (psycopg 3 not installed):
#            the store and PostgreSQL tests only
# usage: scripts/compat.sh [dj42] [dj60] [dj61] [pg2]
set -euo pipefail
cd "$(dirname "$0")/.."
CORE=(tests/test_store_contract.py tests/test_task.py tests/test_protect.py
      tests/test_fingerprint.py tests/test_migrations.py tests/test_pg_roundtrips.py
      tests/test_partition_revert.py tests/test_poison.py tests/test_periodic_slots.py
      tests/test_getting_started.py)
PG=(tests/test_store_contract.py tests/test_pg_roundtrips.py tests/test_pg_driver.py
    tests/test_poison.py tests/test_claim.py tests/test_partition_revert.py tests/test_pgbouncer.py)
status=0

find_python312() {
  for p in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$p"; return 0
    fi
  done
  return 1
}

run_stack() {  # name python django-spec celery-spec [driver-spec [pytest args...]]
  local name=$1 py=$2 django=$3 celery=$4 driver=${5:-} venv=".venv-compat-$1"
  local extras=postgres,mysql,redis
  local args=("${CORE[@]}" -k "not race")
  if [ -n "$driver" ]; then extras=mysql,redis; shift 5; args=("$@"); fi
  echo "== compat $name: $("$py" --version) $django $celery ${driver:-psycopg}"
  if [ ! -x "$venv/bin/python" ]; then "$py" -m venv "$venv"; "$venv/bin/python" -m pip install -qq --upgrade pip; fi
  # shellcheck disable=SC2086  # $celery: the Celery spec and its era's pins, split
  "$venv/bin/python" -m pip install -qq -e ".[$extras]" "$django" $celery $driver \
      "pytest>=8" "pytest-django>=4.8" "pytest-timeout>=2.3" "hypothesis>=6.100" "pytest-celery>=1.0"
  "$venv/bin/python" -c 'import django, celery; print("   django", django.get_version(), "celery", celery.__version__)'
  # own database names: never drop the main suite's databases
  if ! GROUSSET_TEST_PG_NAME="grousset_$name" GROUSSET_TEST_MYSQL_NAME="grousset_$name" \
       GROUSSET_TEST_TMP="/tmp/grousset-$name" GROUSSET_TEST_PG_DRIVER="${driver:+psycopg2}" \
       "$venv/bin/python" -m pytest -q -p no:cacheprovider "${args[@]}"; then
    status=1
  fi
}

for stack in "${@:-dj42 dj60 dj61}"; do
  case $stack in
    # Celery 5.3 and whatever kombu our redis extra resolves with it (as a user gets it:
    # kombu's own redis extra keeps it off kombu 5.7, which needs redis-py 6)
    dj42) run_stack dj42 python3 "Django>=4.2,<4.3" "celery[redis]>=5.3,<5.4" ;;
    dj60|dj61)
      minor=${stack#dj6}
      if py312=$(find_python312); then
        run_stack "$stack" "$py312" "Django>=6.$minor,<6.$((minor + 1))" "celery[redis]>=5.3"
      elif [ -n "${CI:-}" ]; then
        echo "== compat $stack: no python3.12 on this machine: Django 6 not tested here"
      else
        echo "== compat $stack: skipped (no python3.12)"
      fi ;;
    pg2)
      # a psycopg2 project: psycopg 3 must not be there (Django would pick it)
      if [ -x .venv-compat-pg2/bin/python ]; then .venv-compat-pg2/bin/python -m pip uninstall -qq -y psycopg psycopg-binary 2>/dev/null || true; fi
      run_stack pg2 python3 "Django>=5.2,<5.3" "celery[redis]>=5.3" "psycopg2-binary>=2.8.4" \
          "${PG[@]}" -k "not sqlite and not mariadb" ;;
    *) echo "unknown stack $stack"; exit 2 ;;
  esac
done
exit $status
