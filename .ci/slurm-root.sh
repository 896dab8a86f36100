#!/usr/bin/env bash
# The Slurm-facing tests against another Slurm version, in a Debian root (chroot) of its own.
#
#   bash .ci/slurm-root.sh build NAME          build the root, or reuse it if what built it is unchanged
#   bash .ci/slurm-root.sh test NAME [ARGS]    build/reuse, copy this checkout in, run its Slurm tests
#   bash .ci/slurm-root.sh shell NAME          an interactive shell inside (mounts up, its own /run)
#   bash .ci/slurm-root.sh run NAME CMD...     one command inside, in the copied checkout, venv on PATH
#   bash .ci/slurm-root.sh clean NAME          delete the root
#   bash .ci/slurm-root.sh source slurm25      print the checked path of the Slurm source tarball
#
#   NAME      Debian     Slurm                                   what `test` runs inside (pytest)
#   bookworm  12         22.05 (Debian's packages)               -m slurm
#   trixie    13         24.11 (Debian's packages)               -m slurm
#   sid       unstable   26.05 (Debian's packages)               -m slurm
#   slurm25   13         25.11.7 built from shared/vendor,       -m slurm with [drain] backend "scontrol"
#                        real pyslurm 25.11.x from PyPI          (the contract suite also runs on the real
#                                                                pyslurm), then the end-to-end modules
#                                                                again with [drain] backend "pyslurm"
#   ARGS replace the default pytest arguments (one pass, drain backend from the environment).
#   tests/test_deb.py (marked slurm) is left to the host run: it is about packaging for the host's Debian.
#
# Roots live under $SLURM_HOOKS_ROOTS (default /var/tmp/slurm-hooks-roots), never in the checkout. Each
# build step leaves a stamp: a hash of the previous step's stamp, the step's own code and its inputs
# (suite, mirror, package list, tarball checksum, pyproject.toml). A step whose stamp matches is skipped,
# a changed step is redone with every step after it, and a root older than $SLURM_HOOKS_ROOT_MAX_AGE_DAYS
# (default 7: sid moves) is built afresh. One run at a time per root (flock).
#
# Inside, everything the tests start (munged, slurmctld, slurmd) runs with the root's own /run, so the
# host's munged is neither used nor touched; at exit the processes rooted there are stopped by pid and
# the mounts undone. Results: JUnit XML per pass in $SLURM_HOOKS_RESULTS (default $SLURM_HOOKS_ROOTS/results),
# and one summary line per pass in its summary.txt.
#
# Needs root, debootstrap (installed if missing), the Debian mirror of this machine's apt sources (or
# DEBIAN_MIRROR), PyPI (pip, inside the root). slurm25 needs the Slurm 25.11.7 source tarball: it is read
# from the project's shared/ directory beside the checkout (see find_shared), never copied into the repo.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
BASE=$(realpath -m "${SLURM_HOOKS_ROOTS:-/var/tmp/slurm-hooks-roots}")  # absolute: compared with /proc/PID/root
RESULTS=${SLURM_HOOKS_RESULTS:-$BASE/results}
MAX_AGE_DAYS=${SLURM_HOOKS_ROOT_MAX_AGE_DAYS:-7}
JOBS=${JOBS:-$(nproc)}
SLURM25_TARBALL_NAME=slurm-25.11.7.tar.bz2
PYSLURM_SPEC=${PYSLURM_SPEC:-pyslurm==25.11.*}
IN_ROOT_REPO=/root/slurm-hooks
VENV=/opt/slurm-hooks-venv
export DEBIAN_FRONTEND=noninteractive

die() { echo "slurm-root: $*" >&2; exit 2; }

CMD=${1:-}; NAME=${2:-}
[ -n "$CMD" ] && [ -n "$NAME" ] || die "usage: $0 build|test|shell|run|clean|source NAME [pytest args]  (NAME: bookworm trixie sid slurm25)"
shift 2
case "$NAME" in
  bookworm|trixie|sid) SUITE=$NAME; KIND=debian ;;
  slurm25) SUITE=trixie; KIND=source ;;
  *) die "unknown root '$NAME' (bookworm trixie sid slurm25)" ;;
esac
case "$BASE/" in "$REPO/"*) die "roots must live outside the checkout ($BASE is inside $REPO)" ;; esac
R=$BASE/$NAME
STAMPS=$R/var/lib/slurm-hooks-ci
T0=$SECONDS
log() { echo "== [$NAME +$((SECONDS - T0))s] $*"; }

# Every step's wall time goes to stdout and to $RESULTS/timings.txt ("NAME STEP SECONDS"). Call it
# outside conditions (no `if`, `||`), so errexit stays on inside the step and a failing step ends
# the script; inside a condition it returns the step's status.
timed() {  # timed LABEL CMD...
  local label=$1 t0=$SECONDS rc; shift
  log "$label"
  "$@"; rc=$?
  log "$label: $((SECONDS - t0)) s$([ "$rc" = 0 ] || echo " (rc=$rc)")"
  mkdir -p "$RESULTS"; echo "$NAME $label $((SECONDS - t0))" >>"$RESULTS/timings.txt"
  return $rc
}

# ------------------------------------------------------------------------------------------------
# where things come from

debian_mirror() {  # the first Debian archive URL in this machine's apt sources
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | grep -E '^(deb|URIs:)\s' | tr ' \t' '\n\n' | grep -m1 -E '^https?://[^ ]*/debian/?$' || true
}

find_shared() {  # the project's shared/ dir: $SLURM_HOOKS_SHARED, else beside the checkout, else beside
  # the repository it belongs to (a git worktree's main checkout; the origin a CI clone was made from)
  local cands=() common origin d
  [ -n "${SLURM_HOOKS_SHARED:-}" ] && cands+=("$SLURM_HOOKS_SHARED")
  cands+=("$REPO/../shared")
  common=$(git -C "$REPO" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
  [ -n "$common" ] && cands+=("$(dirname "$common")/../shared")
  origin=$(git -C "$REPO" config --get remote.origin.url 2>/dev/null || true)
  case "$origin" in
    /*|file://*)
      origin=${origin#file://}; cands+=("${origin%/.git}/../shared")
      common=$(git -C "$origin" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
      [ -n "$common" ] && cands+=("$(dirname "$common")/../shared") ;;  # the origin is a worktree
  esac
  for d in "${cands[@]}"; do
    if [ -f "$d/vendor/$SLURM25_TARBALL_NAME" ]; then (cd "$d" && pwd); return 0; fi
  done
  echo "slurm-root: the Slurm 25.11 source ($SLURM25_TARBALL_NAME) is not in any shared/vendor/ here:" >&2
  printf '  %s\n' "${cands[@]}" >&2
  echo "  set SLURM_HOOKS_SHARED to the project's shared/ directory (it is never copied into the repository)" >&2
  return 1
}

slurm25_tarball() {  # path of the verified tarball
  local shared sum
  shared=$(find_shared) || exit 2
  sum=$(grep " $SLURM25_TARBALL_NAME\$" "$shared/vendor/SHA256SUMS" 2>/dev/null | cut -d' ' -f1) || true
  [ -n "$sum" ] || die "no checksum for $SLURM25_TARBALL_NAME in $shared/vendor/SHA256SUMS"
  echo "$sum  $shared/vendor/$SLURM25_TARBALL_NAME" | sha256sum --check --quiet >&2 \
    || die "$shared/vendor/$SLURM25_TARBALL_NAME does not match its SHA256SUMS entry"
  echo "$shared/vendor/$SLURM25_TARBALL_NAME"
}

# ------------------------------------------------------------------------------------------------
# running things inside

in_root() {  # in_root CMD: bash -c CMD inside the root with a clean environment
  chroot "$R" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive TERM="${TERM:-dumb}" bash -c "$1"
}

root_pids() {  # processes whose root directory is $R
  local p
  for p in /proc/[0-9]*; do [ "$(readlink "$p/root" 2>/dev/null)" = "$R" ] && echo "${p#/proc/}"; done; true
}

mounts_under() { awk -v r="$R/" 'index($2, r) == 1 { print $2 }' /proc/self/mounts; }

mount_root() {
  mountpoint -q "$R/proc" || mount -t proc proc "$R/proc"
  mountpoint -q "$R/sys" || { mount --rbind /sys "$R/sys" && mount --make-rslave "$R/sys"; }
  mountpoint -q "$R/dev" || { mount --bind /dev "$R/dev"; }
  mkdir -p "$R/dev/pts" "$R/dev/shm"
  mountpoint -q "$R/dev/pts" || mount --bind /dev/pts "$R/dev/pts"
  mountpoint -q "$R/dev/shm" || mount -t tmpfs -o mode=1777 shm "$R/dev/shm"
  mountpoint -q "$R/run" || mount -t tmpfs -o mode=0755 run "$R/run"  # its own munged socket
}

unmount_root() {  # stop what still runs in the root (by pid), then undo the mounts
  local pids pid i m
  pids=$(root_pids)
  if [ -n "$pids" ]; then
    log "stopping what still runs in the root: $(for pid in $pids; do printf '%s(%s) ' "$pid" "$(cat /proc/"$pid"/comm 2>/dev/null)"; done)"
    for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
    for i in $(seq 50); do [ -z "$(root_pids)" ] && break; sleep 0.1; done
    for pid in $(root_pids); do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.2
  fi
  for m in run dev/shm dev/pts dev proc sys; do
    if mountpoint -q "$R/$m"; then
      umount -R "$R/$m" 2>/dev/null || { log "umount $R/$m failed (busy?): detaching it lazily"; umount -R -l "$R/$m" || true; }
    fi
  done
}

remove_root() {  # never while anything is mounted inside (rm would reach the host's /dev, /sys)
  unmount_root
  [ -z "$(mounts_under)" ] || die "still mounted under $R: $(mounts_under | tr '\n' ' ')"
  rm -rf --one-file-system "$R"
}

# ------------------------------------------------------------------------------------------------
# build steps: each one idempotent; `ensure STEP INPUTS...` runs it unless its stamp matches

PREV_KEY=""; REDO=""
ensure() {
  local step=$1 key
  key=$( { echo "$PREV_KEY"; declare -f "$step"; printf '%s\n' "$@"; } | sha256sum | cut -c1-16)
  if [ -z "$REDO" ] && [ "$(cat "$STAMPS/$step" 2>/dev/null)" = "$key" ]; then
    PREV_KEY=$key; return 0
  fi
  REDO=1  # this step changed: every later one is redone too
  timed "$step" "$step"
  mkdir -p "$STAMPS"; echo "$key" >"$STAMPS/$step"
  PREV_KEY=$key
}

step_debootstrap() {
  command -v debootstrap >/dev/null || { apt-get update -qq; apt-get install -y -qq debootstrap >/dev/null; }
  remove_root
  mkdir -p "$BASE"
  debootstrap --variant=minbase "$SUITE" "$R" "$MIRROR" >"$BASE/$NAME.debootstrap.log" 2>&1 || {
    tail -n 20 "$BASE/$NAME.debootstrap.log"; die "debootstrap $SUITE failed (log: $BASE/$NAME.debootstrap.log)"; }
}

configure_root() {  # cheap files, rewritten on every use (the host's resolver and CAs may change)
  # the host's names: slurmctld resolves the submit host ("vm") of an srun; without it each lookup
  # retries for ~10 s while slurmctld holds the job COMPLETING
  { cat /etc/hosts
    grep -qw localhost /etc/hosts || printf '127.0.0.1\tlocalhost\n'
    grep -qw "$(hostname)" /etc/hosts || printf '127.0.1.1\t%s\n' "$(hostname)"; } >"$R/etc/hosts"
  echo 'Acquire::Check-Valid-Until "false";' >"$R/etc/apt/apt.conf.d/99no-valid-until"  # frozen mirror snapshots
  printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"; chmod 0755 "$R/usr/sbin/policy-rc.d"  # no daemons from apt
  cp -L /etc/resolv.conf "$R/etc/resolv.conf"
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then  # a TLS-inspecting egress: pip needs them
    mkdir -p "$R/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/"
  fi
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\ndisable-pip-version-check = 1\n' >"$R/etc/pip.conf"
}

DEBIAN_PKGS="ca-certificates python3 python3-venv gcc libc6-dev slurmctld slurmd slurm-client munge"
SOURCE_PKGS="ca-certificates python3 python3-venv python3-dev gcc libc6-dev make bzip2 pkgconf libmunge-dev munge"

step_packages() {
  local pkgs=$DEBIAN_PKGS
  [ "$KIND" = source ] && pkgs=$SOURCE_PKGS
  in_root "apt-get update -qq && apt-get install -y -qq --no-install-recommends $pkgs >/dev/null \
    && update-ca-certificates >/dev/null && apt-get clean"
}

# Slurm 25.11 the way SchedMD's RPMs lay it out (/usr, /usr/lib64, /etc/slurm): binaries where slurmd's
# PATH-less hooks find them, libslurmfull where pyslurm looks by default. Optional plugins off.
step_slurm_build() {
  local src=/usr/src/${SLURM25_TARBALL_NAME%.tar.bz2}
  rm -rf "${R:?}$src"
  tar -xjf "$TARBALL" -C "$R/usr/src"
  timed "configure" in_root "cd $src && ./configure --prefix=/usr --libdir=/usr/lib64 --sysconfdir=/etc/slurm \
    --disable-slurmrestd --disable-sview --disable-x11 --disable-pam --disable-debug \
    --without-hwloc --without-lua --without-readline >/usr/src/configure.log 2>&1" \
    || { tail -n 30 "$R/usr/src/configure.log"; die "configure failed"; }
  timed "make -j$JOBS" in_root "cd $src && make -j$JOBS >/usr/src/make.log 2>&1" \
    || { grep -m5 -B2 -A5 ' error' "$R/usr/src/make.log"; die "make failed (log: $R/usr/src/make.log)"; }
  timed "make install" in_root "cd $src && make -j$JOBS install >/usr/src/make-install.log 2>&1 \
    && echo /usr/lib64 >/etc/ld.so.conf.d/slurm.conf && ldconfig && rm -rf $src" \
    || { tail -n 30 "$R/usr/src/make-install.log"; die "make install failed"; }
  in_root '/usr/sbin/slurmd -V'
}

# The real pyslurm, built from PyPI's sdist against the Slurm above, kept as a wheel for the test venv.
step_pyslurm_wheel() {
  in_root "rm -rf /opt/pyslurm-build /opt/wheels && python3 -m venv /opt/pyslurm-build \
    && SLURM_LIB_DIR=/usr/lib64 SLURM_INCLUDE_DIR=/usr/include PYSLURM_BUILD_JOBS=$JOBS \
       /opt/pyslurm-build/bin/pip wheel -v --no-deps --no-binary pyslurm -w /opt/wheels '$PYSLURM_SPEC' \
       >/usr/src/pyslurm-wheel.log 2>&1 && rm -rf /opt/pyslurm-build" \
    || { grep -m5 -i -A3 'error' "$R/usr/src/pyslurm-wheel.log"; tail -n 20 "$R/usr/src/pyslurm-wheel.log"; die "pyslurm build failed"; }
  ls "$R"/opt/wheels/
}

# The test venv: this project with its test extras (and the pyslurm wheel). Editable, pointing at
# $IN_ROOT_REPO, which copy_checkout refreshes on every run; rebuilt when pyproject.toml changes.
step_venv() {
  in_root "rm -rf $VENV && python3 -m venv $VENV && $VENV/bin/pip install -q --upgrade pip >/dev/null \
    && cd $IN_ROOT_REPO && $VENV/bin/pip install -e '.[test]' >/usr/src/venv.log 2>&1 \
    && if [ -d /opt/wheels ]; then $VENV/bin/pip install -q /opt/wheels/pyslurm-*.whl; fi" \
    || { tail -n 30 "$R/usr/src/venv.log"; die "the test venv could not be built"; }
}

copy_checkout() {  # this checkout's files as they are (tracked and untracked, not ignored) into the root
  local dst=$R$IN_ROOT_REPO
  rm -rf --one-file-system "$dst"; mkdir -p "$dst"
  git -C "$REPO" ls-files -z --cached --others --exclude-standard \
    | tar -C "$REPO" --null --files-from=- --ignore-failed-read -cf - 2>/dev/null | tar -C "$dst" -xf -
}

build() {
  MIRROR=$(debian_mirror)
  [ -n "$MIRROR" ] || die "no Debian mirror in this machine's apt sources; set DEBIAN_MIRROR"
  local age_days=""
  if [ -f "$STAMPS/step_debootstrap" ]; then
    age_days=$(( ($(date +%s) - $(stat -c %Y "$STAMPS/step_debootstrap")) / 86400 ))
    if [ "$age_days" -ge "$MAX_AGE_DAYS" ]; then log "root is $age_days days old: building it afresh"; REDO=1; fi
  fi
  if [ "$KIND" = source ]; then TARBALL=$(slurm25_tarball); fi
  ensure step_debootstrap "$SUITE" "$MIRROR"
  configure_root
  mount_root
  ensure step_packages "$DEBIAN_PKGS" "$SOURCE_PKGS"
  if [ "$KIND" = source ]; then
    ensure step_slurm_build "$(sha256sum <"$TARBALL")" "$JOBS"
    ensure step_pyslurm_wheel "$PYSLURM_SPEC"
  fi
  copy_checkout
  ensure step_venv "$(sha256sum <"$REPO/pyproject.toml")"
  log "ready: $(in_root '/usr/sbin/slurmd -V; python3 -V; '"$VENV"'/bin/pip list 2>/dev/null | grep -i "^pyslurm " || true' | tr '\n' ' ')"
  log "root size: $(du -sh --one-file-system "$R" | cut -f1)"
}

# ------------------------------------------------------------------------------------------------
# test passes

# One pytest run inside; $1 a label, $2 the drain backend the end-to-end rig configures ("" = the
# default, auto); the rest pytest's arguments. Keeps the JUnit XML and prints/records a summary line.
test_pass() {
  local label=$1 backend=$2 rc=0 xml; shift 2
  xml=/root/results/$label.xml
  in_root "rm -rf /root/results; mkdir -p /root/results"
  timed "pytest $label" in_root "cd $IN_ROOT_REPO && CI=true SLURM_HOOKS_TEST_DRAIN_BACKEND=$backend \
    SLURM_HOOKS_TEST_REQUIRE_PYSLURM=$([ "$KIND" = source ] && echo 1) \
    $VENV/bin/python -m pytest -p no:cacheprovider -o junit_family=xunit1 --junitxml=$xml $(printf '%q ' "$@")" || rc=$?
  mkdir -p "$RESULTS"
  cp "$R$xml" "$RESULTS/$NAME-$label.xml" 2>/dev/null || true
  summarize "$RESULTS/$NAME-$label.xml" "$NAME ($(in_root '/usr/sbin/slurmd -V' | tr -d '\n'))" "$label" "$rc" \
    | tee -a "$RESULTS/summary.txt"
  return $rc
}

summarize() {  # summarize XML WHAT LABEL RC: "slurm 25.11.7  pyslurm  41 passed, 2 skipped, 0 failed (rc 0)"
  python3 - "$@" <<'PY'
import sys, xml.etree.ElementTree as ET
path, what, label, rc = sys.argv[1:5]
try:
    root = ET.parse(path).getroot()
except (OSError, ET.ParseError) as exc:
    print("%-32s %-10s no results (%s), pytest rc %s" % (what, label, exc.__class__.__name__, rc))
    sys.exit(0)
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
secs = sum(float(s.get("time", 0)) for s in suites)
print("%-32s %-10s %3d passed, %2d skipped, %2d failed, %2d errors in %4.0f s (rc %s)"
      % (what, label, passed, n["skipped"], n["failures"], n["errors"], secs, rc))
for case in root.iter("testcase"):
    for tag in ("failure", "error"):
        if case.find(tag) is not None:
            print("    %s: %s::%s" % (tag.upper(), case.get("classname"), case.get("name")))
PY
}

E2E_MODULES=(tests/test_e2e_slurm.py tests/test_fault_matrix_slurm.py tests/test_slurm_faults.py tests/test_drain_slurm.py)
# Marked slurm (a real slurmd runs the installed prolog) but about packaging for the host's Debian:
# tests/test_deb.py runs in the host run, where .ci/deb.sh installs its tools.
HOST_ONLY=(--ignore=tests/test_deb.py)

run_tests() {
  local rc=0
  if [ $# -gt 0 ]; then
    test_pass custom "${SLURM_HOOKS_TEST_DRAIN_BACKEND:-}" "$@" || rc=$?
  elif [ "$KIND" = source ]; then
    # pass 1: every Slurm test, the rig's drains through scontrol; the contract suite runs its three
    # backends (scontrol, the pyslurm double, the real pyslurm) in this pass
    test_pass scontrol scontrol -q -m slurm "${HOST_ONLY[@]}" || rc=$?
    # pass 2: the end-to-end drain/resume/breaker modules again, the hooks draining through pyslurm
    test_pass pyslurm pyslurm -q -m slurm "${E2E_MODULES[@]}" || rc=$?
  else
    test_pass scontrol "" -q -m slurm "${HOST_ONLY[@]}" || rc=$?
  fi
  return $rc
}

# ------------------------------------------------------------------------------------------------

if [ "$CMD" = source ]; then  # where the Slurm source would come from (checked), nothing else
  [ "$KIND" = source ] || die "$NAME is built from Debian's packages, not from a source tarball"
  slurm25_tarball
  exit 0
fi
[ "$(id -u)" = 0 ] || die "needs root (chroot, mount, debootstrap)"
mkdir -p "$BASE"
exec 9>"$BASE/$NAME.lock"
flock -w 3600 9 || die "another run holds $BASE/$NAME.lock"
trap unmount_root EXIT

case "$CMD" in
  build) timed "build" build ;;
  test) timed "build" build; run_tests "$@" ;;
  shell) build; in_root "cd $IN_ROOT_REPO && exec bash -i" ;;
  run) build; in_root "cd $IN_ROOT_REPO && PATH=$VENV/bin:\$PATH && $*" ;;
  clean) remove_root; log "removed $R" ;;
  *) die "unknown command '$CMD' (build test shell run clean)" ;;
esac
