#!/usr/bin/env bash
# One GPU session's checks, in the order the developers' guide asks, as one command for the device tool:
#   run(command="bash benchmarks/gpu_session.sh", timeout_s=600)
# 1. benchmarks.gpu (its self-check, then ours against the plain loop, torch DDP and Lightning), eager;
# 2. #40's checkpoint stall on the host's cores, 6 threads per rank (2 CPU ranks; a core left for the writer);
# 3. #37's cnn on the host's 16 CPU cores (2 ranks x 8 threads: torch DDP, ours, ours over gloo);
# 4. the CUDA tests of the reducer, the async checkpoint snapshot and its direct write, and the fit features.
# Everything lands in $OUT in 8 files (the most the device tool brings back); the step log is session.log.
# The device has torch + Lightning, not hydra: python3.
set -u
OUT=${OUT:-/tmp/gpu_session}
LOG="$OUT/session.log"
mkdir -p "$OUT/gpu" "$OUT/cpu_cnn"
GPU_BUDGET_S=${GPU_BUDGET_S:-200}
step() {  # step NAME TIMEOUT_S COMMAND...: run one step, its output and exit status into the log
    local name=$1 limit=$2; shift 2
    echo "=== $name ($(date +%T))" >> "$LOG"
    timeout "$limit" "$@" >> "$LOG" 2>&1
    echo "=== $name rc=$? ($(date +%T))" >> "$LOG"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$LOG" 2>&1
echo "cores: $(nproc)" >> "$LOG"
step benchmarks.gpu $((GPU_BUDGET_S + 60)) python3 -m benchmarks.gpu --out "$OUT/gpu" --budget-s "$GPU_BUDGET_S" \
    --modes eager
# 6 threads per rank: 4 of the 16 cores left to the background writer (at 8 each, the fifth session's run, none)
OMP_NUM_THREADS=6 step checkpoint_stall 180 python3 -m benchmarks.checkpoint_stall --block 12 --every 6 \
    --out "$OUT/checkpoint_stall.json"
# ~30 s a run there (launches are slow on that host): 6 runs
step cpu_cnn 240 python3 -m benchmarks.run --workloads cnn --contenders torch_ddp,ours,ours_gloo --repeats 2 \
    --launch-repeats 0 --no-sweep --no-accuracy --out "$OUT/cpu_cnn"
rm -f "$OUT/cpu_cnn/results.png"
step cuda_tests 120 python3 -m pytest -q -p no:cacheprovider tests/unit/strategies/test_async_checkpoint.py \
    tests/unit/strategies/test_direct_write.py tests/unit/strategies/test_reducer_copies.py tests/distributed/test_cuda.py \
    tests/unit/trainer/test_fit_features.py -k "not cli"
grep -E "^===|passed|failed|stall|throughput" "$LOG" | tail -30
