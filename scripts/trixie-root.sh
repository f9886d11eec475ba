# Sourced by scripts/trixie-test.sh and scripts/gpu-rehearsal.sh: a Debian 13 (trixie) root made
# with debootstrap from this machine's Debian mirror, kept between runs, bound onto itself with
# /proc, /sys and /dev bound into it until the sourcing script exits.

# trixie_root ROOT NAME: makes ROOT if it has no apt-get yet and mounts into it; NAME prefixes the
# messages. Needs root.
trixie_root() {
  local root=$1 name=$2
  command -v debootstrap >/dev/null 2>&1 ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  local mirror
  mirror=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+' /etc/apt/sources.list.d/*.sources \
             /etc/apt/sources.list 2>/dev/null | grep -v security | head -1 | awk '{print $2}' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  if [ ! -x "$root/usr/bin/apt-get" ]; then
    echo "$name: making a trixie root in $root from $mirror"
    mkdir -p "$root"
    debootstrap --variant=minbase --include=ca-certificates,make trixie "$root" "$mirror" \
      >"$root.debootstrap.log" 2>&1 || { tail -20 "$root.debootstrap.log" >&2; return 1; }
  fi
  trixie_mounted=()
  trap trixie_unmount EXIT
  trap 'exit 1' INT TERM
  # The root a mount point of its own, as / is on a machine: tests that make namespaces change
  # the propagation of / (unshare --mount-proc, ip netns), which a plain folder refuses.
  if ! mountpoint -q "$root"; then
    mount --bind "$root" "$root"
    trixie_mounted+=("$root")
  fi
  local d
  for d in proc sys dev; do
    if ! mountpoint -q "$root/$d"; then
      mount --bind "/$d" "$root/$d"
      trixie_mounted+=("$root/$d")
    fi
  done
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  # What runs the rest (the project's own install-deps.sh, inside); a root made without it gets it.
  if [ ! -x "$root/usr/bin/make" ]; then
    echo "$name: installing make in $root"
    chroot "$root" env DEBIAN_FRONTEND=noninteractive sh -c \
      'apt-get update -qq && apt-get install -y -qq --no-install-recommends make' >/dev/null
  fi
}

trixie_unmount() {
  local i
  for ((i=${#trixie_mounted[@]}-1; i>=0; i--)); do umount "${trixie_mounted[$i]}" || true; done
}

# trixie_copy_sources HERE ROOT: the sources as a checkout has them (what git tracks, and what it
# does not ignore) in ROOT/src. A file whose content changed since the last copy gets the time of
# this copy (tar would keep the checkout's, which may be older than the objects a build made from
# the last copy, and make would skip it); an unchanged one keeps its time, so a build there
# redoes only what changed. Files gone from the checkout go from ROOT/src too.
trixie_copy_sources() {
  local here=$1 root=$2 stage="$2/src.new" f
  rm -rf "$stage"
  mkdir -p "$stage" "$root/src"
  (cd "$here" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -c) |
    tar -x -C "$stage"
  while IFS= read -r -d '' f; do
    if ! cmp -s "$stage/$f" "$root/src/$f"; then
      mkdir -p "$(dirname "$root/src/$f")"
      rm -f "$root/src/$f"
      cp "$stage/$f" "$root/src/$f"
    fi
  done < <(cd "$stage" && find . -type f -print0)
  while IFS= read -r -d '' f; do
    [ -e "$stage/$f" ] || rm -f "$root/src/$f"
  done < <(cd "$root/src" && find . -type f -print0)
  rm -rf "$stage"
}
