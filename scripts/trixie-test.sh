#!/usr/bin/env bash
# Builds Trainyard against a current LibTorch and runs its tests there: Debian 13 (trixie) has
# LibTorch 2.6 (with GCC 14, CMake 3.31, gRPC 1.51, Abseil, Gloo), against Debian 12's 1.13.
# A trixie root made with debootstrap from this machine's Debian mirror holds the toolchain; the
# sources (what git tracks, and what it does not ignore) are copied in and built there.
# Usage: scripts/trixie-test.sh [CTEST_ARGS...]   (as root; default: every test, as make test)
#   ROOT=/var/tmp/trainyard-trixie by default; kept between runs (packages and build tree).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
root=${ROOT:-/var/tmp/trainyard-trixie}
ctest_args=("$@")
[ "$(id -u)" -eq 0 ] || { echo "trixie-test: run as root (debootstrap, chroot)" >&2; exit 1; }
# shellcheck source=scripts/trixie-root.sh
source "$here/scripts/trixie-root.sh"
trixie_root "$root" trixie-test

# What scripts/install-deps.sh installs, from trixie.
packages=(build-essential cmake pkg-config git libgrpc++-dev protobuf-compiler-grpc
  libprotobuf-dev protobuf-compiler libtorch-dev libopenblas0-pthread libgloo-dev libabsl-dev
  prometheus-cpp-dev libgtest-dev libgmock-dev libsqlite3-dev libcurl4-openssl-dev libssl-dev
  libyaml-cpp-dev nlohmann-json3-dev python3-torch python3-numpy python3-optuna curl openssl
  awscli python3-botocore prometheus yamllint python3-grpcio python3-protobuf nodejs npm iproute2
  nftables)
missing=$(chroot "$root" dpkg-query -W -f='${Status}\n' "${packages[@]}" 2>&1 |
  grep -vc '^install ok installed$' || true)
if [ "$missing" != 0 ]; then
  echo "trixie-test: installing the build dependencies"
  chroot "$root" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends \
    "${packages[@]}" >"$root.apt.log" 2>&1 || { tail -20 "$root.apt.log" >&2; exit 1; }
fi
# s3rver for the S3 tests, outside the source folder (which each run replaces); npm trusts this
# machine's certificate authorities (a proxy it goes through, say) for the install only.
if [ ! -x "$root/opt/tools/node_modules/.bin/s3rver" ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$root/tmp/host-ca.crt"
  chroot "$root" env NPM_CONFIG_CAFILE=/tmp/host-ca.crt npm install --silent --no-audit \
    --no-fund --prefix /opt/tools s3rver@3 >/dev/null
  rm -f "$root/tmp/host-ca.crt"
fi
echo "trixie-test: $(chroot "$root" sh -c 'g++ --version | head -1'), LibTorch" \
  "$(chroot "$root" python3 -c 'import torch; print(torch.__version__)')"

trixie_copy_sources "$here" "$root"
ln -s /opt/tools "$root/src/.tools"
chroot "$root" bash -c "cmake -S /src -B /build -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build /build -j\$(nproc) &&
  cd /build && ctest --output-on-failure --timeout 600 ${ctest_args[*]}"
