#!/usr/bin/env bash
# Coverage-guided fuzzing of the device's untrusted inputs (issue 9):
# builds the cargo-fuzz targets in device/fuzz and runs each for a bounded
# time on the corpus kept in the repo. A crash fails the run and leaves
# its input in device/fuzz/artifacts/<target>/ (make it a regression test).
#   ULNIC_FUZZ_SECONDS  seconds per target (default 20)
#   ULNIC_FUZZ_TARGETS  which targets (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${ULNIC_FUZZ_SECONDS:-20}
targets=${ULNIC_FUZZ_TARGETS:-"control chain descriptors vhost_user"}

if ! command -v cargo-fuzz >/dev/null; then
  echo "installing cargo-fuzz"
  cargo install cargo-fuzz --locked --quiet
fi
# cargo fuzz needs nightly flags (-Z sanitizer): use the nightly toolchain
# where it is installed, else let stable accept them.
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  tc=(+nightly)
else
  tc=()
  export RUSTC_BOOTSTRAP=1
fi
cd device/fuzz
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in $targets; do
  mkdir -p "corpus/$t"
  echo "fuzzing $t for ${secs}s"
  # The vhost-user target runs a device whose threads outlive each case and
  # the run (a static device, never stopped): their allocations (glibc's
  # per-thread destructor entry, thread state) read as leaks, per case
  # (-detect_leaks) and at exit (ASAN_OPTIONS). Leaks are checked in the
  # other targets.
  extra=()
  asan=${ASAN_OPTIONS:-}
  if [ "$t" = vhost_user ]; then
    extra=(-detect_leaks=0)
    asan="${asan:+$asan:}detect_leaks=0"
  fi
  if ! ASAN_OPTIONS="$asan" cargo "${tc[@]}" fuzz run "$t" "corpus/$t" -- \
      -max_total_time="$secs" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 "${extra[@]}" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz target $t failed (a crash leaves its input in device/fuzz/artifacts/$t/)" >&2
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|new_units_added)' "$log" | sed "s/^/  $t: /"
done
