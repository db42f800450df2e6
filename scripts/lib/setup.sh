# Idempotent machine setup for the fGPU hub, sourced by scripts/up.
# Installs only what is missing: Debian packages, configurable-http-proxy, the project's venv at
# .venv/, a running Docker engine, and the single-user images (built offline: no registry here).

FGPU_CACHE_DIR=${FGPU_CACHE_DIR:-/var/cache/fgpu-hub}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/fgpu-dockerd.log}
APT_PACKAGES=(docker.io iptables debootstrap chromium ca-certificates)

log() { printf '\033[1m[fgpu setup]\033[0m %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

install_debian_packages() {
  local missing=() pkg
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  # Node may come from elsewhere than Debian; what matters is that npm runs.
  command -v npm >/dev/null || missing+=(nodejs npm)
  [ ${#missing[@]} -eq 0 ] && return
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

install_proxy() {
  command -v configurable-http-proxy >/dev/null && return
  log "installing configurable-http-proxy from npm"
  as_root npm install -g --no-fund --no-audit configurable-http-proxy
}

start_docker() {
  docker info >/dev/null 2>&1 && return
  log "starting dockerd (log: $DOCKERD_LOG)"
  as_root sh -c "setsid nohup dockerd >'$DOCKERD_LOG' 2>&1 &"
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return
    sleep 1
  done
  log "dockerd did not answer within 60 s; its log ends with:"
  tail -20 "$DOCKERD_LOG" >&2
  return 1
}

install_venv() {
  local stamp=.venv/.fgpu-installed want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return
  log "installing the project into .venv/"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  echo "$want" >"$stamp"
}

build_images() {
  log "building single-user images (cached in the engine and $FGPU_CACHE_DIR)"
  FGPU_CACHE_DIR="$FGPU_CACHE_DIR" .venv/bin/python -m image_catalog build --all
}

setup_all() {
  install_debian_packages
  install_proxy
  start_docker
  install_venv
  build_images
}
