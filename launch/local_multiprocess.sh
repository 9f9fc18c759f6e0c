#!/usr/bin/env bash
# Several JAX processes on one machine, as a multi-host run has them (the multi-host path
# without a cluster): N CPU processes, each with DEVICES_PER_PROCESS devices (default 2), an
# explicit coordinator on localhost:PORT (default: a random port).
#
#   launch/local_multiprocess.sh [--dry_run] N -- python -m MODULE [FLAGS...]
#
#   launch/local_multiprocess.sh 2 -- python -m stori_jax.train --config configs/demo.py \
#       --workdir workdirs/demo_2proc
#   launch/local_multiprocess.sh 2 -- python -m mutual.analyze --config configs/mutual_synthetic.py \
#       --workdir workdirs/mutual_2proc
#
# MODULE is one of the multi-host commands (stori_jax.train, stori_jax.run_grid, mutual.analyze,
# mutual.sweep); `python` is $PYTHON (default python) and runs from the current folder, so no
# install happens here. --dry_run prints each process's command line and runs nothing.
# (An older form, `MODULE=mutual.analyze launch/local_multiprocess.sh N FLAGS...` without `--`,
# still runs.)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=launch/command.sh
source "$here/command.sh"
STORI_USAGE="usage: $0 [--dry_run] N -- python -m MODULE [FLAGS...]"
dry_run=0
if [ "${1:-}" = "--dry_run" ]; then
  dry_run=1
  shift
fi
NUM_PROCESSES=${1:-}
case "$NUM_PROCESSES" in
  '' | *[!0-9]*) stori_die "$STORI_USAGE" ;;
esac
# One machine's CPU processes: from 1 up to STORI_MAX_PROCESSES (default 64); the length is
# checked first, so that a number too long for bash's arithmetic is refused, not wrapped.
max_processes=${STORI_MAX_PROCESSES:-64}
if [ "${#NUM_PROCESSES}" -gt 6 ] || [ $((10#$NUM_PROCESSES)) -lt 1 ] \
  || [ $((10#$NUM_PROCESSES)) -gt "$max_processes" ]; then
  stori_die "N (the number of processes) must be 1 to $max_processes on one machine, got $NUM_PROCESSES (STORI_MAX_PROCESSES raises the limit); $STORI_USAGE"
fi
NUM_PROCESSES=$((10#$NUM_PROCESSES))
shift
if [ "$#" = 0 ]; then stori_die "$STORI_USAGE"; fi
if [ "${1:-}" = "--" ]; then
  stori_parse_command "$@"
else  # the older form: the flags of $MODULE
  stori_parse_command -- python -m "${MODULE:-stori_jax.train}" "$@"
fi
if [ "$MULTIHOST" != 1 ]; then
  stori_die "$MODULE runs as one process (it takes no --coordinator); run it directly: python -m $MODULE ..."
fi
PORT=${PORT:-$((20000 + RANDOM % 20000))}
DEVICES_PER_PROCESS=${DEVICES_PER_PROCESS:-2}
PYTHON=${PYTHON:-python}
environment=(JAX_PLATFORMS=cpu "XLA_FLAGS=--xla_force_host_platform_device_count=${DEVICES_PER_PROCESS}")
if [ "$dry_run" = 1 ]; then
  for ((i = 0; i < NUM_PROCESSES; i++)); do
    echo "process $i of $NUM_PROCESSES: $(stori_quote "${environment[@]}" "$PYTHON" -m "$MODULE" "${FLAGS[@]}" \
      --coordinator="localhost:${PORT}" --num_processes="${NUM_PROCESSES}" --process_id="$i")"
  done
  exit 0
fi
pids=()
for ((i = 0; i < NUM_PROCESSES; i++)); do
  env "${environment[@]}" "$PYTHON" -m "$MODULE" "${FLAGS[@]}" --coordinator="localhost:${PORT}" \
    --num_processes="${NUM_PROCESSES}" --process_id="$i" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
