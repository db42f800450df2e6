# Idempotent machine setup for the fGPU hub, sourced by scripts/up.
# Installs only what is missing: Debian packages, configurable-http-proxy, the project's venv at
# .venv/, a running Docker engine, and the single-user images (built offline: no registry here).

FGPU_CACHE_DIR=${FGPU_CACHE_DIR:-/var/cache/fgpu-hub}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/fgpu-dockerd.log}
# docker-registry, iproute2, curl and openssl serve scripts/swarm-lab (its nodes pull the session
# images from a local registry; its engines speak TLS).
# faketime moves the queue service's clock in tests (tests/service_clock.py).
# systemd brings systemd-analyze, which checks the units of `fgpu-hub install-service` (the package
# installs; nothing starts it where systemd is not the init system).
APT_PACKAGES=(docker.io iptables debootstrap chromium ca-certificates postgresql
  docker-registry iproute2 curl openssl faketime systemd)
# The PostgreSQL server, role and database the tests use by default (FGPU_TEST_POSTGRES_URL in
# tests/conftest.py): postgresql+psycopg://fgpu:fgpu@127.0.0.1:5432/fgpu_test
FGPU_PG_PORT=5432
FGPU_PG_ROLE=fgpu
FGPU_PG_DB=fgpu_test

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

pg_ready() { pg_isready -q -h 127.0.0.1 -p "$FGPU_PG_PORT"; }

pg_psql() { as_root runuser -u postgres -- psql -p "$FGPU_PG_PORT" -v ON_ERROR_STOP=1 -qtAX "$@"; }

start_postgres() {
  local ver _
  if ! pg_ready; then
    # Debian's clusters, one a line: "15 main 5432 down postgres ...". Take the newest "main".
    ver=$(pg_lsclusters -h 2>/dev/null | awk '$2 == "main" {print $1}' | sort -V | tail -1)
    if [ -z "$ver" ]; then
      ver=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V | tail -1)
      [ -n "$ver" ] || { log "no PostgreSQL server is installed under /usr/lib/postgresql"; return 1; }
      log "creating the PostgreSQL $ver cluster 'main' on port $FGPU_PG_PORT"
      as_root pg_createcluster -p "$FGPU_PG_PORT" "$ver" main >/dev/null
    fi
    log "starting PostgreSQL $ver/main"
    as_root pg_ctlcluster "$ver" main start
    for _ in $(seq 1 30); do
      pg_ready && break
      sleep 1
    done
    if ! pg_ready; then
      log "PostgreSQL did not answer on 127.0.0.1:$FGPU_PG_PORT within 30 s; its log ends with:"
      tail -20 "/var/log/postgresql/postgresql-$ver-main.log" >&2 || true
      return 1
    fi
  fi
  if ! id postgres >/dev/null 2>&1; then
    log "PostgreSQL answers, but not as Debian's cluster: create role $FGPU_PG_ROLE and database $FGPU_PG_DB there yourself"
    return 0
  fi
  # The tests' role creates a fresh database per test, hence CREATEDB.
  if [ "$(pg_psql -c "SELECT 1 FROM pg_roles WHERE rolname = '$FGPU_PG_ROLE'")" != 1 ]; then
    log "creating the PostgreSQL role $FGPU_PG_ROLE and database $FGPU_PG_DB for the tests"
    pg_psql -c "CREATE ROLE $FGPU_PG_ROLE LOGIN CREATEDB PASSWORD '$FGPU_PG_ROLE'"
  fi
  if [ "$(pg_psql -c "SELECT 1 FROM pg_database WHERE datname = '$FGPU_PG_DB'")" != 1 ]; then
    pg_psql -c "CREATE DATABASE $FGPU_PG_DB OWNER $FGPU_PG_ROLE"
  fi
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
  start_postgres
  install_venv
  build_images
}
