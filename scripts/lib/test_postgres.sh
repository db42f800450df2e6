# The tests' PostgreSQL: sourced by scripts/test alone, after lib/setup.sh (for log and as_root).
# It starts this machine's Debian cluster and makes the tests' role and database there. The role
# (fgpu, password fgpu, CREATEDB: each test makes a database of its own) is for a test machine
# only: scripts/up never makes it, so a site's server never holds a role with a known password.
# With FGPU_TEST_POSTGRES_URL set (tests/conftest.py), the tests use that server and nothing is
# done here.

# postgresql+psycopg://fgpu:fgpu@127.0.0.1:5432/fgpu_test, DEFAULT_POSTGRES_URL in tests/conftest.py
FGPU_PG_PORT=5432
FGPU_PG_ROLE=fgpu
FGPU_PG_DB=fgpu_test

pg_ready() { pg_isready -q -h 127.0.0.1 -p "$FGPU_PG_PORT"; }

pg_psql() { as_root runuser -u postgres -- psql -p "$FGPU_PG_PORT" -v ON_ERROR_STOP=1 -qtAX "$@"; }

setup_test_postgres() {
  if [ -n "${FGPU_TEST_POSTGRES_URL:-}" ]; then
    log "tests use FGPU_TEST_POSTGRES_URL's server; no local PostgreSQL set up"
    return 0
  fi
  start_test_postgres || return 1
  if ! id postgres >/dev/null 2>&1; then
    log "PostgreSQL answers, but not as Debian's cluster: create role $FGPU_PG_ROLE and database $FGPU_PG_DB there yourself"
    return 0
  fi
  create_test_role_and_database
}

start_test_postgres() {
  local ver _
  pg_ready && return 0
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
    pg_ready && return 0
    sleep 1
  done
  log "PostgreSQL did not answer on 127.0.0.1:$FGPU_PG_PORT within 30 s; its log ends with:"
  tail -20 "/var/log/postgresql/postgresql-$ver-main.log" >&2 || true
  return 1
}

create_test_role_and_database() {
  if [ "$(pg_psql -c "SELECT 1 FROM pg_roles WHERE rolname = '$FGPU_PG_ROLE'")" != 1 ]; then
    log "creating the PostgreSQL role $FGPU_PG_ROLE and database $FGPU_PG_DB for the tests"
    pg_psql -c "CREATE ROLE $FGPU_PG_ROLE LOGIN CREATEDB PASSWORD '$FGPU_PG_ROLE'"
  fi
  if [ "$(pg_psql -c "SELECT 1 FROM pg_database WHERE datname = '$FGPU_PG_DB'")" != 1 ]; then
    pg_psql -c "CREATE DATABASE $FGPU_PG_DB OWNER $FGPU_PG_ROLE"
  fi
}
