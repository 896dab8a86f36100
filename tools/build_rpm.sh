#!/usr/bin/env bash
# Build the slurm-hooks RPMs (noarch binary + source) from a source tree:
#   sdist (setuptools) -> spec from the sdist with the version baked in -> rpmbuild -ba in a
#   throw-away %_topdir -> the .rpm files copied to OUT, their paths printed one a line.
#
#   tools/build_rpm.sh [--source DIR] [--out DIR] [--python PY] [--nocheck] [--release N] [--verbose]
#                      [-- RPMBUILD ARGS...]
#
#   --source DIR  tree to build (default: this repository; the tests build patched copies)
#   --out DIR     where the RPMs go (default: DIR/dist)
#   --python PY   interpreter that makes the sdist and whose nvidia-ml-py is bundled
#                 (default: the repository's .venv/bin/python, else python3)
#   --nocheck     skip %check (rpmbuild --without check)
#   --release N   RPM Release number (default 1)
#   --verbose     show rpmbuild's output (otherwise only its tail, on failure)
#   -- ARGS       passed on to rpmbuild, e.g. -- --define 'python3_pkgversion 39' --define '__python3 /usr/bin/python3.9'
#
# The version is the sdist's (slurm_hooks.__version__); PEP 440 pre-releases become RPM tilde
# versions (0.2.0rc1 -> 0.2.0~rc1, which sorts before 0.2.0). The source RPM's spec carries the
# version, so `rpmbuild --rebuild` and mock work on it without extra defines.
# On a host that is not RPM-based (Debian CI) rpmbuild runs with --nodeps: its RPM database is
# empty, so no BuildRequires could be satisfied.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
source_dir=$repo out_dir="" python="" check=1 release=1 verbose=0 extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --source) source_dir=$(cd "$2" && pwd); shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --nocheck) check=0; shift ;;
    --release) release=$2; shift 2 ;;
    --verbose) verbose=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_rpm.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
out_dir=${out_dir:-$source_dir/dist}
if [ -z "$python" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then python=$repo/.venv/bin/python; else python=python3; fi
fi
command -v rpmbuild >/dev/null || { echo "build_rpm.sh: rpmbuild not found (Debian: apt-get install rpm; EL: dnf install rpm-build)" >&2; exit 1; }

started=$(date +%s.%N)
work=$(mktemp -d "${TMPDIR:-/tmp}/slurm-hooks-rpm.XXXXXX")
trap 'rm -rf "$work"' EXIT
top=$work/rpmbuild
mkdir -p "$top"/{SOURCES,SPECS,BUILD,BUILDROOT,RPMS,SRPMS} "$work/sdist"

# 1. sdist, with setuptools >= 61 (pyproject metadata); fetched into a temp dir when too old.
if ! "$python" -c 'import sys, setuptools; sys.exit(int(setuptools.__version__.split(".")[0]) < 61)' 2>/dev/null; then
  echo "build_rpm.sh: $python has no setuptools >= 61; installing one into a temp dir" >&2
  "$python" -m pip install -q --target "$work/setuptools" 'setuptools>=61' >&2
  export PYTHONPATH=$work/setuptools${PYTHONPATH:+:$PYTHONPATH}
fi
sdist=$(cd "$source_dir" && SLURM_HOOKS_CHECKS_DIR= "$python" -c '
import contextlib, sys
from setuptools import build_meta
with contextlib.redirect_stdout(sys.stderr):
    name = build_meta.build_sdist(sys.argv[1])
print(name)' "$work/sdist" 2>"$work/sdist.log") || { cat "$work/sdist.log" >&2; exit 1; }
sdist_name=${sdist%.tar.gz}
version=$(tar -xzOf "$work/sdist/$sdist" "$sdist_name/PKG-INFO" | sed -n 's/^Version: //p' | head -n 1)
[ -n "$version" ] || { echo "build_rpm.sh: no Version in $sdist's PKG-INFO" >&2; exit 1; }
rpm_version=$(printf '%s\n' "$version" | sed -E 's/^([0-9.]*[0-9])\.?((a|b|rc|dev)[0-9]*)$/\1~\2/')

# 2. pynvml.py to bundle, from the nvidia-ml-py installed for $python.
pynvml_info=$("$python" -c 'import importlib.metadata as md, pynvml; print(pynvml.__file__); print(md.version("nvidia-ml-py"))') \
  || { echo "build_rpm.sh: $python cannot import pynvml: pip install nvidia-ml-py" >&2; exit 1; }
pynvml_file=$(printf '%s\n' "$pynvml_info" | sed -n 1p)
pynvml_version=$(printf '%s\n' "$pynvml_info" | sed -n 2p)

# 3. sources and the spec (from the sdist, so a file missing from MANIFEST.in fails here).
cp "$work/sdist/$sdist" "$top/SOURCES/"
cp "$pynvml_file" "$top/SOURCES/pynvml.py"
{
  printf '%%global upstream_version %s\n%%global rpm_version %s\n' "$version" "$rpm_version"
  printf '%%global sdist_name %s\n%%global pynvml_version %s\n' "$sdist_name" "$pynvml_version"
  printf '%%global release_number %s\n' "$release"
  tar -xzOf "$work/sdist/$sdist" "$sdist_name/packaging/slurm-hooks.spec"
} > "$top/SPECS/slurm-hooks.spec"

args=(-ba --define "_topdir $top" ${extra[@]+"${extra[@]}"})
if ! rpm -q --quiet --whatprovides python3 2>/dev/null; then
  args+=(--nodeps)  # not an RPM-based host: its RPM database knows no python3 or pytest
fi
if [ "$check" = 0 ]; then
  args+=(--without check)
else
  target_python=$(rpm ${extra[@]+"${extra[@]}"} --eval '%{?__python3}' 2>/dev/null || true)
  target_python=${target_python:-/usr/bin/python3}
  if ! "$target_python" -c 'import pytest' 2>/dev/null; then
    "$python" -c 'import pytest' 2>/dev/null \
      || { echo "build_rpm.sh: %check needs pytest (for $target_python or $python), or pass --nocheck" >&2; exit 1; }
    args+=(--define "check_python $python")
  fi
fi

# 4. build
log=$work/rpmbuild.log
if [ "$verbose" = 1 ]; then
  rpmbuild "${args[@]}" "$top/SPECS/slurm-hooks.spec" 2>&1 | tee "$log" >&2
  status=${PIPESTATUS[0]}
else
  set +e; rpmbuild "${args[@]}" "$top/SPECS/slurm-hooks.spec" >"$log" 2>&1; status=$?; set -e
fi
if [ "$status" != 0 ]; then
  [ "$verbose" = 1 ] || tail -n 60 "$log" >&2
  echo "build_rpm.sh: rpmbuild failed (exit $status)" >&2
  exit 1
fi
mkdir -p "$out_dir"
for rpm_file in "$top"/RPMS/*/*.rpm "$top"/SRPMS/*.rpm; do
  cp "$rpm_file" "$out_dir/"
  echo "$(cd "$out_dir" && pwd)/$(basename "$rpm_file")"
done
echo "build_rpm.sh: slurm-hooks $rpm_version built in $(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s" >&2
