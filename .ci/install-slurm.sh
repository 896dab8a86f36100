#!/bin/bash
# Install a local Slurm (slurmctld + slurmd + clients) and munge for the test suite.
# Idempotent: does nothing but print the version when everything is already there.
# Works on Debian 12 (Slurm 22.05) and Debian 13 (Slurm 24.11); needs root (or sudo).
set -euo pipefail

PKGS=(slurmctld slurmd slurm-client munge)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
for b in slurmctld slurmd scontrol sinfo sbatch munged munge unmunge; do
  command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || { missing+=("${PKGS[@]}"); break; }
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-slurm: installing ${PKGS[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # The Debian packages' postinst scripts try to start the daemons; without systemd
  # (containers) that fails harmlessly. policy-rc.d 101 keeps invoke-rc.d quiet.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 0755 /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $SUDO apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
fi

# A munge key is needed by munged; the package normally creates one, make sure.
if [ ! -s /etc/munge/munge.key ]; then
  if command -v mungekey >/dev/null 2>&1; then
    $SUDO mungekey --create --keyfile=/etc/munge/munge.key
  else
    $SUDO dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  $SUDO chown munge:munge /etc/munge/munge.key
  $SUDO chmod 0400 /etc/munge/munge.key
fi

# Print the version. NB: `sinfo --version` is fatal on 22.05 when no slurm.conf can be found
# ("Could not establish a configuration source"), `slurmd -V` needs none.
echo "install-slurm: $(/usr/sbin/slurmd -V) (package slurm-client $(dpkg-query -W -f='${Version}' slurm-client))"
