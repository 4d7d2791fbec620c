#!/bin/sh
# bench.sh -- `make bench`: benchmarks run as on a user's machine, with the
# OPENBLAS_* overrides these development machines set removed.
#   1. one-rank step throughput of GPT-2 124M against the sgemm peak
#   2. the strategy table (single at N=1; dp, zero1, zero2, zero3 at N=2)
cd "$(dirname "$0")/.."
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/ztrain --script tools/bench.lua "$@" || exit 1
echo
build/bench_adamw || exit 1    # CPU AdamW GB/s beside copy and triad bandwidth
echo
exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/ztrain --script tools/bench_strategies.lua "$@"
