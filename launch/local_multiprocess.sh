#!/usr/bin/env bash
# Several JAX processes on one machine, as a multi-host run would have (tests the
# multi-host path without a cluster). Each process gets DEVICES_PER_PROCESS CPU devices and
# runs `python -m $MODULE` (default stori_jax.train; mutual.analyze and mutual.sweep also take
# the flags).
#
#   launch/local_multiprocess.sh 2 --config configs/demo.py --workdir workdirs/demo_2proc
#   MODULE=mutual.analyze launch/local_multiprocess.sh 2 --config configs/mutual_synthetic.py \
#     --workdir workdirs/mutual_2proc
set -euo pipefail
NUM_PROCESSES=${1:?usage: $0 NUM_PROCESSES TRAIN_ARGS...}
shift
PORT=${PORT:-$((20000 + RANDOM % 20000))}
DEVICES_PER_PROCESS=${DEVICES_PER_PROCESS:-2}
PYTHON=${PYTHON:-python}
MODULE=${MODULE:-stori_jax.train}
pids=()
for ((i = 0; i < NUM_PROCESSES; i++)); do
  JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=${DEVICES_PER_PROCESS}" \
    "$PYTHON" -m "$MODULE" "$@" --coordinator="localhost:${PORT}" \
    --num_processes="${NUM_PROCESSES}" --process_id="$i" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
