#!/bin/sh
# bench.sh -- `make bench`: benchmarks run as on a user's machine, with the
# OPENBLAS_* overrides these development machines set removed.
cd "$(dirname "$0")/.."
exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/ztrain --script tools/bench.lua "$@"
