#!/usr/bin/env bash
# Build the slurm-hooks RPMs (noarch binary + source) from a source tree:
#   sdist (setuptools) -> spec from the sdist with the version, URL and a %changelog entry baked in
#   -> rpmbuild -ba in a throw-away %_topdir -> the .rpm files copied to OUT, their paths printed.
#
#   tools/build_rpm.sh [--target el8|el9] [--source DIR] [--out DIR] [--python PY]
#                      [--bytecompile-python PY] [--nocheck] [--release N] [--verbose] [-- RPMBUILD ARGS...]
#
#   --target T    build for distribution T on a host that is not T: loads packaging/rpm-targets/T.macros
#                 (el9: /usr/bin/python3 = 3.9; el8: the python39 module, /usr/bin/python3.9). Required
#                 on a host that is not RPM-based (Debian CI); on EL/Fedora the host's own macros are
#                 the target when no --target is given (same as `rpmbuild --rebuild` of the SRPM there).
#   --source DIR  tree to build (default: this repository; the tests build patched copies)
#   --out DIR     where the RPMs go (default: DIR/dist)
#   --python PY   interpreter that makes the sdist, runs the man page generator and whose nvidia-ml-py
#                 is bundled (default: the repository's .venv/bin/python, else python3)
#   --bytecompile-python PY
#                 interpreter of the TARGET's Python version that byte-compiles the code (default:
#                 the target's %__python3 if it exists here, else pythonX.Y on PATH, else pyenv's X.Y)
#   --nocheck     skip %check (rpmbuild --without check)
#   --release N   RPM Release number (default 1; the target's %dist is appended: 1.el9)
#   --verbose     show rpmbuild's output (otherwise only its tail, on failure)
#   -- ARGS       passed on to rpmbuild (e.g. more --define)
#
# The version is the sdist's (slurm_hooks.__version__); PEP 440 pre-releases become RPM tilde
# versions (0.2.0rc1 -> 0.2.0~rc1, which sorts before 0.2.0). The source RPM's spec carries the
# version, URL and changelog, so `rpmbuild --rebuild` and mock work on it without extra defines.
# On a host that is not RPM-based (Debian CI) rpmbuild runs with --nodeps: its RPM database is
# empty, so no BuildRequires could be satisfied.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
source_dir=$repo out_dir="" python="" bytecompile_python="" target="" check=1 release=1 verbose=0 extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --source) source_dir=$(cd "$2" && pwd); shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --bytecompile-python) bytecompile_python=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
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
rpm_based=0
rpm -q --quiet --whatprovides python3 2>/dev/null && rpm_based=1
target_args=()
if [ -n "$target" ]; then
  macros=$source_dir/packaging/rpm-targets/$target.macros
  if [ ! -f "$macros" ]; then
    known=$(cd "$source_dir/packaging/rpm-targets" && ls -- *.macros | sed 's/\.macros$//' | tr '\n' ' ')
    echo "build_rpm.sh: unknown --target $target (known: $known)" >&2; exit 2
  fi
  target_args=(--load "$macros")
elif [ "$rpm_based" = 0 ]; then
  echo "build_rpm.sh: this host is not RPM-based, so its Python says nothing about the nodes': pass --target el8 or el9" >&2
  exit 2
fi
target_eval() { rpm ${target_args[@]+"${target_args[@]}"} ${extra[@]+"${extra[@]}"} --eval "$1"; }
python3_version=$(target_eval '%{?python3_version}')
target_python=$(target_eval '%{?__python3}')
target_python=${target_python:-/usr/bin/python3}
if [ -z "$python3_version" ] && [ -x "$target_python" ]; then
  python3_version=$("$target_python" -Ic 'import sys; print("{}.{}".format(*sys.version_info))')
fi
[ -n "$python3_version" ] || { echo "build_rpm.sh: the target's Python version is unknown (no %python3_version, no $target_python)" >&2; exit 1; }

# The byte-compiler must be the target's version: its .pyc files are only read by that version.
version_of() { "$1" -Ic 'import sys; print("{}.{}".format(*sys.version_info))' 2>/dev/null; }
if [ -z "$bytecompile_python" ]; then
  for candidate in "$target_python" "$(command -v "python$python3_version" || true)" \
                   "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$python3_version".*/bin/python"$python3_version"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && [ "$(version_of "$candidate")" = "$python3_version" ]; then
      bytecompile_python=$candidate; break
    fi
  done
fi
[ -n "$bytecompile_python" ] || { echo "build_rpm.sh: no Python $python3_version here to byte-compile for the target: install one (pyenv install $python3_version) or pass --bytecompile-python" >&2; exit 1; }
[ "$(version_of "$bytecompile_python")" = "$python3_version" ] \
  || { echo "build_rpm.sh: --bytecompile-python $bytecompile_python is not Python $python3_version" >&2; exit 1; }

started=$(date +%s.%N)
work=$(mktemp -d "${TMPDIR:-/tmp}/slurm-hooks-rpm.XXXXXX")
trap 'rm -rf "$work"' EXIT
top=$work/rpmbuild
mkdir -p "$top"/{SOURCES,SPECS,BUILD,BUILDROOT,RPMS,SRPMS} "$work/sdist"

# 1. sdist, with setuptools >= 77 (pyproject metadata with an SPDX license); fetched into a temp
#    dir when too old.
if ! "$python" -c 'import sys, setuptools; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' 2>/dev/null; then
  echo "build_rpm.sh: $python has no setuptools >= 77; installing one into a temp dir" >&2
  "$python" -m pip install -q --target "$work/setuptools" 'setuptools>=77' >&2
  export PYTHONPATH=$work/setuptools${PYTHONPATH:+:$PYTHONPATH}
fi
# From a private copy of the tree: setuptools writes egg-info and a staging directory into the
# tree it builds, which two builds at once (or a read-only checkout) would trip over.
mkdir -p "$work/tree"
tar -C "$source_dir" --exclude=./.venv --exclude=./.git --exclude=./dist --exclude=./build --exclude='*.egg-info' \
    --exclude='__pycache__' -cf - . | tar -C "$work/tree" -xf -
sdist=$(cd "$work/tree" && SLURM_HOOKS_CHECKS_DIR= "$python" -c '
import contextlib, sys
from setuptools import build_meta
with contextlib.redirect_stdout(sys.stderr):
    name = build_meta.build_sdist(sys.argv[1])
print(name)' "$work/sdist" 2>"$work/sdist.log") || { cat "$work/sdist.log" >&2; exit 1; }
sdist_name=${sdist%.tar.gz}
version=$(tar -xzOf "$work/sdist/$sdist" "$sdist_name/PKG-INFO" | sed -n 's/^Version: //p' | head -n 1)
[ -n "$version" ] || { echo "build_rpm.sh: no Version in $sdist's PKG-INFO" >&2; exit 1; }
rpm_version=$(printf '%s\n' "$version" | sed -E 's/^([0-9.]*[0-9])\.?((a|b|rc|dev)[0-9]*)$/\1~\2/')
pkg_info=$(tar -xzOf "$work/sdist/$sdist" "$sdist_name/PKG-INFO")
project_url=$(printf '%s\n' "$pkg_info" | sed -n 's/^Project-URL: Homepage, //p' | head -n 1)
[ -n "$project_url" ] || { echo "build_rpm.sh: no Homepage in pyproject.toml's [project.urls]" >&2; exit 1; }
maintainer=$(printf '%s\n' "$pkg_info" | sed -n 's/^Maintainer-email: //p' | head -n 1)
[ -n "$maintainer" ] || { echo "build_rpm.sh: no maintainers in pyproject.toml" >&2; exit 1; }
# The changelog entry's date: SOURCE_DATE_EPOCH (reproducible builds), else today.
changelog_date=$(LC_ALL=C date -u -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}" '+%a %b %d %Y')

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
  printf '%%global release_number %s\n%%global project_url %s\n' "$release" "$project_url"
  tar -xzOf "$work/sdist/$sdist" "$sdist_name/packaging/slurm-hooks.spec"
  printf '* %s %s - %s-%s\n- slurm-hooks %s\n' "$changelog_date" "$maintainer" "$rpm_version" "$release" "$version"
} > "$top/SPECS/slurm-hooks.spec"

args=(${target_args[@]+"${target_args[@]}"} -ba --define "_topdir $top" --define "build_python $python"
      --define "bytecompile_python $bytecompile_python" ${extra[@]+"${extra[@]}"})
if [ "$rpm_based" = 0 ]; then
  args+=(--nodeps)  # not an RPM-based host: its RPM database knows no python3 or pytest
fi
if [ "$check" = 0 ]; then
  args+=(--without check)
else
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
echo "build_rpm.sh: slurm-hooks $rpm_version${target:+ for $target} built in $(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s" >&2
