#!/usr/bin/env bash
# Install (if needed) and start a throwaway PostgreSQL on localhost for the multi-worker test.
# Prints the storage URL on stdout. Idempotent.
set -euo pipefail
PGPORT=${PGPORT:-55432}
DATA=${PGDATA_DIR:-/tmp/advisor-pg}
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >/dev/null 2>&1
fi
BIN=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)")
if ! id postgres >/dev/null 2>&1; then useradd -r -m postgres; fi
if [ ! -f "$DATA/PG_VERSION" ]; then
  mkdir -p "$DATA" && chown postgres "$DATA"
  su postgres -c "$BIN/initdb -D $DATA -A trust -U postgres" >/dev/null
fi
if ! su postgres -c "$BIN/pg_ctl -D $DATA status" >/dev/null 2>&1; then
  su postgres -c "$BIN/pg_ctl -D $DATA -o '-p $PGPORT -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=200' -l $DATA/log -w start" >/dev/null
fi
su postgres -c "psql -h 127.0.0.1 -p $PGPORT -U postgres -tc \"select 1 from pg_roles where rolname='advisor'\"" | grep -q 1 || \
  su postgres -c "psql -h 127.0.0.1 -p $PGPORT -U postgres -c \"create role advisor login password 's3cret-pw'\"" >/dev/null
su postgres -c "psql -h 127.0.0.1 -p $PGPORT -U postgres -tc \"select 1 from pg_database where datname='advisor'\"" | grep -q 1 || \
  su postgres -c "psql -h 127.0.0.1 -p $PGPORT -U postgres -c 'create database advisor owner advisor'" >/dev/null
echo "postgresql://advisor:s3cret-pw@127.0.0.1:$PGPORT/advisor"
