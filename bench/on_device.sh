#!/usr/bin/env bash
# Run a command on a lent GPU machine with what bench/device_kit.sh packed (carried as .device/):
#   bash bench/on_device.sh python3 bench/gpu.py --size products
# Installs the wheels into /tmp/site (the machine is bare each time it starts), puts them and the repository on
# PYTHONPATH, points the benchmarks at the carried datasets, and copies their results (bench/out) and any runs kept
# in .device/runs (link_ddi.py --out .device/runs) to $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d .device/wheels ]; then
  echo "no .device/ here: run 'bash bench/device_kit.sh' on the workstation and carry .device" >&2
  exit 2
fi
if [ ! -f /tmp/site/.from-device-kit ]; then  # once per machine
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .device/wheels/*.whl
  touch /tmp/site/.from-device-kit
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NTP_DATASETS="$PWD/.device/datasets" NTP_DATA_DIR="${NTP_DATA_DIR:-/tmp/ntp-data}"
status=0
"$@" || status=$?
if [ -n "${OUT:-}" ]; then
  [ -d bench/out ] && cp -r bench/out "$OUT/bench-out"
  [ -d .device/runs ] && cp -r .device/runs "$OUT/runs"
fi
exit "$status"
