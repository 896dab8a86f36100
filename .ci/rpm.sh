#!/usr/bin/env bash
# CI step for the RPM packaging (called by .ci/run before the test command): install the tools that
# tests/test_rpm.py needs on this Debian machine. rpmbuild, rpm and rpm2cpio come from Debian's
# `rpm` package, cpio unpacks source RPMs. In CI (CI=true) test_rpm.py fails, rather than skips,
# when they are missing, so a package that no longer builds cannot go unnoticed.
#
#   bash .ci/rpm.sh          install the tools and show their versions
#   bash .ci/rpm.sh --test   ... then run tests/test_rpm.py on its own (needs .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

if ! command -v rpmbuild >/dev/null || ! command -v cpio >/dev/null; then
  apt-get install -y --no-install-recommends rpm cpio >/dev/null \
    || { apt-get update -qq && apt-get install -y --no-install-recommends rpm cpio >/dev/null; }
fi
echo "== rpm packaging tools: $(rpmbuild --version), $(cpio --version | head -n 1)"
if [ "${1:-}" = "--test" ]; then
  .venv/bin/python -m pytest -q tests/test_rpm.py
fi
