# shellcheck shell=bash
# Shared helpers for the bash tools in tools/. Source it, do not run it:
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The program name used as a prefix in messages ("zk", "test", ...).
TOOL_NAME=${TOOL_NAME:-$(basename "$0")}

# note MSG...: a progress message on stderr.
note() { printf '%s: %s\n' "$TOOL_NAME" "$*" >&2; }

# die MSG...: an error message on stderr, then exit 1.
die() {
  printf '%s: error: %s\n' "$TOOL_NAME" "$*" >&2
  exit 1
}

# have CMD: true when CMD is on PATH.
have() { command -v "$1" >/dev/null 2>&1; }

# as_root CMD...: run CMD as root, through sudo when we are not root.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif have sudo; then
    sudo "$@"
  else
    die "need root to run '$*' (not root and sudo is not installed)"
  fi
}

# repo_root: the absolute path of the repository (the parent of tools/).
repo_root() { (cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd); }

# now_s: seconds since the epoch, with a fractional part.
now_s() { date +%s.%N; }

# elapsed_since T0: seconds since T0 (from now_s), one decimal.
elapsed_since() { awk -v a="$1" -v b="$(now_s)" 'BEGIN { printf "%.1f", b - a }'; }
