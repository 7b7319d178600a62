#!/usr/bin/env bash
# Starts a throwaway PostgreSQL (Debian's package) for the tests and prints the DSN to use.
# Usage: dsn=$(.ci/postgres.sh)   — installs postgresql if needed; data in a temp dir, on a free
# port. If SKEIN_PG_DIR_OUT names a file, the temp dir is written there so that the caller can
# stop the server: su postgres -s /bin/sh -c "pg_ctl -D DIR/data stop".
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
fi
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
dir=$(mktemp -d /tmp/skein-pg.XXXXXX)
chown postgres:postgres "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
if [ -n "${SKEIN_PG_DIR_OUT:-}" ]; then echo "$dir" > "$SKEIN_PG_DIR_OUT"; fi
su postgres -s /bin/sh -c "$bin/initdb -D $dir/data -A trust -U postgres >/dev/null"
su postgres -s /bin/sh -c "$bin/pg_ctl -D $dir/data -o '-p $port -k $dir -c listen_addresses=127.0.0.1' -l $dir/log -w start >/dev/null"
su postgres -s /bin/sh -c "$bin/createdb -h 127.0.0.1 -p $port -U postgres skein"
echo "postgres://postgres@127.0.0.1:$port/skein?sslmode=disable"
