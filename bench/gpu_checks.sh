#!/usr/bin/env bash
# The GPU checks still pending, in one device call that fits a session's device time (15 minutes, a machine's
# start included), most wanted first; each step has its own time limit, so a slow one leaves the next their share:
#   run(command="bash bench/gpu_checks.sh", carry=[".device"], timeout_s=560)
# 0. the memory plan within 10 % above a step's allocator peak (issue 47 item 2; node and link steps, fp32 and bf16);
# 1. the CUDA path's tests: several CUDA ranks sharing the GPU (tests/ntp/test_cuda_ranks.py, never run yet), the
# streamed NN stage's, the rest; 2. products scale
# (2.4M vertices, 120M edges), coupled GCN: the NN stage streamed in row blocks (--nn-device stream) in bf16 under
# budgets of 2 GB and 1 GB, with the slice on the device (--offload topology) at 3.5 GB, and the NN stage on the
# host (--nn-device cpu) beside them (fp32 streamed and in-device: docs/benchmarks.md, section 8).
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
step memory-plan 90 bash -c 'python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/ntp/test_cuda.py \
  -k "memory_plan" 2>&1 | grep -E "memory plan|passed|failed|Error" | tail -15'
step cuda-tests 160 bash -c 'python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/ntp/test_cuda_ranks.py \
  tests/ntp/test_cuda_stream.py tests/ntp/test_cuda.py 2>&1 | grep -E "streamed step|passed|failed|Error" | tail -25'
step stream 290 python3 bench/gpu.py --size products --epochs 4 --no-pyg --budget 2GB 1GB 3.5GB --variants \
  "gcn --offload all --nn-device stream --precision bf16" "gcn --offload topology --nn-device stream" \
  "gcn --offload all --nn-device cpu"
