#!/usr/bin/env bash
# CI stage for the RPMs (called by .ci/run before the test command): install what tests/test_rpm.py
# needs on this Debian machine, and check for the Python it runs the packages with.
#   rpm (rpmbuild, rpm, rpm2cpio), cpio   build and unpack the RPMs
#   rpmlint                               Debian's package of it (2.4 on Debian 12): the lint CI enforces
#   CPython 3.9                           EL9's python3 and EL8's python39 are 3.9: the tests byte-compile
#                                         with it and run the installed hooks with it (tests/elroot.py).
#                                         Machines of this kind carry pyenv's 3.9 (with pip); none is in
#                                         Debian 12/13's archive, so a machine without one fails here.
# In CI (CI=true) test_rpm.py fails, rather than skips, when any of it is missing, so a package that
# no longer builds or runs cannot go unnoticed.
#
#   bash .ci/rpm.sh          install the tools and show their versions
#   bash .ci/rpm.sh --test   ... then run tests/test_rpm.py on its own (needs .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

need=()
for tool in rpmbuild:rpm cpio:cpio rpmlint:rpmlint unshare:util-linux chroot:coreutils; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get install -y --no-install-recommends "${need[@]}" >/dev/null \
    || { apt-get update -qq && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
fi
python39=$(python3 -c 'import sys; sys.path.insert(0, "tests"); import elroot; print(elroot.find_python39() or "")')
if [ -z "$python39" ]; then
  echo "== rpm: no CPython 3.9 on this machine (pyenv's, or python3.9 on PATH; see tests/elroot.py)" >&2
  exit 1
fi
echo "== rpm packaging tools: $(rpmbuild --version), $(cpio --version | head -n 1), rpmlint $(rpmlint --version), $("$python39" -V) ($python39)"
if [ "${1:-}" = "--test" ]; then
  .venv/bin/python -m pytest -q tests/test_rpm.py
fi
