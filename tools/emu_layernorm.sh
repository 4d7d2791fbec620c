#!/bin/sh
# Run kernels/cuda/layernorm.cu's source on the CPU (spec/emu/cuda_emu.h:
# threads, warp shuffles) against the CPU twin (zk_layernorm_*). No GPU or
# nvcc needed; needs the CPU objects (make all). The same rewriting as
# tools/emu_attention_tc.sh. Usage: tools/emu_layernorm.sh [build dir];
# SRC=file runs another version of the kernel; NO_RUN=1 only builds
# $B/emu/test_layernorm_emu (make test builds it so, then runs it).
set -e
B=${1:-build}
D=$B/emu
mkdir -p $D
# the launches <<<grid, threads, 0, s>>>(args) become emu_launch(grid, threads, lambda)
sed -E -e 's|#include "common.cuh"|#include "cuda_emu.h"|' \
       -e 's/([A-Za-z_0-9]+)<<<(.*), ([^,]+), 0, s>>>\((.*)\);/emu_launch(\2, \3, [=] { \1(\4); });/' \
       ${SRC:-kernels/cuda/layernorm.cu} > $D/layernorm_emu.cpp
g++ -std=c++17 -O2 -g -Wall -Wno-unused-function -Wno-unknown-pragmas -pthread -Ispec/emu -c $D/layernorm_emu.cpp -o $D/layernorm_emu.o
cc -std=c11 -O2 -g -Wall -Wextra -fopenmp -D_GNU_SOURCE -Ikernels/cpu -Ispec/c -c spec/emu/test_layernorm_emu.c -o $D/test_ln.o
OBJ=$(ls $B/obj/kernels/cpu/*.o)
g++ -fopenmp -pthread -o $D/test_layernorm_emu $D/test_ln.o $D/layernorm_emu.o $OBJ -lopenblas -lm
[ -n "$NO_RUN" ] || $D/test_layernorm_emu
