# shellcheck shell=bash
# Where `scripts/up` runs the hub, which keeps its state (databases, secrets, students' storage
# folders) in the directory it starts in: FGPU_STATE_DIR when set; else the directory
# `scripts/up` was started from, unless that is the checkout or inside it, where students' files
# would sit next to the code, one `git add -A` away from a commit: then
# $XDG_STATE_HOME/fgpu-hub (~/.local/state/fgpu-hub). The checkout's .gitignore is the second
# guard.

# hub_state_dir CHECKOUT STARTED_FROM: prints the state directory.
hub_state_dir() {
  local checkout started_from
  checkout=$(cd "$1" && pwd -P)
  started_from=$(cd "$2" && pwd -P)
  if [ -n "${FGPU_STATE_DIR:-}" ]; then
    echo "$FGPU_STATE_DIR"
  elif [[ "$started_from/" == "$checkout/"* ]]; then
    echo "${XDG_STATE_HOME:-$HOME/.local/state}/fgpu-hub"
  else
    echo "$started_from"
  fi
}
