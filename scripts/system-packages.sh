#!/usr/bin/env bash
# The system packages the test suite's real components need, installed with apt-get when
# this runs as root on a Debian-like machine; otherwise it names what is missing and
# which tests will therefore be skipped. Used by `make test` and by .ci/run, so a fresh
# machine and CI install the same things.
#
#   scripts/system-packages.sh          # install what is missing (root + apt), or report
#   scripts/system-packages.sh --check  # only report; exit 1 if something is missing
set -uo pipefail

check_only=0
[ "${1:-}" = "--check" ] && check_only=1

# package | command or glob that proves it is installed | tests skipped without it
components=(
    "openjdk-17-jre-headless|java|every Spark test (and the demo)"
    "postgresql|/usr/lib/postgresql/*/bin/initdb|the PostgresSink tests"
    "nats-server|nats-server /usr/sbin/nats-server|the JetStream connector tests"
    "chromium|chromium|the dashboard's browser test"
    "chromium-driver|chromedriver|the dashboard's browser test"
)

present() {
    local probe
    for probe in $1; do
        if [[ "$probe" == /* ]]; then
            compgen -G "$probe" >/dev/null && return 0
        elif command -v "$probe" >/dev/null 2>&1; then
            return 0
        fi
    done
    return 1
}

missing=()
for entry in "${components[@]}"; do
    IFS='|' read -r package probe _ <<<"$entry"
    present "$probe" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ $check_only -eq 0 ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing system packages for the test suite: ${missing[*]}"
    if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; then
        exit 0
    fi
    echo "apt-get could not install: ${missing[*]}" >&2
fi

echo "----------------------------------------------------------------------" >&2
echo "Missing system packages; the tests that need them will be SKIPPED:" >&2
for entry in "${components[@]}"; do
    IFS='|' read -r package probe skipped <<<"$entry"
    present "$probe" || echo "  $package: $skipped" >&2
done
echo "Install them with: sudo apt-get install ${missing[*]}" >&2
echo "----------------------------------------------------------------------" >&2
[ $check_only -eq 1 ] && exit 1
exit 0
