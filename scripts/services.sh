#!/usr/bin/env bash
# Start (or report on) the local services the test suite talks to:
# PostgreSQL 5432, MariaDB 3306, Redis 6379, RabbitMQ 5672 — all on 127.0.0.1.
#
#   scripts/services.sh start    start whichever is down, wait for each to answer
#   scripts/services.sh status   report only (exit 1 if any is down)
#
# Idempotent; returns in well under a second when everything is already up.
set -uo pipefail

WAIT_SECONDS="${SERVICES_WAIT_SECONDS:-60}"
SERVICES=(postgresql mariadb redis rabbitmq)

# --- checks: each must return quickly, even when the service is down --------
check_postgresql() { timeout 5 pg_isready -q -h 127.0.0.1 -p 5432 >/dev/null 2>&1; }
check_mariadb() {
    timeout 5 mysqladmin --connect-timeout=3 -uroot -h127.0.0.1 -P3306 ping >/dev/null 2>&1
}
check_redis() { [ "$(timeout 5 redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }
check_rabbitmq() { timeout 3 bash -c '</dev/tcp/127.0.0.1/5672' >/dev/null 2>&1; }

# --- start commands (the machine's documented ones) ---------------------------
start_postgresql() {
    local version
    version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1)"
    [ -n "$version" ] || { echo "no cluster under /etc/postgresql" >&2; return 1; }
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
}
start_mariadb() {
    # mariadbd needs its runtime dir for the socket/pid file (tmpfs on a fresh boot)
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
}
start_redis() {
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
        --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
}
start_rabbitmq() { rabbitmq-server -detached; }

LOG_DIR="${TMPDIR:-/tmp}/celery-grousset-services"

wait_for() {
    local svc="$1" deadline=$((SECONDS + WAIT_SECONDS))
    while [ "$SECONDS" -lt "$deadline" ]; do
        "check_$svc" && return 0
        sleep 1
    done
    "check_$svc"
}

cmd_status() {
    local svc rc=0
    for svc in "${SERVICES[@]}"; do
        if "check_$svc"; then
            printf '%-11s up\n' "$svc"
        else
            printf '%-11s DOWN\n' "$svc"
            rc=1
        fi
    done
    return "$rc"
}

cmd_start() {
    local svc rc=0 started=()
    mkdir -p "$LOG_DIR"
    # Launch everything that is down first, then wait: boots overlap (RabbitMQ is slow).
    for svc in "${SERVICES[@]}"; do
        if "check_$svc"; then
            printf '%-11s already up\n' "$svc"
        else
            if "start_$svc" >"$LOG_DIR/$svc.log" 2>&1; then
                started+=("$svc")
            else
                printf '%-11s FAILED (start command failed, see %s)\n' "$svc" "$LOG_DIR/$svc.log"
                sed 's/^/    /' "$LOG_DIR/$svc.log" | tail -n 20
                rc=1
            fi
        fi
    done
    for svc in "${started[@]+"${started[@]}"}"; do
        if wait_for "$svc"; then
            printf '%-11s started\n' "$svc"
        else
            printf '%-11s FAILED (not answering after %ss, see %s)\n' \
                "$svc" "$WAIT_SECONDS" "$LOG_DIR/$svc.log"
            sed 's/^/    /' "$LOG_DIR/$svc.log" | tail -n 20
            rc=1
        fi
    done
    return "$rc"
}

case "${1:-status}" in
    start) cmd_start ;;
    status) cmd_status ;;
    *) echo "usage: $0 {start|status}" >&2; exit 2 ;;
esac
