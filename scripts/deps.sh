#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages strata builds against, and gnuplot-nox (strata
# stats-routing --plot runs gnuplot), when any is missing.
# Uses sudo when not root. Does nothing when everything is present.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libhwloc-dev liburing-dev libjemalloc-dev libjson-c-dev
      libpcre2-dev libxxhash-dev libutf8proc-dev libudev-dev libmicrohttpd-dev gnuplot-nox)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "strata: installing missing packages: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
