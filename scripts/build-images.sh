#!/usr/bin/env bash
# Builds the two images of deploy/Dockerfile with podman, offline if need be:
#   localhost/trainyard-dev:TAG  (target dev: every build and test dependency)
#   localhost/trainyard:TAG      (target runtime: the four binaries and their libraries)
# on Debian 13 (trixie: LibTorch 2.6), or with TRAINYARD_DEBIAN=12 on Debian 12 (bookworm:
# LibTorch 1.13), tagged TAG-debian12. The bases come from docker.io when it can be reached;
# otherwise from debootstrap and this machine's Debian mirror, imported as localhost/debian:13 and
# localhost/debian:13-slim (or :12, :12-slim).
# Builds and containers use the host's network (everything listens on 127.0.0.1).
# Usage: [TRAINYARD_DEBIAN=12] scripts/build-images.sh [TAG]   (default: latest). Run as root.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
release=${TRAINYARD_DEBIAN:-13}
case "$release" in
  13) codename=trixie; tag=${1:-latest} ;;
  12) codename=bookworm; tag=${1:-latest}-debian12 ;;
  *) echo "build-images: TRAINYARD_DEBIAN must be 13 or 12, not '$release'" >&2; exit 2 ;;
esac
work=${TRAINYARD_IMAGES_DIR:-/var/tmp/trainyard-images}
mkdir -p "$work"

need=()
for tool in podman debootstrap runc; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || { echo "build-images: missing ${need[*]}; run as root" >&2; exit 1; }
  echo "build-images: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
    >/dev/null
fi

# runc and cgroupfs work where crun and systemd's cgroups do not (containers in containers); no
# default ulimits, which an unprivileged outer container refuses to set.
if [ -z "${CONTAINERS_CONF:-}" ]; then
  export CONTAINERS_CONF="$work/containers.conf"
  cat >"$CONTAINERS_CONF" <<'CONF'
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
CONF
fi

mirror() {
  local uri
  uri=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+' /etc/apt/sources.list.d/*.sources \
          /etc/apt/sources.list 2>/dev/null | grep -v security | head -1 | awk '{print $2}' || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

# A Debian image of $codename from debootstrap; with "slim", without documentation, manuals, locales and
# package lists.
debootstrap_image() {
  local name=$1 slim=${2:-}
  local root="$work/root-$$"
  echo "build-images: making $name with debootstrap from $(mirror)"
  rm -rf "$root"
  debootstrap --variant=minbase "$codename" "$root" "$(mirror)" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  if [ -n "$slim" ]; then
    rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
      "$root"/usr/share/locale/* "$root"/var/cache/debconf/*-old
  fi
  tar -C "$root" -c . | podman import -q - "$name" >/dev/null
  rm -rf "$root"
}

base=localhost/debian:$release
runtime_base=localhost/debian:$release-slim
if podman image exists "docker.io/library/debian:$release" ||
   timeout 60 podman pull -q "docker.io/library/debian:$release" >/dev/null 2>&1; then
  base=docker.io/library/debian:$release
  timeout 60 podman pull -q "docker.io/library/debian:$release-slim" >/dev/null 2>&1 &&
    runtime_base=docker.io/library/debian:$release-slim
fi
[ "$base" != "localhost/debian:$release" ] || podman image exists "$base" ||
  debootstrap_image "$base"
[ "$runtime_base" != "localhost/debian:$release-slim" ] || podman image exists "$runtime_base" ||
  debootstrap_image "$runtime_base" slim

# The machine's certificate authorities, for the build's downloads over HTTPS (npm) behind a
# proxy that this machine trusts; mounted for the build steps only, never part of an image.
build=(podman build --network host -f "$here/deploy/Dockerfile"
       --volume /etc/ssl/certs:/run/host-certs:ro
       --build-arg "BASE_IMAGE=$base" --build-arg "RUNTIME_BASE_IMAGE=$runtime_base")
for target in dev runtime; do
  image=localhost/trainyard:$tag
  [ "$target" = runtime ] || image=localhost/trainyard-dev:$tag
  echo "build-images: building $image (target $target)"
  start=$(date +%s)
  "${build[@]}" --target "$target" -t "$image" "$here" >"$work/build-$target.log" 2>&1 ||
    { tail -30 "$work/build-$target.log" >&2; echo "build-images: $target failed" >&2; exit 1; }
  size=$(podman image inspect --format '{{.Size}}' "$image")
  echo "build-images: $image: $((size / 1048576)) MiB, built in $(( $(date +%s) - start )) s"
done
