#!/bin/sh
# Install the Debian packages mmguard needs, only those missing, so that the
# README's commands work on a fresh Debian bookworm machine (CI included).
# Usage: install-deps.sh GROUP...   (groups are files in deps/: build, slurm, oracle, fuzz, browser)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
missing=""
for group in "$@"; do
    list="$here/deps/$group.txt"
    [ -f "$list" ] || { echo "install-deps: no package list $list" >&2; exit 2; }
    for pkg in $(grep -v '^[[:space:]]*#' "$list"); do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing="$missing $pkg"
        fi
    done
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing:$missing"
if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages and not root; run: apt-get install --no-install-recommends$missing" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing
