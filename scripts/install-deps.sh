#!/usr/bin/env bash
# Installs the Debian packages tilemoe builds against, only those missing. Debian 12 or later.
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config libdnnl-dev libhwloc-dev libnuma-dev libeigen3-dev catch2
          nlohmann-json3-dev libcli11-dev python3 python3-numpy python3-dev pybind11-dev python3-torch)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
