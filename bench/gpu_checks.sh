#!/usr/bin/env bash
# The GPU checks still pending, in one device call that fits a session's device time (15 minutes, a machine's
# start included), most wanted first; each step has its own time limit, so a slow one leaves the next their share:
#   run(command="bash bench/gpu_checks.sh", carry=[".device"], timeout_s=560)
# 1. the CUDA path's tests, twice (a chunked offload case failed 3 times in 5 on an H100 before small topologies were
# staged instead of locked; 43 cases now, with link prediction and R-GCN in bf16 and a link encoder on the host); 2. one
# rank in bf16 (its peak against the memory plan's 3.5 GB: the plan no longer counts one rank's slice twice) and
# --offload all at one rank whose NN stage is on the GPU: its slice is the NN stage's rows, which now stay there while
# the topology streams (the 8GB budget once streamed the slice, 3.83x the in-device epoch); 3. the NN stage on the host,
# where --offload all streams the slice in pipelined blocks (3GB: 2 blocks of 32 beside the topology; 1GB: over a
# streamed topology) against the same stage with the slice on the device; 4. a profile of the 3GB case (do the copies
# and the products overlap now?).
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
step cuda-tests 120 bash -c 'for i in 1 2; do python3 -m pytest -q -m gpu -p no:cacheprovider tests/ntp/test_cuda.py | tail -3; done'
step offload 200 python3 bench/gpu.py --size products --epochs 4 --budget 8GB 6GB --no-pyg \
  --variants "gcn coupled" "gcn --precision bf16" "gcn --offload all"
step streamed 140 python3 bench/gpu.py --size products --epochs 3 --budget 3GB 1GB --no-pyg \
  --variants "gcn --nn-device cpu" "gcn --offload all --nn-device cpu"
step profile 80 python3 bench/profile_epoch.py --size products --epochs 2 --rows 25 \
  --options offload=all memory_budget=3GB nn_device=cpu
