#!/usr/bin/env bash
# A PostgreSQL cluster configured as a journal's own server would be (docs/scale.md,
# "A server sized for its journal"), for the scale benchmarks: the machine's own
# cluster keeps PostgreSQL's defaults (shared_buffers 128 MB), which no server holding
# a 50M-row journal runs with.
#
#   bash bench/scale_cluster.sh start     # create (once) and start, on port 5433
#   BENCH_PG_PORT=5433 BENCH_PG_NAME=grousset_scale .venv/bin/python -m bench.scale_ab ...
#   bash bench/scale_cluster.sh drop      # stop and remove it, data and all
#
# Memory follows the usual sizing for a dedicated server: shared_buffers a quarter of
# RAM, effective_cache_size two thirds; SSD page costs; checkpoints spread out.
set -euo pipefail
VERSION=${PG_VERSION:-$(ls /etc/postgresql | sort -n | tail -1)}
NAME=${SCALE_CLUSTER:-scale}
PORT=${SCALE_PORT:-5433}
ram_mb=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)

case "${1:-start}" in
start)
    if ! pg_lsclusters -h | awk '{print $2}' | grep -qx "$NAME"; then
        pg_createcluster "$VERSION" "$NAME" --port "$PORT" \
            -o "shared_buffers=$((ram_mb / 4))MB" \
            -o "effective_cache_size=$((ram_mb * 2 / 3))MB" \
            -o "maintenance_work_mem=1GB" \
            -o "work_mem=16MB" \
            -o "max_wal_size=4GB" \
            -o "checkpoint_timeout=15min" \
            -o "checkpoint_completion_target=0.9" \
            -o "random_page_cost=1.1" \
            -o "effective_io_concurrency=200" \
            -- --auth-local=trust --auth-host=trust >/dev/null
    fi
    pg_ctlcluster --skip-systemctl-redirect "$VERSION" "$NAME" start 2>/dev/null ||
        pg_lsclusters -h | awk -v n="$NAME" '$2 == n && $4 == "online" {ok=1} END {exit !ok}'
    psql -h 127.0.0.1 -p "$PORT" -U postgres -Atc \
        "SELECT 'scale cluster up: port $PORT, shared_buffers ' || current_setting('shared_buffers')"
    ;;
drop)
    pg_dropcluster --stop "$VERSION" "$NAME"
    ;;
*)
    echo "usage: $0 start|drop" >&2
    exit 2
    ;;
esac
