#!/usr/bin/env bash
# The project's test entry point (README: "Run the tests").
# Installs what it needs on a fresh Debian machine, then checks format and
# lints and runs every test in release mode (the delivery test moves 1,000,000
# messages, which debug builds make needlessly slow).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "host tools"
# apt-get and dpkg-deb fetch and unpack the guest image and QEMU bundle
# (tests/vm_boot.rs); both are part of every Debian system.
for t in apt-get dpkg-deb; do
  command -v "$t" >/dev/null || { echo "$t missing: this needs a Debian host" >&2; exit 1; }
done
# make and gcc-12 build the guest kernel module (Debian's 6.12 headers use gcc-12);
missing=()
command -v make >/dev/null || missing+=(make)
command -v gcc-12 >/dev/null || missing+=(gcc-12)
# xz unpacks the guest kernel's virtio-net modules for the initramfs.
command -v xz >/dev/null || missing+=(xz-utils)
# sparse checks the module at every build (images::build_module, C=2).
command -v sparse >/dev/null || missing+=(sparse)
# gcc-multilib builds the 32-bit program that checks the driver's
# compat_ioctl (tools/tests/cluster_up.rs).
echo 'int main(void) { return 0; }' | gcc -m32 -static -x c - -o /dev/null 2>/dev/null ||
  missing+=(gcc-multilib)
# pkg-config and g++: the C API's examples build with pkg-config, and its
# header is checked as C++ too (guest-lib/capi/tests).
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v g++ >/dev/null || missing+=(g++)
# tshark reads `ulnic capture` files with the Lua dissector
# (tools/tests/fabric.rs checks tools/wireshark/ulnic.lua).
command -v tshark >/dev/null || missing+=(tshark)
# ssh and sshd: `ulnic fabric up` starts a member through ssh into a
# network namespace where the test runs its own sshd (tools/tests/span.rs).
command -v ssh >/dev/null || missing+=(openssh-client)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
# The peers `ulnic bench compare` runs beside ulnic (tools/tests/bench.rs).
command -v fi_pingpong >/dev/null || missing+=(libfabric-bin)
command -v sockperf >/dev/null || missing+=(sockperf)
# libfabric's headers and libclang: the provider's bindings are generated
# from the installed libfabric at build time (guest-lib/fabric/build.rs).
# (libclang-dev, not only the library: bindgen also needs clang's own
# headers, which come with it.)
[ -f /usr/include/rdma/fabric.h ] || missing+=(libfabric-dev)
dpkg -s libclang-dev >/dev/null 2>&1 || missing+=(libclang-dev)
# Open MPI over the provider (guest-lib/fabric/tests/mpi.rs): mpirun, mpicc.
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v mpicc >/dev/null || missing+=(libopenmpi-dev)
# Unmodified programs the preload layer runs over ulnic
# (guest-lib/preload/tests/preload.rs).
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-benchmark >/dev/null || missing+=(redis-tools)
command -v iperf3 >/dev/null || missing+=(iperf3)
# The server shapes of `bench apps` (tools/tests/bench.rs): memcached and
# memcaslap, nginx and lighttpd under ApacheBench.
[ -x /usr/bin/memcached ] || missing+=(memcached)
command -v memcaslap >/dev/null || missing+=(libmemcached-tools)
[ -x /usr/sbin/nginx ] || missing+=(nginx)
[ -x /usr/sbin/lighttpd ] || missing+=(lighttpd)
command -v ab >/dev/null || missing+=(apache2-utils)
# Event libraries and runtimes under the layer (guest-lib/preload/tests,
# tools/tests/daemons.rs): a libevent program built here, asyncio, Node.js.
[ -f /usr/include/event2/event.h ] || missing+=(libevent-dev)
command -v python3 >/dev/null || missing+=(python3)
command -v node >/dev/null || missing+=(nodejs)
# CPython's own socket test suites, run over the kernel and under the layer
# (guest-lib/preload/tests/cpython.rs).
[ -f /usr/lib/python3.11/test/test_socket.py ] || missing+=(libpython3.11-testsuite)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  # Packages that bring a service (memcached, nginx, lighttpd, redis)
  # must not start it: the tests run their own servers, and a container
  # without an init would fail the install. policy-rc.d is Debian's way
  # to say so (only while installing, and only if none is there).
  policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    policy=/usr/sbin/policy-rc.d
  fi
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  [ -z "$policy" ] || rm -f "$policy"
fi

step "toolchain"
if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust (rustup) first" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo --version

step "format"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --release -- -D warnings

step "build"
cargo build --workspace --release

step "benchmark smoke (ulnic vs tcp, 8 bytes)"
./target/release/ulnic bench pingpong --size 8 --iters 2000 --transport ulnic,tcp --json

step "fuzzing (bounded; ci/fuzz.sh, ULNIC_FUZZ_SECONDS per target)"
bash ci/fuzz.sh

step "tests"
cargo test --workspace --release

