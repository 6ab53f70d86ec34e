#!/usr/bin/env bash
# Installs the system packages the test suite needs when they are missing:
# - PostgreSQL server binaries (initdb, pg_ctl) for the throwaway test clusters (required);
# - Chromium, for the headless checks of the Prefect UI and the HTML report (optional:
#   those tests skip with a reason without it);
# - mmdebstrap, which builds the root filesystems of Harbor task environments from Debian's
#   package registry (docs/harbor.md; the Harbor tests skip with a reason without it).
set -euo pipefail

have_pg() {
    command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
have_mmdebstrap() {
    command -v mmdebstrap >/dev/null 2>&1
}
have_chromium() {
    command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1
}

missing=()
have_pg || missing+=(postgresql)
have_chromium || missing+=(chromium)
have_mmdebstrap || missing+=(mmdebstrap)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: installing ${missing[*]} (apt-get)"
    apt-get update -qq || true
    for package in "${missing[@]}"; do
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null \
            || echo "system-deps: could not install $package" >&2
    done
fi
have_pg || echo "system-deps: PostgreSQL binaries not found; install the 'postgresql' package" \
    "(or set EPIFLOW_PG_BIN). PostgreSQL tests will skip, or fail under EPIFLOW_REQUIRE_POSTGRES=1." >&2
have_mmdebstrap || echo "system-deps: mmdebstrap not found; the Harbor task tests will skip." >&2
have_chromium || echo "system-deps: Chromium not found; the UI screenshot and report checks will skip." >&2
exit 0
