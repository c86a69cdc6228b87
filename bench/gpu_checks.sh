#!/usr/bin/env bash
# The GPU checks still pending, in one device call that fits a session's device time (15 minutes, a machine's
# start included), most wanted first; each step has its own time limit, so a slow one leaves the next their share:
#   run(command="bash bench/gpu_checks.sh", carry=[".device"], timeout_s=560)
# 1. the CUDA path's tests (Triton's dropout kernel among them); 2. the offload rows and the epoch without dropout
# against the in-device epoch on the products-scale graph (issue 12's "--offload topology <= 1.5x, --offload all <=
# 2.5x", "dropout <= 5 %"); 3. bf16 against fp32 on Amazon Photo over ten seeds; 4. the dropout kernel alone at
# products scale against torch's own dropout.
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
step cuda-tests 120 python3 -m pytest -q -m gpu tests/ntp/test_cuda.py
step offload 280 python3 bench/gpu.py --size products --epochs 4 --budget 12GB --no-pyg \
  --variants "gcn coupled" "gcn --dropout 0" "gcn --offload topology" "gcn --offload all"
step precision 120 python3 bench/precision.py --device cuda --graphs amazon-photo --models "gcn decoupled" --seeds 10
step dropout 40 python3 bench/dropout.py --device cuda --rows 2400000 --layers input:100:64 hidden:64:47 \
  --rate 0.5 0.3 --repeats 9
