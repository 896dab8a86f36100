#!/usr/bin/env bash
# CI stage for the .deb (called by .ci/run before the test command): install the Debian tools that
# tools/build_deb.sh and tests/test_deb.py need: dpkg-buildpackage (dpkg-dev), debhelper, dh-python,
# and the Build-Depends of packaging/debian/control that run the unit tests in the build (python3-pytest,
# python3-toml). The test installs the package with apt-get (its dependencies come from the
# distribution's archive) into a root of its own (tests/debroot.py: an overlay of / whose writes
# land on a tmpfs), runs a real job through it, and purges it there; the host is never installed
# into, and `--test` checks that the host's package list is the same afterwards.
# In CI (CI=true) test_deb.py fails, rather than skips, when any of it is missing.
#
#   bash .ci/deb.sh          install the tools and show their versions
#   bash .ci/deb.sh --test   ... then run tests/test_deb.py on its own (needs .venv and Slurm)
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

packages=(dpkg-dev debhelper dh-python python3-pytest python3-toml)
installed=$(dpkg-query -W -f '${Status}\n' "${packages[@]}" 2>/dev/null | grep -c '^install ok installed$' || true)
if [ "$installed" != "${#packages[@]}" ]; then
  apt-get install -y --no-install-recommends "${packages[@]}" >/dev/null \
    || { apt-get update -qq && apt-get install -y --no-install-recommends "${packages[@]}" >/dev/null; }
fi
echo "== deb packaging tools on $(. /etc/os-release && echo "$PRETTY_NAME"): $(dpkg-buildpackage --version | head -n 1)," \
     "debhelper $(dpkg-query -W -f '${Version}' debhelper), dh-python $(dpkg-query -W -f '${Version}' dh-python)," \
     "python3 $(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "${1:-}" = "--test" ]; then
  before=$(dpkg-query -W -f '${Package} ${Version} ${Status}\n')
  .venv/bin/python -m pytest -q tests/test_deb.py
  [ "$before" = "$(dpkg-query -W -f '${Package} ${Version} ${Status}\n')" ] \
    || { echo "== deb: tests/test_deb.py changed the host's package list" >&2; exit 1; }
fi
