#!/bin/sh
# ptxas_check.sh -- every CUDA kernel compiled without register spills.
# Reads the ptxas reports the CUDA build keeps beside its objects
# ($B/obj/kernels/cuda/*.o.ptxas: nvcc -Xptxas -v, every arch of
# NVCCFLAGS) and fails naming each function and arch that spills (stores
# or loads); prints one summary line otherwise. A kernel that spills runs
# at local-memory speed: fix its tiles or launch bounds, do not raise this.
#   sh tools/ptxas_check.sh [build dir, default build-cuda]
B=${1:-build-cuda}
# the library's kernels, and the bench-only dQ-atomics attention where built
set -- $B/obj/kernels/cuda/*.o.ptxas $(ls $B/obj/dqatomic/kernels/cuda/*.o.ptxas 2>/dev/null)
[ -f "$1" ] || { echo "ptxas_check: no reports in $B/obj/kernels/cuda (make CUDA=1 B=$B first)" >&2; exit 2; }
# an object built before the reports were kept has none: rebuild it
for o in $B/obj/kernels/cuda/*.o; do
  [ -f "$o.ptxas" ] || { echo "ptxas_check: $o has no ptxas report (rm it and make CUDA=1 B=$B again)" >&2; exit 2; }
done
awk '
  /Compiling entry function/ { fn = $0; sub(/.*function \047/, "", fn); sub(/\047.*/, "", fn);
                               arch = $0; sub(/.*for \047/, "", arch); sub(/\047.*/, "", arch); n++ }
  /bytes spill stores/ { st = $5 + 0; ld = $9 + 0;
                         if (st > 0 || ld > 0) { bad++; printf "SPILL %s (%s): %d bytes stores, %d bytes loads in %s\n", fn, arch, st, ld, FILENAME } }
  END { if (bad) { printf "ptxas_check: %d of %d kernel builds spill\n", bad, n; exit 1 }
        printf "ptxas_check: %d kernel builds (every arch), no spills\n", n }
' "$@"
