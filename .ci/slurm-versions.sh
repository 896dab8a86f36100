#!/usr/bin/env bash
# CI stage "Slurm versions": the Slurm-facing tests on every Slurm we support besides the host's, each
# in a Debian root of its own (.ci/slurm-root.sh). The host's own Slurm is covered by the README test
# command, which .ci/run runs before this.
#
#   bash .ci/slurm-versions.sh [NAME...]        default: the roots that complement the host's Slurm
#
#   host            host's Slurm   roots run here
#   Debian 12       22.05          trixie (24.11), sid (26.05), slurm25 (25.11 + the real pyslurm)
#   Debian 13       24.11          bookworm (22.05), sid (26.05), slurm25
#   anything else   -              bookworm, trixie, sid, slurm25
#
# Roots are built all at once (SLURM_HOOKS_ROOTS_PARALLEL=0: one after the other): from scratch on 2
# cores that took 652 s against 759 s in a row (debootstrap and apt wait on the network while Slurm
# compiles); a cached root costs ~1 s either way. They are tested one at a time: the tests start real
# daemons and wait on them, and on 2 cores two suites side by side would be testing the machine's load.
# A failing root does not stop the others; any failure fails the stage. At the end: time per step,
# pass/skip/fail counts per Slurm version and drain backend, root sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${SLURM_HOOKS_ROOTS:-/var/tmp/slurm-hooks-roots}
export SLURM_HOOKS_ROOTS=$BASE
export SLURM_HOOKS_RESULTS=${SLURM_HOOKS_RESULTS:-$BASE/results/last-run}
T0=$SECONDS

host_suite() { (. /etc/os-release 2>/dev/null && [ "${ID:-}" = debian ] && echo "${VERSION_CODENAME:-}") || true; }

if [ $# -gt 0 ]; then
  roots=("$@")
else
  roots=()
  host=$(host_suite)
  for suite in bookworm trixie sid; do [ "$suite" = "$host" ] || roots+=("$suite"); done
  roots+=(slurm25)
fi
rm -rf "$SLURM_HOOKS_RESULTS"; mkdir -p "$SLURM_HOOKS_RESULTS"
echo "== Slurm versions: roots ${roots[*]} under $BASE (host: $(host_suite || true), $(/usr/sbin/slurmd -V 2>/dev/null || echo 'no slurmd'))"

failed=()
if [ "${SLURM_HOOKS_ROOTS_PARALLEL:-1}" = 1 ]; then
  # once, here: three builds installing it at the same time would fight over dpkg's lock
  command -v debootstrap >/dev/null || { apt-get update -qq; apt-get install -y -qq debootstrap >/dev/null; }
  pids=()
  for name in "${roots[@]}"; do
    bash .ci/slurm-root.sh build "$name" >"$SLURM_HOOKS_RESULTS/$name.build.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!roots[@]}"; do
    if ! wait "${pids[$i]}"; then
      failed+=("${roots[$i]} (build)"); tail -n 30 "$SLURM_HOOKS_RESULTS/${roots[$i]}.build.log"
    fi
  done
  cat "$SLURM_HOOKS_RESULTS"/*.build.log
  echo "== all roots built at once: $((SECONDS - T0)) s"
fi

for name in "${roots[@]}"; do
  case " ${failed[*]-} " in *" $name (build) "*) continue ;; esac
  bash .ci/slurm-root.sh test "$name" || failed+=("$name")
done

echo
echo "== Slurm versions: results (JUnit XML in $SLURM_HOOKS_RESULTS)"
cat "$SLURM_HOOKS_RESULTS/summary.txt" 2>/dev/null || echo "(no test results)"
echo "== time per step (s)"
awk '{ label = $2; for (i = 3; i < NF; i++) label = label " " $i; printf "  %-10s %-28s %5d\n", $1, label, $NF }' \
  "$SLURM_HOOKS_RESULTS/timings.txt" 2>/dev/null || true
echo "== root sizes"
for name in "${roots[@]}"; do
  [ -d "$BASE/$name" ] && printf '  %-10s %s\n' "$name" "$(du -sh --one-file-system "$BASE/$name" | cut -f1)"
done
echo "== Slurm versions stage: $((SECONDS - T0)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "Slurm versions FAILED: ${failed[*]}" >&2
  exit 1
fi
