#!/usr/bin/env bash
# Runs a command of the project on a Cloud TPU VM or pod slice, one process per host.
#
#   launch/tpu_pod.sh [--dry_run] TPU_NAME ZONE -- python -m MODULE [FLAGS...]
#
#   REPO_URL=https://github.com/me/stori-jax.git launch/tpu_pod.sh my-tpu us-central2-b \
#       -- python -m stori_jax.train --config configs/imagenet_16shot.py \
#       --workdir gs://my-bucket/stori/imagenet_16shot
#   launch/tpu_pod.sh --dry_run my-tpu us-central2-b -- python -m mutual.analyze \
#       --config configs/mutual_imagenet.py --workdir gs://my-bucket/mutual   # prints, runs nothing
#
# The multi-host commands (stori_jax.train, stori_jax.run_grid, mutual.analyze, mutual.sweep)
# run on every worker with --distributed added (jax.distributed.initialize() finds the pod);
# any other command runs on worker 0 alone. On each worker launch/worker.sh (sent along) finds
# the repository at REPO_DIR (default stori-jax, under the worker's home) or clones REPO_URL
# there, installs it once (INSTALL, default `-e .[gcs] jax[tpu]`: gcsfs for gs:// workdirs,
# with libtpu's index; skipped when its stamp shows it installed), then runs the command there. A missing repository without
# REPO_URL stops each worker with one line. STORI_BARRIER_TIMEOUT_S, STORI_COMPILATION_CACHE,
# JAX_COMPILATION_CACHE_DIR and STORI_SHARED_DATA are passed on when set.
#
# Needs: gcloud (not for --dry_run); the datasets on every worker or a shared bucket.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=launch/command.sh
source "$here/command.sh"
STORI_USAGE="usage: $0 [--dry_run] TPU_NAME ZONE -- python -m MODULE [FLAGS...]"
dry_run=0
if [ "${1:-}" = "--dry_run" ]; then
  dry_run=1
  shift
fi
if [ "$#" -lt 2 ] || [ "$1" = "--" ] || [ "$2" = "--" ]; then stori_die "$STORI_USAGE"; fi
TPU_NAME=$1
ZONE=$2
if [ -z "$TPU_NAME" ] || [ -z "$ZONE" ]; then
  stori_die "the TPU name and the zone may not be empty (got '$TPU_NAME' and '$ZONE'); $STORI_USAGE"
fi
shift 2
stori_parse_command "$@"
REPO_DIR=${REPO_DIR:-stori-jax}
REPO_URL=${REPO_URL:-}
INSTALL=${INSTALL:--e .[gcs] jax[tpu]}
PIP_ARGS=${PIP_ARGS:--f https://storage.googleapis.com/jax-releases/libtpu_releases.html}
if [ "$MULTIHOST" = 1 ]; then
  workers=all
  FLAGS+=(--distributed)
else
  workers=0
fi
env_line="STORI_REPO_DIR=$(printf '%q' "$REPO_DIR") STORI_REPO_URL=$(printf '%q' "$REPO_URL")"
env_line+=" STORI_INSTALL=$(printf '%q' "$INSTALL") STORI_PIP_ARGS=$(printf '%q' "$PIP_ARGS")"
env_line+=" $(stori_forwarded_env)"
run_line="${env_line% } bash ~/.stori_worker.sh -- python3 -m $MODULE $(stori_quote "${FLAGS[@]}")"
# worker.sh goes along in the command (the repository may not be on the worker yet).
payload=$(base64 -w0 <"$here/worker.sh")
remote="echo $payload | base64 -d > ~/.stori_worker.sh && ${run_line% }"
if [ "$dry_run" = 1 ]; then
  echo "gcloud compute tpus tpu-vm ssh $(printf '%q' "$TPU_NAME") --zone $(printf '%q' "$ZONE") --worker=$workers --command '<below>'"
  if [ "$workers" = all ]; then
    echo "every worker of the pod (process index from the pod) runs:"
  else
    echo "worker 0 runs ($MODULE is a single-process command):"
  fi
  echo "  ${run_line% }"
  echo "(~/.stori_worker.sh: launch/worker.sh, sent along in the command)"
  exit 0
fi
command -v gcloud >/dev/null || stori_die "gcloud not found: install the Google Cloud CLI (or pass --dry_run to see what each worker would run)"
exec gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker="$workers" --command "$remote"
