#!/usr/bin/env bash
# Installs the CUDA libraries CI uses to test engine/internal/backend/cuda without a GPU, from
# Debian bookworm's non-free archive: NVRTC 11.8 (libnvrtc11.2 + libnvrtc-builtins11.8), which
# compiles the backend's kernels for sm_80/sm_90, and the driver library (libcuda1), whose cuInit
# returns CUDA_ERROR_NO_DEVICE on a machine without a GPU (the loader's error path).
# Prints the folder(s) holding libnvrtc.so.11.2 and libcuda.so.1, colon-separated, on stdout
# (for SKEIN_CUDA_LIBS); everything else goes to stderr. Idempotent: when the packages are
# installed already it runs no apt command. Needs root (or the packages already installed).
set -euo pipefail
pkgs=(libnvrtc11.2 libnvrtc-builtins11.8 libcuda1)

installed() {
  local p
  for p in "${pkgs[@]}"; do
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" = installed ] || return 1
  done
}

if ! installed; then
  if [ "$(id -u)" != 0 ]; then
    echo "cuda-ci-libs: ${pkgs[*]} are not installed and this is not root" >&2
    exit 1
  fi
  # contrib and non-free from the machine's own Debian sources (the same archives, other
  # components), in a sources file of our own; the machine's own files stay as they are.
  src=/etc/apt/sources.list.d/skein-cuda-nonfree.sources
  if ! apt-cache policy libnvrtc11.2 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    if [ ! -f "$src" ]; then
      own=/etc/apt/sources.list.d/debian.sources
      if [ -f "$own" ]; then
        sed -E 's/^Components:.*/Components: contrib non-free/' "$own" >"$src"
      elif [ -f /etc/apt/sources.list ]; then
        # one-line format: the same lines with contrib and non-free as their components
        sed -nE 's/^(deb[[:space:]]+(\[[^]]*\][[:space:]]+)?[^[:space:]]+[[:space:]]+[^[:space:]]+)[[:space:]].*/\1 contrib non-free/p' /etc/apt/sources.list \
          >/etc/apt/sources.list.d/skein-cuda-nonfree.list
      fi
    fi
    apt-get update -qq >&2
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2
fi

# The folders the libraries landed in (symlinks resolved to their real folder too, so the
# loader finds them either way).
dirs=()
add() {
  local d=$1 x
  for x in "${dirs[@]:-}"; do [ "$x" = "$d" ] && return; done
  dirs+=("$d")
}
for lib in libnvrtc.so.11.2 libcuda.so.1; do
  found=
  while read -r f; do
    case "$f" in */stubs/*) continue ;; esac
    [ "$(basename "$f")" = "$lib" ] || continue
    [ -e "$f" ] || continue
    add "$(dirname "$f")"
    found=1
  done < <(dpkg -L libnvrtc11.2 libcuda1 2>/dev/null)
  if [ -z "$found" ]; then
    f=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')
    [ -n "$f" ] && add "$(dirname "$f")" && found=1
  fi
  if [ -z "$found" ]; then
    echo "cuda-ci-libs: $lib not found after installing ${pkgs[*]}" >&2
    exit 1
  fi
done
(IFS=:; echo "${dirs[*]}")
