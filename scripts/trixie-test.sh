#!/usr/bin/env bash
# The README's commands on Debian 13 (trixie: GCC 14, LibTorch 2.6, gRPC 1.51) in a root made
# with debootstrap from this machine's Debian mirror: the sources (what git tracks, and what it
# does not ignore) are copied in and `make TARGET` runs there as on a Debian 13 machine, as root,
# scripts/install-deps.sh first (it installs what trixie lacks, natively). The root, its build
# tree (/build) and its s3rver (/opt/tools) are kept between runs, so a second run builds only
# what changed.
# Usage: scripts/trixie-test.sh [TARGET] [CTEST_ARGS...]   (as root)
#   TARGET: test (default: every test, as make test), demo, test-examples, build, ...
#   e.g. BUILD_TARGETS=unit_parity_tests scripts/trixie-test.sh test -L 'unit|parity'
#   (what .ci/run runs: only what those tests need is built)
#   ROOT=/var/tmp/trainyard-trixie by default.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
root=${ROOT:-/var/tmp/trainyard-trixie}
target=${1:-test}
shift || true
ctest_args=$(printf "%q " "$@")  # quoted again for the shell that runs ctest in make
[ "$(id -u)" -eq 0 ] || { echo "trixie-test: run as root (debootstrap, chroot)" >&2; exit 1; }
# shellcheck source=scripts/trixie-root.sh
source "$here/scripts/trixie-root.sh"
trixie_root "$root" trixie-test

trixie_copy_sources "$here" "$root"
mkdir -p "$root/opt/tools" "$root/build"
ln -sfn /opt/tools "$root/src/.tools"
# npm (s3rver) trusts this machine's certificate authorities (a proxy it goes through, say).
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/host-ca.crt"
start=$(date +%s)
# In PID and mount namespaces of its own, as on a machine of its own: its process 1 is make, so
# that Debian 13's `ip netns` (which opens /proc/1/ns/net) works where this machine's process 1
# is out of reach (a container), and the tests' mounts go when it ends.
chroot "$root" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 NODE_EXTRA_CA_CERTS=/etc/ssl/host-ca.crt \
  unshare --pid --fork --kill-child --mount-proc \
  make -C /src "$target" BUILD_DIR=/build CTEST_ARGS="$ctest_args" \
  BUILD_TARGETS="${BUILD_TARGETS:-}"
echo "trixie-test: make $target passed on $(chroot "$root" sh -c '. /etc/os-release; echo $PRETTY_NAME')," \
  "$(chroot "$root" sh -c 'g++ --version | head -1'), LibTorch" \
  "$(chroot "$root" python3 -c 'import torch; print(torch.__version__)') in $(( $(date +%s) - start )) s"
