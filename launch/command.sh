# Sourced by the launchers: reads the command they run, `-- python -m MODULE [FLAGS...]`.
#
#   stori_parse_command "$@"   # the launcher's arguments from "--" on
#
# sets MODULE (the module after -m), FLAGS (an array: the command's own arguments) and
# MULTIHOST (1 for the commands that run on every host: they take --distributed and
# --coordinator / --num_processes / --process_id, stori_jax.plumbing.multihost; 0 for a
# command that runs as one process). A command line of another shape stops with one line.

# The commands that call stori_jax.plumbing.multihost.define_flags (tests/test_launch.py checks
# this list against the code).
STORI_MULTIHOST_MODULES="stori_jax.train stori_jax.run_grid mutual.analyze mutual.sweep"
# Variables the launchers pass on to every worker when they are set here.
STORI_FORWARDED_ENV="STORI_BARRIER_TIMEOUT_S STORI_COMPILATION_CACHE JAX_COMPILATION_CACHE_DIR STORI_SHARED_DATA"

stori_die() {
  echo "error: $*" >&2
  exit 2
}

stori_parse_command() {
  if [ "${1:-}" != "--" ]; then
    stori_die "${STORI_USAGE:-give the command after --: -- python -m MODULE [FLAGS...]}"
  fi
  shift
  case "${1:-}" in
    python | python3) ;;
    "") stori_die "no command after --; for example: -- python -m stori_jax.train --config configs/demo.py" ;;
    *) stori_die "the command after -- must be \`python -m MODULE [FLAGS...]\` (a command of the project, e.g. python -m mutual.analyze --config ...), got: $*" ;;
  esac
  if [ "${2:-}" != "-m" ] || [ -z "${3:-}" ]; then
    stori_die "the command after -- must be \`python -m MODULE [FLAGS...]\`, got: $*"
  fi
  MODULE=$3
  shift 3
  FLAGS=("$@")
  MULTIHOST=0
  local module
  for module in $STORI_MULTIHOST_MODULES; do
    if [ "$module" = "$MODULE" ]; then MULTIHOST=1; fi
  done
  local flag
  for flag in "${FLAGS[@]}"; do
    case "$flag" in
      --distributed* | --coordinator* | --num_processes* | --process_id*)
        stori_die "leave $flag out: the launcher adds the flags of a multi-process run itself" ;;
    esac
  done
}

# "NAME=value ..." (shell-quoted) of the forwarded variables that are set.
stori_forwarded_env() {
  local name out=""
  for name in $STORI_FORWARDED_ENV; do
    if [ -n "${!name:-}" ]; then out+="$name=$(printf '%q' "${!name}") "; fi
  done
  printf '%s' "$out"
}

# The arguments shell-quoted, on one line.
stori_quote() {
  local out="" arg
  for arg in "$@"; do out+="$(printf '%q' "$arg") "; done
  printf '%s' "${out% }"
}
