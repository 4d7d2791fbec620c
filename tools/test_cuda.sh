#!/bin/sh
# tools/test_cuda.sh -- runs the GPU tests of an already built build-cuda/
# (make test-cuda builds, then calls this; tools/gpu_kit.sh calls it on a
# GPU machine that has the binaries but no compiler toolchain for the rest).
# Each test prints one skip line and passes where no GPU is visible. Every
# test runs even after one fails (a lent GPU's minutes are few: one failure
# must not hide the rest); exit status: that of the first test that failed.
#   sh tools/test_cuda.sh [BUILD_DIR]          (default build-cuda)
set -e
cd "$(dirname "$0")/.."
B=${1:-build-cuda}
for f in test_cuda test_cuda_seams test_cuda_nccl libztrain.so ztrain; do
  [ -e "$B/$f" ] || { echo "test_cuda.sh: $B/$f is missing: build it first (make test-cuda)" >&2; exit 2; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
first=0
run() {
  rc=0
  "$@" || rc=$?
  if [ $rc -ne 0 ]; then
    echo "test_cuda.sh: FAILED (exit $rc): $*"
    [ $first -ne 0 ] || first=$rc
  fi
}
run "$B/test_cuda"
run "$B/test_cuda_seams"
# device-tensor collectives under mpirun -np 2: staged through MPI (ranks
# may share a GPU) and through NCCL (one GPU per rank; skips with fewer);
# then NCCL with one rank (comm_nccl.c on a one-GPU machine)
if command -v mpirun >/dev/null; then
  for m in mpi nccl; do
    echo "mpirun -np 2 $B/test_cuda_nccl $m"
    run mpirun --oversubscribe -np 2 "$B/test_cuda_nccl" $m
  done
  echo "mpirun -np 1 $B/test_cuda_nccl nccl"
  run mpirun -np 1 "$B/test_cuda_nccl" nccl
else
  echo "cuda mpi/nccl: no mpirun, skipped"
fi
# Whole training steps through $B/ztrain: it loads the library beside it,
# and ZTRAIN_LIB is named anyway, so one left in the environment cannot
# point the run at another build. whole_step.lua: the CPU against the GPU,
# gpt2-tiny and hs64 (heads of 64, seq_len 100), fp32 and bf16: losses,
# gradients, parameters within stated tolerances, c_attn.bias's
# zero-gradient k-slices within their rounding and summed-learning-rate
# bounds, no tensor-core call; then with the tensor-core attention
# (device.attention=bf16, hs64): every attention call must take it.
# strategies.lua: every recipe in recipes/ (28 cases: fp32, bf16, fp16,
# activation checkpointing, pipedream), each twice (same bits) and against
# one rank accumulating, 2-4 ranks sharing the GPU.
ZT="env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ZTRAIN_LIB=$(pwd)/$B/libztrain.so $B/ztrain"
run $ZT --script spec/cuda/whole_step.lua
# and with the GPU's tensor-core attention (device.attention=bf16): bf16 only
run $ZT --script spec/cuda/whole_step.lua precision=bf16 attention_b=bf16 config=hs64
if command -v mpirun >/dev/null; then
  run $ZT --script spec/cuda/strategies.lua
else
  echo "cuda strategies: no mpirun, skipped"
fi
exit $first
