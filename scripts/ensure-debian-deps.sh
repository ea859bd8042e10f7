#!/usr/bin/env bash
# Install the Debian packages slurm-horus needs for its real local Slurm cluster, when missing.
# Root installs directly; otherwise sudo is used when available without a password; otherwise we
# print the exact command to run and fail.
# With an argument (make test-slurm-newer passes "mmdebstrap"), those packages are wanted too.
set -euo pipefail
PKGS="slurmctld slurmd slurm-client munge lua-socket slurmdbd mariadb-server lua5.1 prometheus iproute2 $*"
missing=()
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" = 0 ]; then SUDO=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"
else
  echo "slurm-horus needs these Debian packages: ${missing[*]}" >&2
  echo "run as root: apt-get update && $cmd" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d keeps the packages' own services from starting (we run private daemons).
$SUDO apt-get update -qq
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
