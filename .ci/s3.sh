#!/usr/bin/env bash
# Starts a throwaway S3 server (versitygw v1.8.0, Apache-2.0, over a temp directory) on a free
# loopback port for the storage tests and prints its endpoint. The binary is built once into
# ${SKEIN_CI_CACHE:-$HOME/.cache/skein-ci} (cold: about 6 min on 2 cores, module download
# included; 61 MB) and reused. If SKEIN_S3_PID_OUT names a file, the server's pid and data
# directory are written there (one a line) so that the caller can stop it.
# Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY as exported by the caller.
set -euo pipefail
cache=${SKEIN_CI_CACHE:-$HOME/.cache/skein-ci}
bin=$cache/versitygw-v1.8.0/versitygw
if [ ! -x "$bin" ]; then
  mkdir -p "$(dirname "$bin")"
  # Its own module cache under the CI cache: the build is not part of skein's module graph.
  GOBIN="$(dirname "$bin")" GOFLAGS=-trimpath GOEXPERIMENT= \
    go install -ldflags='-s -w' github.com/versity/versitygw/cmd/versitygw@v1.8.0 >&2
fi
dir=$(mktemp -d /tmp/skein-s3.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ROOT_ACCESS_KEY="$AWS_ACCESS_KEY_ID" ROOT_SECRET_KEY="$AWS_SECRET_ACCESS_KEY" \
  setsid "$bin" --port "127.0.0.1:$port" --quiet posix "$dir" >"$dir.log" 2>&1 </dev/null &
pid=$!
if [ -n "${SKEIN_S3_PID_OUT:-}" ]; then printf '%s\n%s\n' "$pid" "$dir" > "$SKEIN_S3_PID_OUT"; fi
for _ in $(seq 100); do
  if python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null; then
    echo "http://127.0.0.1:$port"
    exit 0
  fi
  sleep 0.1
done
echo "versitygw did not listen on 127.0.0.1:$port; its log:" >&2
cat "$dir.log" >&2
exit 1
