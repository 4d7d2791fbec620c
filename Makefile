# ztrain -- make deps | make | make test | make run | make bench | make clean
#
# `make` builds build/libztrain.so (runtime + CPU kernels, loaded by the Lua
# FFI) and build/ztrain (the LuaJIT host program). `make run` and `make test`
# install missing Debian packages first (tools/deps.sh), so a fresh machine
# needs nothing but those two commands.

CC      ?= gcc
CFLAGS  ?= -std=c11 -O3 -march=x86-64-v3 -fno-math-errno -fopenmp -fPIC -Wall -Wextra -D_GNU_SOURCE -g
LUAJIT_CFLAGS := $(shell pkg-config --cflags luajit 2>/dev/null || echo -I/usr/include/luajit-2.1)
LUAJIT_LIBS   := $(shell pkg-config --libs luajit 2>/dev/null || echo -lluajit-5.1)
MPI_CFLAGS    := $(shell mpicc --showme:compile 2>/dev/null || echo -I/usr/lib/x86_64-linux-gnu/openmpi/include)
MPI_LIBS      := $(shell mpicc --showme:link 2>/dev/null || echo -lmpi)
UV_CFLAGS     := $(shell pkg-config --cflags libuv 2>/dev/null)
UV_LIBS       := $(shell pkg-config --libs libuv 2>/dev/null || echo -luv)
LIBS    := -lopenblas $(MPI_LIBS) $(UV_LIBS) -lm -lpthread

B := build
RUNTIME_SRC := $(filter-out runtime/main.c,$(wildcard runtime/*.c))
KERNEL_SRC  := $(wildcard kernels/cpu/*.c)
LIB_OBJ     := $(patsubst %.c,$(B)/obj/%.o,$(RUNTIME_SRC) $(KERNEL_SRC))
CTEST_SRC   := $(wildcard spec/c/test_*.c)
CTEST_BIN   := $(patsubst spec/c/%.c,$(B)/%,$(CTEST_SRC))
HEADERS     := $(wildcard runtime/*.h) $(wildcard kernels/cpu/*.h)

.PHONY: all deps test run bench clean ctest spec
all: $(B)/libztrain.so $(B)/ztrain

deps:
	@sh tools/deps.sh

$(B)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) $(UV_CFLAGS) -Iruntime -Ikernels/cpu -c $< -o $@

$(B)/libztrain.so: $(LIB_OBJ)
	$(CC) $(CFLAGS) -shared -o $@ $(LIB_OBJ) $(LIBS)

$(B)/ztrain: runtime/main.c
	@mkdir -p $(B)
	$(CC) $(CFLAGS) $(LUAJIT_CFLAGS) -o $@ $< $(LUAJIT_LIBS) -ldl -Wl,-E

$(B)/test_%: spec/c/test_%.c $(LIB_OBJ) $(wildcard spec/c/*.h)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) -Iruntime -Ikernels/cpu -Ispec/c -o $@ $< $(LIB_OBJ) $(LIBS)

# All C tests and busted specs; the last line is "N passed, N failed".
test: deps all $(CTEST_BIN)
	@sh tools/run_tests.sh $(CTEST_BIN)

run: deps all
	$(B)/ztrain recipes/zero3_offload.lua $(ARGS)

bench: deps all $(B)/bench_adamw $(B)/bench_aio $(B)/bench_bf16
	@sh tools/bench.sh

# bf16 GEMM (AVX512_BF16 or the portable path) beside fp32 sgemm and both peaks
$(B)/bench_bf16: tools/bench_bf16.c $(patsubst %.c,$(B)/obj/%.o,$(KERNEL_SRC)) kernels/cpu/kernels.h
	$(CC) $(CFLAGS) -Ikernels/cpu -o $@ $< $(patsubst %.c,$(B)/obj/%.o,$(KERNEL_SRC)) -lopenblas -lm

# CPU AdamW GB/s beside memcpy, zk_copy and triad bandwidth (run by tools/bench.sh)
$(B)/bench_adamw: tools/bench_adamw.c $(patsubst %.c,$(B)/obj/%.o,$(KERNEL_SRC)) kernels/cpu/kernels.h
	$(CC) $(CFLAGS) -Ikernels/cpu -o $@ $< $(patsubst %.c,$(B)/obj/%.o,$(KERNEL_SRC)) -lopenblas -lm

# The aio engine's sequential bandwidth beside fio (run by tools/bench.sh)
$(B)/bench_aio: tools/bench_aio.c $(LIB_OBJ)
	$(CC) $(CFLAGS) -Iruntime -o $@ $< $(LIB_OBJ) $(LIBS)

clean:
	rm -rf $(B)
