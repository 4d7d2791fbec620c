#!/bin/sh
# Run kernels/cuda/attention_tc.cu's source on the CPU (spec/emu/cuda_emu.h:
# threads, barriers, WMMA by its documented meaning) against the CPU twin
# with test_cuda.c's tolerances. No GPU or nvcc needed; needs the CPU
# objects (make all). Usage: tools/emu_attention_tc.sh [build dir, default build];
# SRC=file runs another version of the kernel (e.g. a deliberately broken one);
# NO_RUN=1 builds $B/emu/test_attention_tc_emu only (make test builds it so,
# then runs it with the C tests).
set -e
B=${1:-build}
D=$B/emu
mkdir -p $D
# the launches <<<grid, threads, 0, s>>>(args) become emu_launch(grid, threads, lambda)
sed -E -e 's|#include <cuda_bf16.h>||; s|#include <mma.h>||; s|#include "common.cuh"|#include "cuda_emu.h"|' \
       -e 's/([A-Za-z_0-9]+)<<<(.*), ([^,]+), 0, s>>>\((.*)\);/emu_launch(\2, \3, [=] { \1(\4); });/' \
       ${SRC:-kernels/cuda/attention_tc.cu} > $D/attention_tc_emu.cpp
g++ -std=c++17 -O2 -g -Wall -Wno-unused-function -Wno-unknown-pragmas -pthread -Ispec/emu -c $D/attention_tc_emu.cpp -o $D/attention_tc_emu.o
cc -std=c11 -O2 -g -Wall -Wextra -fopenmp -D_GNU_SOURCE -Ikernels/cpu -Ispec/c -c spec/emu/test_attention_tc_emu.c -o $D/test.o
OBJ=$(ls $B/obj/kernels/cpu/*.o)
g++ -fopenmp -pthread -o $D/test_attention_tc_emu $D/test.o $D/attention_tc_emu.o $OBJ -lopenblas -lm
[ -n "$NO_RUN" ] || $D/test_attention_tc_emu
