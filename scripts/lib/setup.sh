# Idempotent machine setup for the fGPU hub, sourced by scripts/up.
# Installs only what is missing: Debian packages, configurable-http-proxy, the project's venv at
# .venv/, a running Docker engine, and the single-user images (built offline: no registry here).
# It makes no PostgreSQL role: the tests' one is scripts/test's alone (lib/test_postgres.sh).

FGPU_CACHE_DIR=${FGPU_CACHE_DIR:-/var/cache/fgpu-hub}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/fgpu-dockerd.log}
# docker-registry, iproute2, curl and openssl serve scripts/swarm-lab (its nodes pull the session
# images from a local registry; its engines speak TLS).
# faketime moves the queue service's clock in tests (tests/service_clock.py).
# systemd brings systemd-analyze, which checks the units of `fgpu-hub install-service` (the package
# installs; nothing starts it where systemd is not the init system).
# xfsprogs: the project quota tests make an XFS file system (tests/test_project_quotas.py).
# openssh-client is the SSH service's client in tests. (openssh-server, the ceiling the SFTP
# benchmark measures against, is installed by that benchmark alone: a hub's machine needs no sshd.)
APT_PACKAGES=(docker.io iptables debootstrap chromium ca-certificates postgresql
  docker-registry iproute2 curl openssl faketime systemd xfsprogs openssh-client)

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

# scripts/swarm-lab runs docker-registry itself, per lab; the package's own service (started on
# systemd machines, on :5000 with htpasswd auth) would only take the lab registry's port.
quiet_packaged_registry() {
  [ -d /run/systemd/system ] || return 0
  systemctl is-enabled --quiet docker-registry 2>/dev/null || systemctl is-active --quiet docker-registry 2>/dev/null ||
    return 0
  log "disabling the docker-registry package's own service (scripts/swarm-lab runs its own)"
  as_root systemctl disable --now docker-registry
}

install_proxy() {
  command -v configurable-http-proxy >/dev/null && return
  log "installing configurable-http-proxy from npm"
  as_root npm install -g --no-fund --no-audit configurable-http-proxy
}

# Chart.js draws the Usage page's chart. It comes from the npm registry at setup (never from a CDN)
# into the service's static files, under static/vendor/, which git ignores.
CHARTJS_VERSION=4.5.1
CHARTJS_FILE=queue_service/static/vendor/chart.umd.min.js

install_chartjs() {
  head -c 200 "$CHARTJS_FILE" 2>/dev/null | grep -q "Chart.js v$CHARTJS_VERSION" && return
  log "installing Chart.js $CHARTJS_VERSION from npm into $CHARTJS_FILE"
  local tmp status
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "chart.js@$CHARTJS_VERSION" >/dev/null) &&
    tar -xzf "$tmp/chart.js-$CHARTJS_VERSION.tgz" -C "$tmp" &&
    mkdir -p "$(dirname "$CHARTJS_FILE")" &&
    cp "$tmp/package/dist/chart.umd.min.js" "$CHARTJS_FILE" &&
    cp "$tmp/package/LICENSE.md" "$(dirname "$CHARTJS_FILE")/chart.js-LICENSE.md"
  status=$?
  rm -rf "$tmp"
  return $status
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
  quiet_packaged_registry
  install_proxy
  install_chartjs
  start_docker
  install_venv
  build_images
}
