#!/bin/sh
# Run a kernels/cuda file's own source on the CPU (spec/emu/cuda_emu.h:
# threads, barriers, warp shuffles, mma.sync and ldmatrix by their per-lane
# register layouts) against its CPU twin, in spec/emu/test_NAME_emu.c. No
# GPU or nvcc needed; needs the CPU objects (make all).
#   sh tools/emu_kernel.sh NAME [build dir, default build]
# NAME: attention_tc, layernorm, xent, colsum, embedding, reduce, rope or swiglu
# (kernels/cuda/NAME.cu; a family without one, attention_tc, is its
# kernels/cuda/NAME_*.cu, each file's own kernels/cuda header -- "NAME.cuh"
# -- written in where it is included). SRC="file ..." runs another version
# of the kernel (e.g. a deliberately broken one; a family's every file,
# broken or not); EMU_DEFS=-DX compiles it and the test
# with a macro (attention_tc: -DZKC_ATTN_TC_DQ_ATOMIC); NO_RUN=1 builds $B/emu/test_NAME_emu
# only (make test builds it so, then runs it with the C tests).
set -e
N=${1:?usage: sh tools/emu_kernel.sh NAME [build dir]}
B=${2:-build}
D=$B/emu
[ -f spec/emu/test_${N}_emu.c ] || { echo "emu_kernel: no spec/emu/test_${N}_emu.c" >&2; exit 2; }
mkdir -p $D
# the launches <<<grid, threads, shared bytes, s>>>(args), each on one line,
# become emu_launch(grid, threads, lambda, shared bytes) (a template
# kernel's name, k<HD><<< or k<HD, IO><<<, too); kernels/cuda/mma.cuh's
# instructions are cuda_emu.h's own functions
if [ -z "$SRC" ]; then
  if [ -f kernels/cuda/$N.cu ]; then SRC=kernels/cuda/$N.cu; else SRC=$(ls kernels/cuda/${N}_*.cu); fi
fi
# a kernels/cuda header other than mma.cuh, common.cuh or kernels.cuh written in
# at its #include (its own guard keeps the second copy out)
awk '/^#include "[A-Za-z_0-9]+\.cuh"/ { f = $2; gsub(/"/, "", f);
       if (f != "mma.cuh" && f != "common.cuh" && f != "kernels.cuh") {
         while ((getline l < ("kernels/cuda/" f)) > 0) print l; close("kernels/cuda/" f); next } }
     { print }' $SRC |
sed -E -e 's|#include <cuda_bf16.h>||; s|#include <mma.h>||; s|#include "mma.cuh"||; s|#include "common.cuh"|#include "cuda_emu.h"|' \
       -e 's/([A-Za-z_0-9]+(<[A-Za-z_0-9, ]+>)?)<<<(.*), ([^,]+), ([^,]+), s>>>\((.*)\);/emu_launch(\3, \4, [=] { \1(\6); }, \5);/' \
       > $D/${N}_emu.cpp
g++ -std=c++17 -O2 -g -Wall -Wno-unused-function -Wno-unknown-pragmas -pthread -Ispec/emu $EMU_DEFS -c $D/${N}_emu.cpp -o $D/${N}_emu.o
cc -std=c11 -O2 -g -Wall -Wextra -fopenmp -D_GNU_SOURCE -Ikernels/cpu -Ispec/c $EMU_DEFS -c spec/emu/test_${N}_emu.c -o $D/test_${N}.o
OBJ=$(ls $B/obj/kernels/cpu/*.o)
g++ -fopenmp -pthread -o $D/test_${N}_emu $D/test_${N}.o $D/${N}_emu.o $OBJ -lopenblas -lm
[ -n "$NO_RUN" ] || $D/test_${N}_emu
