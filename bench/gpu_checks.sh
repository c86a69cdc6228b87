#!/usr/bin/env bash
# The GPU checks still pending, in one device call that fits a session's device time (15 minutes, a machine's
# start included), most wanted first; each step has its own time limit, so a slow one leaves the next their share:
#   run(command="bash bench/gpu_checks.sh", carry=[".device"], timeout_s=560)
# 0. the memory plan within 10 % above a step's allocator peak (issue 47 item 2; node and link steps, fp32 and bf16);
# 1. the CUDA path's tests: several CUDA ranks sharing the GPU (tests/ntp/test_cuda_ranks.py, never run yet: streamed
# ranks exchange their rows in passes, never whole on the GPU), the streamed NN stage's (its segments exchange their
# rows with the graph layout in their own passes since 2026-12-01), the rest; 2. products scale (2.4M vertices,
# 120M edges), coupled GCN: in-device beside the NN stage streamed in row blocks (--nn-device stream) in fp32 and
# bf16 under budgets of 2 GB (a third of the in-device peak) and 1 GB, and with the slice on the device (--offload
# topology) at 3.5 GB (docs/benchmarks.md, section 8; since 2026-12-01's second change the 2 GB runs keep the
# topology on the device, and the features stay there at 3.5 GB and in bf16 at 2 GB; since 2026-12-02 the plan goes
# by phase, so --offload topology plans under 2 GB too, where it was refused: its peak must stay under it; and a
# float32 chunk is planned without output rows of its own, as cuSPARSE writes into the product's: the budget runs'
# peaks and test_cuda_stream's "streamed step" ratios check it; and at the end of 2026-12-02 the loss's segment
# takes its gradients in the forward, by count 1,312 bytes a vertex over the bus an epoch where it was 1,696; last,
# --offload all keeps the column slice on the GPU where it fits beside a chunk of the streamed topology: in fp32
# under 3.5 GB and 2 GB, in bf16 under 2 GB and 1 GB, where it streamed; fp32 1 GB still streams it); 3. a profile
# of the streamed epoch at 2 GB with --offload all (the goal's budget): its copy/compute overlap, and the GB it
# copied each way with their rates ("copied an epoch"), beside the count of what the code moves (about 5.2 GB: the
# segments' 3.2 and the topology's 0.5 a product).
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
step memory-plan 50 bash -c 'python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/ntp/test_cuda.py \
  -k "memory_plan" 2>&1 | grep -E "memory plan|passed|failed|Error" | tail -15'
step cuda-tests 140 bash -c 'python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/ntp/test_cuda_ranks.py \
  tests/ntp/test_cuda_stream.py tests/ntp/test_cuda.py 2>&1 | grep -E "streamed step|passed|failed|Error" | tail -25'
step stream 270 python3 bench/gpu.py --size products --epochs 4 --no-pyg --budget 2GB 1GB 3.5GB --variants \
  "gcn coupled" "gcn --offload all --nn-device stream" "gcn --offload all --nn-device stream --precision bf16" \
  "gcn --offload topology --nn-device stream"
step profile 60 python3 bench/profile_epoch.py --size products --epochs 2 --rows 15 \
  --options nn_device=stream offload=all memory_budget=2GB
