#!/usr/bin/env bash
# Install the Debian packages the build and the test suite need, only those missing:
#   default-libmysqlclient-dev pkg-config  -> build mysqlclient
#   chromium chromium-driver               -> browser tests
#   faketime                               -> clock-skew tests
#   pgbouncer                              -> the journal behind a pooler (tests/test_pgbouncer.py)
#   fonts-liberation                       -> readable text in browser screenshots
#                                             (chromium only recommends it, and we
#                                             install without recommends)
#   prometheus                             -> promtool: checks and unit-tests the shipped
#                                             alert rules (tests/test_monitoring.py)
# No-op (and no apt-get update) when everything is present.
set -euo pipefail

PACKAGES=(default-libmysqlclient-dev pkg-config chromium chromium-driver faketime fonts-liberation
          prometheus pgbouncer)

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "apt-deps: all present (${PACKAGES[*]})"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "apt-deps: missing ${missing[*]}; run as root to install them" >&2
    exit 1
fi

echo "apt-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "apt-deps: done"
