#!/usr/bin/env bash
# Installs libulnic, the C API of the ulnic library, under a prefix:
#
#   PREFIX/lib/libulnic.so.0.1.0   the shared library (soname libulnic.so.0)
#   PREFIX/lib/libulnic.so.0       -> libulnic.so.0.1.0 (what programs load)
#   PREFIX/lib/libulnic.so         -> libulnic.so.0 (what -lulnic links)
#   PREFIX/lib/libulnic.a          the static library
#   PREFIX/include/ulnic.h         the header
#   PREFIX/lib/pkgconfig/ulnic.pc  for pkg-config
#
# usage: guest-lib/capi/install.sh [--prefix DIR] [--from DIR]
#
#   --prefix DIR   where to install (default /usr/local)
#   --from DIR     install the libraries already built in DIR (e.g.
#                  target/release) instead of building them first
#
# Then:  gcc prog.c $(pkg-config --cflags --libs ulnic)
# (with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig for a prefix pkg-config does
# not search, and LD_LIBRARY_PATH=PREFIX/lib or ldconfig to run it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefix=/usr/local
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --from) out=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/../../Cargo.toml" | head -n 1)
major=${version%%.*}
if [ -z "$out" ]; then
  echo "building libulnic $version (cargo build --release -p ulnic-capi)" >&2
  (cd "$here" && cargo build --release -p ulnic-capi)
  out=$(cd "$here" && cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/release
fi
for f in libulnic.so libulnic.a; do
  [ -f "$out/$f" ] || { echo "install.sh: $out/$f missing: build it first, or leave out --from" >&2; exit 1; }
done
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$out/libulnic.so" "$prefix/lib/libulnic.so.$version"
ln -sfn "libulnic.so.$version" "$prefix/lib/libulnic.so.$major"
ln -sfn "libulnic.so.$major" "$prefix/lib/libulnic.so"
install -m 0644 "$out/libulnic.a" "$prefix/lib/libulnic.a"
install -m 0644 "$here/include/ulnic.h" "$prefix/include/ulnic.h"
cat > "$prefix/lib/pkgconfig/ulnic.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: ulnic
Description: ulnic, an emulated user-level NIC: endpoints, RDMA, tripwires, message queues, sockets
Version: $version
Libs: -L\${libdir} -lulnic
Libs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
Cflags: -I\${includedir}
EOF
echo "installed libulnic $version under $prefix" >&2
