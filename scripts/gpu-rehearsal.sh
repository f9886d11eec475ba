#!/usr/bin/env bash
# Rehearses the GPU check without a GPU: runs scripts/gpu-check.sh inside a Debian 13 root that
# has what a bare CUDA machine has (a compiler, CMake, ninja, Python with PyTorch: Debian's
# python3-torch 2.6, its LibTorch headers and CMake config unpacked beside it as a PyTorch
# install has them) and none of our -dev packages, so that the bundle alone must be enough.
# Everything that needs CUDA skips with its reason; everything else must pass.
# Usage: scripts/gpu-rehearsal.sh [OUT_DIR]   (as root, after make gpu-bundle; default
#   OUT_DIR ./gpu-report-rehearsal). ROOT=/var/tmp/trainyard-gpu-rehearsal, kept between runs.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
root=${ROOT:-/var/tmp/trainyard-gpu-rehearsal}
out=${1:-$here/gpu-report-rehearsal}
[ "$(id -u)" -eq 0 ] || { echo "gpu-rehearsal: run as root (debootstrap, chroot)" >&2; exit 1; }
[ -f "$here/.gpu/bundle.tar.xz" ] || { echo "gpu-rehearsal: no bundle: run make gpu-bundle" >&2; exit 1; }
# shellcheck source=scripts/trixie-root.sh
source "$here/scripts/trixie-root.sh"
trixie_root "$root" gpu-rehearsal

# What the GPU machine has, and no more.
if ! chroot "$root" dpkg-query -W python3-torch >/dev/null 2>&1; then
  echo "gpu-rehearsal: installing a compiler, CMake, ninja and python3-torch"
  chroot "$root" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends \
    g++ cmake ninja-build python3-torch >"$root.apt.log" 2>&1 || { tail -20 "$root.apt.log" >&2; exit 1; }
fi
# A PyTorch install carries LibTorch's headers and CMake config; Debian puts them in
# libtorch-dev, whose dependencies (libprotobuf-dev among them) the GPU machine lacks: unpack it
# without them, and point torch.utils.cmake_prefix_path at its config as PyTorch's layout does.
torch_pkg=$(chroot "$root" python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
if [ ! -f "$root$torch_pkg/share/cmake/Torch/TorchConfig.cmake" ]; then
  chroot "$root" bash -c 'cd /tmp && apt-get download -qq libtorch-dev && dpkg -x libtorch-dev_*.deb / && rm libtorch-dev_*.deb'
  mkdir -p "$root$torch_pkg/share"
  ln -sfn /usr/lib/x86_64-linux-gnu/cmake "$root$torch_pkg/share/cmake"
fi
for p in libgrpc++-dev libprotobuf-dev libabsl-dev libgloo-dev libyaml-cpp-dev libcurl4-openssl-dev \
         libssl-dev nlohmann-json3-dev libgtest-dev; do
  if chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
    echo "gpu-rehearsal: $p is installed in $root: not a bare machine; remove it or the root" >&2
    exit 1
  fi
done
echo "gpu-rehearsal: $(chroot "$root" sh -c 'g++ --version | head -1'), $(chroot "$root" cmake --version | head -1), PyTorch $(chroot "$root" python3 -c 'import torch; print(torch.__version__)')"

# The sources and the bundle, as the device machine gets them; its build folder is kept.
trixie_copy_sources "$here" "$root"
rm -rf "$root/src/.gpu"
cp -a "$here/.gpu" "$root/src/.gpu"
rm -rf "$root/out"
mkdir -p "$root/out"
rc=0
# Debian's TorchConfig finds its prefix four folders up (/usr from /usr/lib/ARCH/cmake/Torch), a
# PyTorch install's three up; TORCH_INSTALL_PREFIX, which TorchConfig reads, says where it is.
chroot "$root" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root TORCH_INSTALL_PREFIX=/usr \
  BUILD=/build-gpu bash -c 'cd /src && scripts/gpu-check.sh /out' || rc=$?
rm -rf "$out"
cp -a "$root/out" "$out"
echo "gpu-rehearsal: report and logs in $out (check exit $rc)"
# Skips are expected here (no CUDA); a failure is not.
exit $rc
