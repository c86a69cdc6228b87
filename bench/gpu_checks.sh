#!/usr/bin/env bash
# The GPU checks still pending, in one device call that fits a session's device time (15 minutes, a machine's
# start included), most wanted first; each step has its own time limit, so a slow one leaves the next their share:
#   run(command="bash bench/gpu_checks.sh", carry=[".device"], timeout_s=560)
# 1. the CUDA path's tests (44 cases; 43 passed twice on an H100 on 2026-11-27; new since: a bf16 product's edge
# values gathered in bf16); 2. one rank in bf16 at products scale against fp32 (4.12 GB on 2026-11-27 with the
# values made in float32 first; about 3.6 GB expected now); 3. bench/link_pyg.py on the GPU (its ntp peak held the
# last phase's only before 2026-11-27); 4. GraphSAGE on ogbl-ddi, seeds 8 and 9 (seeds 5-7 ran on the H100).
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
step cuda-tests 80 bash -c 'python3 -m pytest -q -m gpu -p no:cacheprovider tests/ntp/test_cuda.py | tail -3'
step bf16 140 python3 bench/gpu.py --size products --epochs 4 --no-pyg --variants "gcn coupled" "gcn --precision bf16"
step link-pyg 120 python3 bench/link_pyg.py --device cuda --epochs 3 --threads 8
step ddi-seeds 200 python3 bench/link_ddi.py --models sage --seeds 8 9 --out "${OUT:-/tmp}/runs"
