#!/usr/bin/env bash
# Build the slurm-hooks .deb (Architecture: all) with Debian's own tools from a source tree:
#   sdist (setuptools) -> slurm-hooks_V.orig.tar.gz, unpacked, + packaging/debian as debian/ (with a
#   changelog entry for V and the bundled pynvml.py) -> dpkg-buildpackage -us -uc (source + binary)
#   -> the .deb and source files copied to OUT, the .deb's path printed.
#
#   tools/build_deb.sh [--source DIR] [--out DIR] [--python PY] [--nocheck] [--revision N] [--verbose]
#
#   --source DIR  tree to build (default: this repository; the tests build patched copies)
#   --out DIR     where the packages go (default: DIR/dist)
#   --python PY   interpreter that makes the sdist and whose nvidia-ml-py is bundled
#                 (default: the repository's .venv/bin/python, else python3)
#   --nocheck     skip the unit tests run against the installed tree (DEB_BUILD_OPTIONS=nocheck)
#   --revision N  Debian revision (default 1): version V-N
#   --verbose     show dpkg-buildpackage's output (otherwise only its tail, on failure)
#
# Needs dpkg-dev, debhelper, dh-python and the Build-Depends of packaging/debian/control
# (Debian/Ubuntu: apt-get install dpkg-dev debhelper dh-python python3-pytest
# python3-toml; .ci/deb.sh does it). The version is slurm_hooks.__version__; PEP 440 pre-releases
# become Debian tilde versions (0.2.0rc1 -> 0.2.0~rc1, which sorts before 0.2.0).
# The source package (.dsc) rebuilds anywhere with `dpkg-source -x` + `dpkg-buildpackage`.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
source_dir=$repo out_dir="" python="" check=1 revision=1 verbose=0
while [ $# -gt 0 ]; do
  case $1 in
    --source) source_dir=$(cd "$2" && pwd); shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --nocheck) check=0; shift ;;
    --revision) revision=$2; shift 2 ;;
    --verbose) verbose=1; shift ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_deb.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
out_dir=${out_dir:-$source_dir/dist}
if [ -z "$python" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then python=$repo/.venv/bin/python; else python=python3; fi
fi
command -v dpkg-buildpackage >/dev/null && command -v dh >/dev/null \
  || { echo "build_deb.sh: dpkg-buildpackage/dh not found (apt-get install dpkg-dev debhelper dh-python)" >&2; exit 1; }

started=$(date +%s.%N)
work=$(mktemp -d "${TMPDIR:-/tmp}/slurm-hooks-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT

# 1. sdist from a private copy of the tree (setuptools writes into the tree it builds), with
#    setuptools >= 77 (fetched into a temp dir when the interpreter's is older).
mkdir -p "$work/tree" "$work/sdist"
tar -C "$source_dir" --exclude=./.venv --exclude=./.git --exclude=./dist --exclude=./build --exclude='*.egg-info' \
    --exclude='__pycache__' -cf - . | tar -C "$work/tree" -xf -
if ! "$python" -c 'import sys, setuptools; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' 2>/dev/null; then
  echo "build_deb.sh: $python has no setuptools >= 77; installing one into a temp dir" >&2
  "$python" -m pip install -q --target "$work/setuptools" 'setuptools>=77' >&2
  export PYTHONPATH=$work/setuptools${PYTHONPATH:+:$PYTHONPATH}
fi
sdist=$(cd "$work/tree" && SLURM_HOOKS_CHECKS_DIR= "$python" -c '
import contextlib, sys
from setuptools import build_meta
with contextlib.redirect_stdout(sys.stderr):
    name = build_meta.build_sdist(sys.argv[1])
print(name)' "$work/sdist" 2>"$work/sdist.log") || { cat "$work/sdist.log" >&2; exit 1; }
sdist_name=${sdist%.tar.gz}
pkg_info=$(tar -xzOf "$work/sdist/$sdist" "$sdist_name/PKG-INFO")
version=$(printf '%s\n' "$pkg_info" | sed -n 's/^Version: //p' | head -n 1)
[ -n "$version" ] || { echo "build_deb.sh: no Version in $sdist's PKG-INFO" >&2; exit 1; }
deb_version=$(printf '%s\n' "$version" | sed -E 's/^([0-9.]*[0-9])\.?((a|b|rc|dev)[0-9]*)$/\1~\2/')
maintainer=$(printf '%s\n' "$pkg_info" | sed -n 's/^Maintainer-email: //p' | head -n 1)
[ -n "$maintainer" ] || { echo "build_deb.sh: no maintainers in pyproject.toml" >&2; exit 1; }

# 2. the Debian source tree: orig tarball + unpacked sdist + debian/
mkdir -p "$work/build"
cp "$work/sdist/$sdist" "$work/build/slurm-hooks_$deb_version.orig.tar.gz"
tar -C "$work/build" -xzf "$work/sdist/$sdist"
tree=$work/build/slurm-hooks-$deb_version
mv "$work/build/$sdist_name" "$tree"
[ -d "$tree/packaging/debian" ] || { echo "build_deb.sh: $sdist has no packaging/debian (MANIFEST.in)" >&2; exit 1; }
cp -r "$tree/packaging/debian" "$tree/debian"
# the project's addresses, from pyproject.toml through PKG-INFO (never written in packaging/debian)
homepage=$(printf '%s\n' "$pkg_info" | sed -n 's/^Project-URL: Homepage, //p' | head -n 1)
[ -n "$homepage" ] || { echo "build_deb.sh: no Homepage in pyproject.toml's [project.urls]" >&2; exit 1; }
for file in "$tree/debian/control" "$tree/debian/copyright"; do
  escaped_maintainer=$(printf '%s' "$maintainer" | sed 's/[&|\\]/\\&/g')
  escaped_homepage=$(printf '%s' "$homepage" | sed 's/[&|\\]/\\&/g')
  sed -i -e "s|@MAINTAINER@|$escaped_maintainer|g" -e "s|@HOMEPAGE@|$escaped_homepage|g" "$file"
done
pynvml_file=$("$python" -c 'import pynvml; print(pynvml.__file__)') \
  || { echo "build_deb.sh: $python cannot import pynvml: pip install nvidia-ml-py" >&2; exit 1; }
install -D -m 0644 "$pynvml_file" "$tree/debian/vendor/pynvml.py"
# The changelog entry's date: SOURCE_DATE_EPOCH (reproducible builds), else now.
date_rfc2822=$(LC_ALL=C date -u -R -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}")
printf 'slurm-hooks (%s-%s) unstable; urgency=medium\n\n  * slurm-hooks %s.\n\n -- %s  %s\n' \
  "$deb_version" "$revision" "$version" "$maintainer" "$date_rfc2822" > "$tree/debian/changelog"

# 3. build (source + binary, unsigned)
options=${DEB_BUILD_OPTIONS:-}
[ "$check" = 1 ] || options="$options nocheck"
log=$work/dpkg-buildpackage.log
set +e
if [ "$verbose" = 1 ]; then
  (cd "$tree" && DEB_BUILD_OPTIONS=$options dpkg-buildpackage -us -uc) 2>&1 | tee "$log" >&2
  status=${PIPESTATUS[0]}
else
  (cd "$tree" && DEB_BUILD_OPTIONS=$options dpkg-buildpackage -us -uc) >"$log" 2>&1
  status=$?
fi
set -e
if [ "$status" != 0 ]; then
  [ "$verbose" = 1 ] || tail -n 60 "$log" >&2
  echo "build_deb.sh: dpkg-buildpackage failed (exit $status)" >&2
  exit 1
fi
mkdir -p "$out_dir"
for file in "$work"/build/*.deb "$work"/build/*.dsc "$work"/build/*.tar.* "$work"/build/*.buildinfo "$work"/build/*.changes; do
  [ -e "$file" ] && cp "$file" "$out_dir/"
done
echo "$(cd "$out_dir" && pwd)/slurm-hooks_${deb_version}-${revision}_all.deb"
echo "build_deb.sh: slurm-hooks $deb_version-$revision built in $(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s" >&2
