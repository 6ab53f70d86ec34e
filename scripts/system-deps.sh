#!/usr/bin/env bash
# Installs the system packages the test suite needs when they are missing:
# PostgreSQL server binaries (initdb, pg_ctl) for the throwaway test clusters.
set -euo pipefail

have_pg() {
    command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}

if have_pg; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: installing PostgreSQL server binaries (apt-get install postgresql)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    have_pg && exit 0
fi
echo "system-deps: PostgreSQL binaries not found; install the 'postgresql' package" \
     "(or set EPIFLOW_PG_BIN). PostgreSQL tests will skip, or fail under EPIFLOW_REQUIRE_POSTGRES=1." >&2
