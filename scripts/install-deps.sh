#!/usr/bin/env bash
# Installs everything Trainyard needs to build, test and run its demo on Debian 12 (bookworm:
# GCC 12, LibTorch 1.13) or Debian 13 (trixie: GCC 14, LibTorch 2.6); the package names are the
# same on both. Idempotent: packages already present are skipped and `apt-get update` runs at most
# once.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
case "$codename" in
  bookworm) echo "install-deps: Debian 12 (bookworm): LibTorch 1.13" ;;
  trixie) echo "install-deps: Debian 13 (trixie): LibTorch 2.6" ;;
  *) echo "install-deps: '${codename:-unknown}' is neither Debian 12 nor 13; trying anyway" >&2 ;;
esac

packages=(
  # build
  build-essential cmake pkg-config git
  # RPC and API
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # training runtime
  libtorch-dev libopenblas0-pthread libgloo-dev
  # the agent's debugger: `trainyard debug --stacks` prints each trainer's threads' stacks
  gdb
  # libraries
  libabsl-dev prometheus-cpp-dev libcivetweb-dev libcpp-httplib-dev libarchive-dev libgtest-dev libgmock-dev libsqlite3-dev libpq-dev
  libcurl4-openssl-dev libssl-dev libyaml-cpp-dev nlohmann-json3-dev
  # test-only tools
  awscli python3-botocore prometheus python3-torch python3-numpy curl yamllint
  openssl python3-grpcio python3-protobuf python3-optuna iproute2 nftables iptables shellcheck
  # the console's browser test: a real headless Chromium driven by Selenium
  chromium chromium-driver python3-selenium
  # the fuzz targets (make fuzz): clang with libFuzzer and the sanitizers' runtimes
  clang libclang-rt-dev
  # the PostgreSQL store's tests start their own server from these binaries (no service)
  postgresql
  # the Slurm tests start their own controller, node daemons and munge (no service)
  slurmctld slurmd slurm-client munge
  # the structure check (scripts/check_structure.py): function ends and formatting
  universal-ctags clang-format
  # benchmarks (bench/cpu_step.py) and the programs example (torchvision, PIL)
  python3-torchvision
  # examples only: the text the language-model examples train on
  bible-kjv
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

# Node.js may come from elsewhere than Debian (its own npm then conflicts with Debian's).
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages: ${missing[*]}" >&2
    echo "install-deps: run this script as root to install them" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all Debian packages present"
fi

# s3rver (an S3 endpoint on loopback for tests) lives in a folder of the repository that git ignores.
tools="$here/.tools"
if [ ! -x "$tools/node_modules/.bin/s3rver" ]; then
  echo "install-deps: installing s3rver into $tools"
  mkdir -p "$tools"
  npm install --silent --no-audit --no-fund --prefix "$tools" s3rver@3 >/dev/null
fi
echo "install-deps: done"
