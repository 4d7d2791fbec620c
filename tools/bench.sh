#!/bin/sh
# bench.sh -- `make bench`: benchmarks run as on a user's machine, with the
# OPENBLAS_* overrides these development machines set removed.
#   1. one-rank step throughput of GPT-2 124M, fp32 and bf16, against the
#      sgemm peak and ztrain's own fp32 and bf16 GEMM peaks
#   1b. the per-op profile of gpt2 and gpt2-medium (tools/bench_ops.lua)
#   1c. the host's own time a step: gpt2's ops at tiny widths (tools/bench_host.lua)
#   2. the strategy table (single at N=1; dp, zero1, zero2, zero3 and the
#      offload settings at N=2)
#   3. pipeline schedules at p=2 (gpt2) and p=4 (gpt2-mini): measured bubble
#   build/bench_adamw: CPU AdamW beside copy bandwidth; build/bench_aio: the
#   aio engine's sequential write/read bandwidth (named: io_uring or the
#   thread pool) beside fio libaio, io_uring and io_uring --fixedbufs (512
#   MiB, 1 MiB blocks, queue depth 8 and 32, O_DIRECT, the same file; fio's
#   columns skipped with a note when fio is absent; build/bench_aio --sweep
#   for depth 1..64 and block 256 KiB..8 MiB); build/bench_comm_stats: the
#   world's start and the communication counters' cost per operation, one
#   local rank and 2 MPI ranks
#   4. data: BPE encoding M tokens/s and the corpus load time (tools/bench_data.lua)
#   5. timings the specs used to assert with a stopwatch, beside their targets
#      (tools/bench_timings.lua): a pre-flight refusal, a job ended after a
#      rank's kill -9, a stuck rank's grace period, a KV-cache step beside a
#      full forward, the profile's share of a step
cd "$(dirname "$0")/.."
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/ztrain --script tools/bench.lua "$@" || exit 1
echo
# per-op profile: time per (phase, op family) of gpt2 and gpt2-medium (build/bench_ops.md)
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/ztrain --script tools/bench_ops.lua || exit 1
echo
# the host's own time a step: GPT-2 124M's op sequence at tiny widths (Lua dispatch, checks)
build/ztrain --script tools/bench_host.lua || exit 1
echo
build/ztrain --script tools/bench_data.lua || exit 1   # BPE tokens/s, dataset load time, beside their targets
build/ztrain --script tools/bench_timings.lua || exit 1   # what specs timed with a stopwatch, beside their targets
build/bench_adamw || exit 1    # CPU AdamW GB/s beside copy and triad bandwidth
echo
build/bench_aio || exit 1      # the aio engine beside fio: same file, block size, queue depth, O_DIRECT
echo
# the comm layer's bookkeeping: world start, counters per operation, a barrier
build/bench_comm_stats || exit 1
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun --oversubscribe --bind-to none -np 2 build/bench_comm_stats || exit 1
echo
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/bench_bf16 || exit 1   # bf16 GEMM vs fp32 sgemm, and both peaks
echo
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/ztrain --script tools/bench_strategies.lua "$@" || exit 1
echo
# pipeline schedules on real ranks: measured bubble beside the simulator's
exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/ztrain --script tools/bench_pipeline.lua
