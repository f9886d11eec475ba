#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a bare CUDA machine that has a compiler, CMake and a
# PyTorch install but none of our C++ dependencies: the headers, CMake configs and shared
# libraries of those dependencies (Debian 12's packages, unpacked), the protoc-generated API
# sources, and the coordinator, agent and CLI built here (they do not link LibTorch).
# Usage: scripts/gpu-bundle.sh [BUILD_DIR]   (after `make build`; writes .gpu/, which git ignores)
#
# .gpu/ holds MANIFEST.txt and bundle.tar.xz (a third of the unpacked size, so that it travels
# within a 64 MiB carry with room to spare); scripts/gpu-check.sh unpacks it into its build
# folder. Layout of the unpacked tree:
#   bin/            trainyard-coordinator, trainyard-worker, trainyard (stripped; RUNPATH into usr/)
#   usr/include     headers            usr/lib/x86_64-linux-gnu   libraries and CMake configs
#   usr/lib         libgloo            usr/share/cmake            Gloo and nlohmann_json configs
#   gen/            trainyard/v1/*.pb.{h,cc}, *.grpc.pb.{h,cc}
#   MANIFEST.txt    what it holds, from which package and version, and its size
# Every bundled library finds its neighbours through RUNPATH $ORIGIN, so nothing needs
# LD_LIBRARY_PATH; the trainer built there gets the same RUNPATH from CMake.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
case "$build" in /*) ;; *) build="$here/$build" ;; esac
dest="$here/.gpu"
out="$build/gpu-tree"  # the unpacked tree, packed into $dest at the end
limit_mib=60
arch=x86_64-linux-gnu

for b in trainyard-coordinator trainyard-worker trainyard; do
  [ -x "$build/bin/$b" ] || { echo "gpu-bundle: $build/bin/$b is missing: run make build" >&2; exit 1; }
done
[ -f "$build/proto/gen/trainyard/v1/job.pb.cc" ] ||
  { echo "gpu-bundle: no generated sources in $build/proto/gen: run make build" >&2; exit 1; }
if ! command -v patchelf >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || { echo "gpu-bundle: needs patchelf (apt-get install patchelf)" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends patchelf >/dev/null
fi

# The headers, CMake configs and link-time libraries the trainer's build needs.
dev_packages=(libgrpc++-dev libgrpc-dev libprotobuf-dev libabsl-dev libgloo-dev libyaml-cpp-dev
  nlohmann-json3-dev libcurl4-openssl-dev libssl-dev libc-ares-dev libre2-dev zlib1g-dev
  libgtest-dev libgmock-dev libarchive-dev)
# Libraries present on any glibc system (and those a PyTorch install brings) never travel.
is_system_lib() {
  case "$(basename "$1")" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|\
    libstdc++.so*|libgcc_s.so*|libutil.so*|libtorch*|libc10*|libgomp*|libopenblas*|libblas*|\
    liblapack*|libgfortran*|libquadmath*|libcuda*|libnccl*|libnv*) return 0 ;;
  esac
  return 1
}

# Runtime packages: those owning the libraries the carried binaries and the trainer load, found
# by following NEEDED entries from the binaries and stopping at the system's and LibTorch's (whose
# own dependencies the GPU machine's PyTorch brings).
declare -A path_of=()   # soname -> file, as the loader resolves it here
binaries=("$build/bin/trainyard-coordinator" "$build/bin/trainyard-worker" "$build/bin/trainyard"
  "$build/bin/trainyard-trainer")
for b in "${binaries[@]}"; do
  while read -r soname path; do path_of[$soname]=$path; done < <(ldd "$b" | awk '/=> \//{print $1, $3}')
done
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
declare -A seen=()
queue=()
for b in "${binaries[@]}"; do queue+=($(needed "$b")); done
# The -dev packages' own libraries and what they need (gloo's hiredis and ibverbs, say).
for p in "${dev_packages[@]}"; do
  for f in $(dpkg -L "$p" | grep -E '\.so$'); do
    real=$(readlink -f "$f")
    path_of[$(basename "$real")]=$real
    queue+=("$(basename "$real")")
    while read -r soname path; do path_of[$soname]=$path; done < <(ldd "$real" | awk '/=> \//{print $1, $3}')
  done
done
declare -A lib_files=()
while [ ${#queue[@]} -gt 0 ]; do
  soname=${queue[0]}
  queue=("${queue[@]:1}")
  [ -n "${seen[$soname]:-}" ] && continue
  seen[$soname]=1
  is_system_lib "$soname" && continue
  path=${path_of[$soname]:-}
  [ -n "$path" ] || { echo "gpu-bundle: cannot resolve $soname" >&2; exit 1; }
  lib_files[$(readlink -f "$path")]=1
  queue+=($(needed "$path"))
done
declare -A runtime_packages=()
while IFS=: read -r pkg _; do
  runtime_packages[$pkg]=1
done < <(for f in "${!lib_files[@]}"; do
           # dpkg knows a library of a merged /usr by the path its package shipped it at.
           echo "$f"; case "$f" in /usr/lib/*) echo "${f#/usr}" ;; esac
         done | xargs dpkg -S 2>/dev/null | grep -v '^diversion')
packages=("${dev_packages[@]}" "${!runtime_packages[@]}")

# The installed version of each, downloaded (kept between runs) and unpacked.
debs="$build/gpu-debs"
stage="$build/gpu-stage"
mkdir -p "$debs"
rm -rf "$stage" "$out" "$dest"
mkdir -p "$stage" "$dest" "$out/bin" "$out/usr/lib/$arch" "$out/usr/share/cmake" "$out/gen"
manifest="$out/MANIFEST.txt"
{
  echo "Trainyard GPU bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(cd "$here" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "Debian $(cat /etc/debian_version), $(ldd --version | head -1 | sed 's/^ldd //')"
  echo
  echo "Packages (unpacked from Debian's .deb files):"
} >"$manifest"
for p in $(printf '%s\n' "${packages[@]}" | sort -u); do
  v=$(dpkg-query -W -f='${Version}' "$p")
  a=$(dpkg-query -W -f='${Architecture}' "$p")
  file=$(ls "$debs/${p}_"*"_${a}.deb" 2>/dev/null | head -1 || true)
  if [ -z "$file" ]; then
    # The installed version, else (a security update replaced it in the archive) the current
    # one: the same library ABI, as Debian keeps it within a release.
    if ! (cd "$debs" && apt-get download -qq "$p=$v" >/dev/null 2>&1); then
      apt-get update -qq >/dev/null 2>&1 || true
      (cd "$debs" && { apt-get download -qq "$p=$v" || apt-get download -qq "$p"; } >/dev/null 2>&1) ||
        { echo "gpu-bundle: apt-get download $p failed" >&2; exit 1; }
    fi
    file=$(ls "$debs/${p}_"*"_${a}.deb" | head -1)
  fi
  dpkg -x "$file" "$stage"
  echo "  $(basename "$file" .deb)" >>"$manifest"
done

# Headers, CMake configs, and the libraries with their link-time names.
cp -a "$stage/usr/include" "$out/usr/"
cp -a "$stage/usr/lib/$arch/cmake" "$out/usr/lib/$arch/"
rm -rf "$out/usr/lib/$arch/cmake/protobuf"  # protoc's; FindProtobuf reads the headers
cp -a "$stage/usr/share/cmake/Gloo" "$stage/usr/share/cmake/nlohmann_json" "$out/usr/share/cmake/"
cp -a "$stage"/usr/lib/libgloo.so* "$out/usr/lib/"
# Debian's Gloo config names its library by absolute path (/usr/lib/libgloo.so.*): made relative
# to the config's own prefix, as the other packages' are, so that it finds the bundle's copy.
sed -i 's#"/usr/lib/#"${_IMPORT_PREFIX}/lib/#g' "$out"/usr/share/cmake/Gloo/GlooTargets-*.cmake
if grep -rq '"/usr/' "$out/usr/share/cmake/Gloo"; then
  echo "gpu-bundle: Gloo's CMake config still names a path under /usr" >&2; exit 1
fi
# (Some packages, zlib1g's among them, still ship their libraries under /lib.)
for f in "$stage/usr/lib/$arch"/*.so* "$stage/lib/$arch"/*.so* "$stage/usr/lib/$arch"/lib{gtest,gmock}*.a; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  cp -a "$f" "$out/usr/lib/$arch/"
done
# What the build never reads: static archives (but GoogleTest's), protoc's library, docs.
find "$out/usr/lib/$arch" -maxdepth 1 -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' -delete
find "$out/usr/lib/$arch" -maxdepth 1 -name 'libprotoc*' -delete
find "$out/usr/lib/$arch" -maxdepth 1 -name 'libprotobuf-lite*' -delete
rm -rf "$out/usr/include/google/protobuf/compiler" "$out/usr/include/gmock/internal/custom/README.md"
find "$out/usr/include" -name '*.proto' -delete
# Links within the bundle, never to this machine's files; links that point at nothing left
# (protoc's, libprotobuf-lite's) would only mislead CMake.
find "$out/usr" -type l | while read -r link; do
  target=$(readlink "$link")
  case "$target" in /*) ln -sfn "$(basename "$target")" "$link" ;; esac
done
find "$out/usr" -xtype l -delete
for f in "$out/usr/lib/$arch"/*.so.*; do
  [ -L "$f" ] && continue
  patchelf --set-rpath '$ORIGIN' "$f"
done
for f in "$out"/usr/lib/libgloo.so.*; do
  [ -L "$f" ] || patchelf --set-rpath "\$ORIGIN/$arch" "$f"
done

# CMake's exported targets check that every file they name exists; the bundle leaves out what
# the build never uses (gRPC's code generator plugins, say), so those checks go.
python3 - "$out/usr" <<'EOF'
import glob, os, re, sys
usr = sys.argv[1]
for path in (glob.glob(f"{usr}/lib/*/cmake/*/*Targets-*.cmake")
             + glob.glob(f"{usr}/share/cmake/*/*Targets-*.cmake")):
    lines = open(path).read().splitlines(keepends=True)
    kept = []
    for line in lines:
        m = re.match(r'\s*list\(APPEND _(?:cmake_import_check_files_for|IMPORT_CHECK_FILES_FOR)_\S+ (.*)\)', line)
        if m:
            files = re.findall(r'"\$\{_IMPORT_PREFIX\}/([^"]+)"', m.group(1))
            if any(not os.path.lexists(os.path.join(usr, f)) for f in files):
                continue
        kept.append(line)
    if len(kept) != len(lines):
        open(path, "w").writelines(kept)
EOF

# The binaries that do not link LibTorch, and the generated API sources.
for b in trainyard-coordinator trainyard-worker trainyard; do
  cp "$build/bin/$b" "$out/bin/"
  strip "$out/bin/$b"
  patchelf --set-rpath "\$ORIGIN/../usr/lib/$arch:\$ORIGIN/../usr/lib" "$out/bin/$b"
done
(cd "$build/proto/gen" && find trainyard -name '*.pb.*' | tar -cf - -T -) | tar -xf - -C "$out/gen"

# Every carried binary must resolve all its libraries from the bundle and the system's core.
for b in "$out"/bin/*; do
  if ldd "$b" | grep -q 'not found'; then
    echo "gpu-bundle: $b does not resolve:" >&2; ldd "$b" | grep 'not found' >&2; exit 1
  fi
  while read -r lib; do
    case "$lib" in "$out"/*) ;; *) is_system_lib "$lib" ||
      { echo "gpu-bundle: $b loads $lib from outside the bundle" >&2; exit 1; } ;; esac
  done < <(ldd "$b" | awk '/=> \//{print $3}')
done

unpacked_kib=$(du -sk "$out" | cut -f1)
{
  echo
  echo "Contents:"
  for d in bin usr/include "usr/lib/$arch" usr/lib/libgloo.so.0 gen; do
    printf '  %-28s %6s\n' "$d" "$(du -shL "$out/$d" | cut -f1)"
  done
  echo
  echo "Binaries: $(cd "$out/bin" && echo *)"
  echo "Unpacked: $((unpacked_kib / 1024)) MiB"
} >>"$manifest"
# xz: the GPU machine has it (and Python's lzma where tar lacks it).
XZ_OPT="-6 -T0" tar -C "$out" -cJf "$dest/bundle.tar.xz" .
size_kib=$(du -sk "$dest/bundle.tar.xz" | cut -f1)
echo "Packed: .gpu/bundle.tar.xz, $((size_kib / 1024)) MiB (limit ${limit_mib} MiB)" >>"$manifest"
cp "$manifest" "$dest/MANIFEST.txt"
cat "$dest/MANIFEST.txt"
rm -rf "$stage" "$out"
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  echo "gpu-bundle: .gpu is $((size_kib / 1024)) MiB, over ${limit_mib} MiB" >&2
  exit 1
fi
