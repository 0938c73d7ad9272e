#!/usr/bin/env bash
# Opt-in soak for the 8-guest hang (issue 29, point 9): runs the 8-guest
# benchmark of the test command (`ulnic cluster bench pingpong --nodes 8`,
# four pairs at once, every payload checked) RUNS times, with the device's
# debug log on and a CPU hog beside it (one busy loop per core, so the
# guests, the device and QEMU fight for the CPU). Each run has a deadline;
# a run that fails or passes it stops the soak and keeps its log. Not part
# of `bash .ci/run` (a run takes minutes on 2 cores).
#   ULNIC_SOAK_RUNS      runs (default 50)
#   ULNIC_SOAK_DEADLINE  seconds a run may take before it counts as hung
#                        (default 600)
#   ULNIC_SOAK_HOG       busy loops beside it (default: the number of cores)
#   ULNIC_SOAK_DIR       where the logs go (default: a new temporary directory)
# Prints one line per run and a summary; exits 1 at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${ULNIC_SOAK_RUNS:-50}
deadline=${ULNIC_SOAK_DEADLINE:-600}
hog=${ULNIC_SOAK_HOG:-$(nproc)}
dir=${ULNIC_SOAK_DIR:-$(mktemp -d /tmp/ulnic-soak-XXXXXX)}
mkdir -p "$dir"

cargo build --release -p ulnic-tools --quiet
ulnic=$PWD/target/release/ulnic
"$ulnic" image build >"$dir/image.log" 2>&1

hogs=()
stop_hogs() {
  for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap stop_hogs EXIT
for _ in $(seq "$hog"); do
  (while :; do :; done) &
  hogs+=($!)
done
echo "soak: $runs runs of the 8-guest benchmark, $hog busy loops beside, logs in $dir"

passed=0
for i in $(seq "$runs"); do
  log="$dir/run-$i.log"
  start=$(date +%s)
  set +e
  RUST_LOG=ulnic_device=debug,info timeout --signal=KILL "$deadline" \
    "$ulnic" cluster bench pingpong --nodes 8 --accel tcg --size 8,4096 \
    --iters 300 --json >"$dir/run-$i.json" 2>"$log"
  rc=$?
  set -e
  took=$(($(date +%s) - start))
  lines=$(wc -l <"$dir/run-$i.json")
  if [ "$rc" -eq 0 ] && [ "$lines" -eq 16 ]; then
    passed=$((passed + 1))
    echo "run $i: ok in ${took}s"
    rm -f "$log"
  else
    if [ "$rc" -eq 137 ]; then
      why="hung: killed after ${deadline}s"
    else
      why="exit $rc, $lines of 16 result lines"
    fi
    echo "run $i: FAILED ($why); its log: $log"
    echo "soak: $passed of $i runs passed"
    exit 1
  fi
done
echo "soak: $passed of $runs runs passed"
