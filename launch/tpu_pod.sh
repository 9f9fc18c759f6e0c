#!/usr/bin/env bash
# Runs few-shot SToRI on every worker of a Cloud TPU pod slice (one process per host;
# jax.distributed.initialize() auto-detects the pod). Prompts are sharded over all chips.
#
#   launch/tpu_pod.sh my-tpu us-central2-b --config configs/imagenet_16shot.py \
#       --workdir gs://my-bucket/stori/imagenet_16shot
#
# Needs: gcloud, the repository at $REPO_DIR on every worker (e.g. cloned by this script),
# the datasets and CuPL files on every worker (or a shared filesystem).
set -euo pipefail
TPU_NAME=${1:?usage: $0 TPU_NAME ZONE TRAIN_ARGS...}
ZONE=${2:?usage: $0 TPU_NAME ZONE TRAIN_ARGS...}
shift 2
REPO_DIR=${REPO_DIR:-stori-jax}
REPO_URL=${REPO_URL:-}
ARGS=$(printf ' %q' "$@")
SETUP="set -e; if [ -n '${REPO_URL}' ] && [ ! -d ${REPO_DIR} ]; then git clone ${REPO_URL} ${REPO_DIR}; fi; cd ${REPO_DIR}; \
  python3 -m pip install -q -e . 'jax[tpu]' -f https://storage.googleapis.com/jax-releases/libtpu_releases.html"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all \
  --command "${SETUP}; python3 -m stori_jax.train --distributed${ARGS}"
