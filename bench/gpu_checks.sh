#!/usr/bin/env bash
# The GPU checks still pending, in one device call that fits a session's device time (15 minutes, a machine's
# start included), most wanted first; each step has its own time limit, so a slow one leaves the next their share:
#   run(command="bash bench/gpu_checks.sh", carry=[".device"], timeout_s=560)
# 1. the CUDA path's tests, three times (a chunked offload case failed 3 times in 5 on an H100 before small
# topologies were staged instead of locked); 2. --offload all where the slice streams (8GB and 7GB: the topology
# kept, 2 and 3 blocks; 6GB: streamed) after its slabs' transposes moved to a Triton kernel and its blocks were
# pipelined (3.8-4.2x the in-device epoch before); 3. a profile of the 8GB case (do the copies and the products
# overlap now?); 4. the large graph's rows (6M vertices, 300M edges, its store built first).
# Each step's output goes to $OUT/<step>.log (or /tmp), its last lines to stdout; bench/on_device.sh copies bench/out
# to $OUT as well.
set -uo pipefail
cd "$(dirname "$0")/.."
child=""
# timeout runs a step in a process group of its own: stopped from outside, this script stops the step with it
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait; exit 143' INT TERM
step() {  # step NAME SECONDS COMMAND...
  local name=$1 seconds=$2 status
  shift 2
  echo "== $name (at most ${seconds} s)"
  timeout --signal=TERM --kill-after=15 "$seconds" bash bench/on_device.sh "$@" > "${OUT:-/tmp}/$name.log" 2>&1 &
  child=$!
  wait "$child"
  status=$?
  child=""
  tail -n 40 "${OUT:-/tmp}/$name.log"
  echo "== $name: exit $status"
}
step cuda-tests 110 bash -c 'for i in 1 2 3; do python3 -m pytest -q -m gpu -p no:cacheprovider tests/ntp/test_cuda.py | tail -3; done'
step offload 230 python3 bench/gpu.py --size products --epochs 4 --budget 8GB 7GB 6GB --no-pyg \
  --variants "gcn coupled" "gcn --offload all"
step profile 70 python3 bench/profile_epoch.py --size products --options offload=all memory_budget=8GB --rows 25
step large 140 python3 bench/gpu.py --size large --epochs 3 --budget 24GB --no-pyg \
  --variants "gcn coupled" "gcn --dropout 0" "gcn --offload topology" "gcn --offload all"
