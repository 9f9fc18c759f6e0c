#!/usr/bin/env bash
# What one worker (a TPU VM host, a SLURM node) runs for the launchers: find or clone the
# repository, install it once, then run the command in it.
#
#   launch/worker.sh [--install_only] -- python -m MODULE [FLAGS...]
#
# Environment (the launchers set it):
#   STORI_REPO_DIR  the repository on this worker (default: stori-jax, from the home folder)
#   STORI_REPO_URL  git URL to clone it from when it is missing (else a missing repository stops)
#   STORI_INSTALL   what pip installs in it (default: "-e ."; the TPU launcher adds "jax[tpu]")
#   STORI_PIP_ARGS  more pip arguments (default: none; the TPU launcher adds libtpu's index)
#   STORI_PYTHON    the Python to install into and run (default: python3)
#
# Installs once: pip runs only when the stamp <repo>/.stori_install (setup.py's digest, what is
# installed, the Python) differs or `import stori_jax` fails; an editable install ("-e .") keeps
# following the code, so a `git pull` needs no new install unless setup.py changed.
set -euo pipefail
install_only=0
if [ "${1:-}" = "--install_only" ]; then
  install_only=1
  shift
fi
if [ "${1:-}" = "--" ]; then shift; fi
if [ "$install_only" = 0 ] && [ "$#" = 0 ]; then
  echo "usage: $0 [--install_only] -- python -m MODULE [FLAGS...]" >&2
  exit 2
fi
host=$(hostname 2>/dev/null || echo "this worker")
repo=${STORI_REPO_DIR:-stori-jax}
python=${STORI_PYTHON:-python3}
if [ ! -f "$repo/setup.py" ]; then
  if [ -e "$repo" ]; then
    echo "error: ${host}: ${repo} is no stori-jax repository (no setup.py); point REPO_DIR at the repository" >&2
    exit 2
  fi
  if [ -z "${STORI_REPO_URL:-}" ]; then
    echo "error: ${host}: no repository at ${repo}; set REPO_URL=<git url> to clone it there, or REPO_DIR=<path> to where it is" >&2
    exit 2
  fi
  git clone --quiet "$STORI_REPO_URL" "$repo" || {
    echo "error: ${host}: git clone ${STORI_REPO_URL} failed (see above); check REPO_URL" >&2
    exit 2
  }
fi
cd "$repo"
install=${STORI_INSTALL:--e .}
pip_args=${STORI_PIP_ARGS:-}
stamp=".stori_install"
want="$(sha256sum setup.py | cut -d' ' -f1) ${install} ${pip_args} $(command -v "$python")"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$python" -c "import stori_jax" 2>/dev/null; then
  echo "${host}: installing stori-jax (${install}) in $(pwd)" >&2
  # Word splitting wanted: STORI_INSTALL and STORI_PIP_ARGS hold several pip arguments.
  # shellcheck disable=SC2086
  "$python" -m pip install --quiet ${install} ${pip_args}
  echo "$want" >"$stamp"
else
  echo "${host}: stori-jax already installed in $(pwd) (stamp ${stamp})" >&2
fi
if [ "$install_only" = 1 ]; then exit 0; fi
# The command as given, with this worker's Python for `python` / `python3`.
if [ "$1" = "python" ] || [ "$1" = "python3" ]; then
  shift
  exec "$python" "$@"
fi
exec "$@"
