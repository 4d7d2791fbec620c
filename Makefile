# ztrain -- make deps | make | make test | make run | make bench | make clean
#
# `make` builds build/libztrain.so (runtime + CPU kernels, loaded by the Lua
# FFI) and build/ztrain (the LuaJIT host program). `make run` and `make test`
# install missing Debian packages first (tools/deps.sh), so a fresh machine
# needs nothing but those two commands.
#
# CUDA: `make CUDA=1` builds the library with the CUDA device
# (runtime/device_cuda.c, kernels/cuda/*.cu; nvcc for sm_80 and sm_90) into
# build-cuda/ (build-cuda/libztrain.so, build-cuda/ztrain); build/ stays the
# CPU build, so `make` and `make CUDA=1` coexist in either order (B=DIR
# names another folder). Nothing of CUDA is compiled without CUDA=1.
# `make test-cuda` builds build-cuda/ and runs the GPU tests
# (tools/test_cuda.sh), which skip with one line where no GPU is visible;
# tools/gpu_kit.sh carries build-cuda/ to a GPU machine. docs/gpu.md.

CC      ?= gcc
CFLAGS  ?= -std=c11 -O3 -march=x86-64-v3 -fno-math-errno -fopenmp -fPIC -Wall -Wextra -D_GNU_SOURCE -g
LUAJIT_CFLAGS := $(shell pkg-config --cflags luajit 2>/dev/null || echo -I/usr/include/luajit-2.1)
LUAJIT_LIBS   := $(shell pkg-config --libs luajit 2>/dev/null || echo -lluajit-5.1)
MPI_CFLAGS    := $(shell mpicc --showme:compile 2>/dev/null || echo -I/usr/lib/x86_64-linux-gnu/openmpi/include)
MPI_LIBS      := $(shell mpicc --showme:link 2>/dev/null || echo -lmpi)
UV_CFLAGS     := $(shell pkg-config --cflags libuv 2>/dev/null)
UV_LIBS       := $(shell pkg-config --libs libuv 2>/dev/null || echo -luv)
LIBS    := -lopenblas $(MPI_LIBS) $(UV_LIBS) -lm -lpthread

B := $(if $(CUDA),build-cuda,build)

# SAN=1: the library, the host program and the C tests with AddressSanitizer
# and UndefinedBehaviorSanitizer, in build-san/ (build/ is untouched); plain
# `make SAN=1` builds them and runs tools/san.sh (the C tests, then a short
# 2-rank zero3 run). -O1 keeps the build quick on a shared machine; UB is
# fatal (-fno-sanitize-recover) so a finding cannot scroll past. docs/reliability.md.
ifneq ($(SAN),)
B := build-san
CFLAGS := $(filter-out -O3,$(CFLAGS)) -O1 -fno-omit-frame-pointer \
          -fsanitize=address,undefined -fno-sanitize-recover=all
.DEFAULT_GOAL := san
endif
RUNTIME_SRC := $(filter-out runtime/device_cuda.c runtime/comm_nccl.c,$(wildcard runtime/*.c))
# io_uring (the aio engine's backend, runtime/aio_uring.c) where liburing is
# installed (tools/deps.sh); without it the thread-pool engine alone (URING= forces that)
URING ?= $(shell pkg-config --exists liburing 2>/dev/null && echo 1)
ifeq ($(URING),)
RUNTIME_SRC := $(filter-out runtime/aio_uring.c,$(RUNTIME_SRC))
else
LIBS += $(shell pkg-config --libs liburing 2>/dev/null || echo -luring)
endif
KERNEL_SRC  := $(wildcard kernels/cpu/*.c)
LIB_OBJ     := $(patsubst %.c,$(B)/obj/%.o,$(RUNTIME_SRC) $(KERNEL_SRC))
CTEST_SRC   := $(filter-out spec/c/test_cuda%.c,$(wildcard spec/c/test_*.c))
CTEST_BIN   := $(patsubst spec/c/%.c,$(B)/%,$(CTEST_SRC))
HEADERS     := $(wildcard runtime/*.h) $(wildcard kernels/cpu/*.h)

.PHONY: all deps test test-unit test-e2e run bench bench-scale bench-ops bench-peers torch-venv clean ctest spec test-cuda cuda-check bench-cuda san valgrind fuzz fuzz-smoke
all: $(B)/libztrain.so $(B)/ztrain

# ---- CUDA (only with CUDA=1) ----
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
# -compress-mode=size: the device code compressed in the fatbinary (nvcc
# 13's default left layernorm.o at 4.2 MB, 0.7 MB so; the GPU kit carries
# six binaries of every kernel under the 64 MiB a device call takes). No
# -lineinfo: its line tables doubled the device code (attention_tc.o 1.47
# -> 0.74 MB); add it for source lines in Nsight or compute-sanitizer
# (make CUDA=1 NVCCFLAGS='... -lineinfo ...', then a clean build)
NVCCFLAGS ?= -O3 -std=c++17 -Xcompiler -fPIC,-Wall -compress-mode=size \
             -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart -lstdc++
CUDA_SRC  := $(wildcard kernels/cuda/*.cu)
CUDA_OBJ  := $(patsubst %.cu,$(B)/obj/%.o,$(CUDA_SRC)) $(B)/obj/runtime/device_cuda.o
ifneq ($(words $(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h $(CUDA_HOME)/include/nccl.h)),2)
CTEST_BIN := $(filter-out $(B)/test_mpi_fakecuda,$(CTEST_BIN))
endif
ifneq ($(CUDA),)
# A CUDA build differs in flags (-DZT_CUDA, which names the build; no C
# file tests it since device_cpu.c reaches the CUDA device through weak
# references) and in what it links, so it does not share objects with a
# CPU build: B defaults to build-cuda/ with CUDA=1 (above;
# spec/e2e/build_dirs_spec.lua checks both builds).
CFLAGS  += -DZT_CUDA -I$(CUDA_HOME)/include
LIB_OBJ += $(CUDA_OBJ) $(B)/obj/runtime/comm_nccl.o
LIBS    += $(CUDA_LIBS) -lnccl
# test_mpi_fakecuda defines the CUDA runtime's and NCCL's calls itself: it
# links the CPU library only
CTEST_BIN := $(filter-out $(B)/test_mpi_fakecuda,$(CTEST_BIN))
endif

# ptxas's resource report kept beside each object (tools/ptxas_check.sh
# fails on spills); nvcc's other output still shown
$(B)/obj/%.o: %.cu $(wildcard kernels/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xptxas -v -c $< -o $@ 2> $@.ptxas; rc=$$?; \
	  grep -v -e '^ptxas info' -e 'bytes stack frame' $@.ptxas >&2; exit $$rc

# The CUDA kernels against their CPU twins. Links no MPI, libuv, LuaJIT or
# OpenBLAS (matmul is checked against a double-precision loop), so it builds
# on a GPU machine with nothing but the CUDA toolkit and gcc.
CUDA_TEST_OBJ := $(CUDA_OBJ) $(B)/obj/runtime/error.o \
                 $(patsubst %.c,$(B)/obj/%.o,$(filter-out kernels/cpu/matmul.c,$(KERNEL_SRC)))
$(B)/test_cuda: spec/c/test_cuda.c $(CUDA_TEST_OBJ) spec/c/ctest.h
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -Iruntime -Ikernels/cpu -Ispec/c -o $@ $< \
	    $(CUDA_TEST_OBJ) $(CUDA_LIBS) -lm -lpthread

# The CUDA ops at GPT-2 124M shapes, ms per call (needs a GPU).
$(B)/bench_cuda: tools/bench_cuda.c $(CUDA_TEST_OBJ)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -Iruntime -Ikernels/cpu -o $@ $< $(CUDA_TEST_OBJ) $(CUDA_LIBS) -lm -lpthread
bench-cuda:
	$(MAKE) CUDA=1 B=build-cuda build-cuda/bench_cuda build-cuda/bench_cuda_dqatomic
	build-cuda/bench_cuda
	build-cuda/bench_cuda_dqatomic

# The price of the attention backward's determinism (GPU-Attention): the
# tensor-core kernels built with dQ by fp32 atomics (FA2's scheme; never in
# the library), timed at bench_cuda's attention shapes. For sm_90 only (the
# H100 and H200 the kit runs on): one arch keeps its compile to a third.
DQATOMIC_NVCCFLAGS ?= -O3 -std=c++17 -Xcompiler -fPIC,-Wall -compress-mode=size \
                      -gencode arch=compute_90,code=sm_90
$(B)/obj/dqatomic/kernels/cuda/attention_tc_bwd.o: kernels/cuda/attention_tc_bwd.cu $(wildcard kernels/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(DQATOMIC_NVCCFLAGS) -DZKC_ATTN_TC_DQ_ATOMIC -Xptxas -v -c $< -o $@ 2> $@.ptxas; rc=$$?; \
	  grep -v -e '^ptxas info' -e 'bytes stack frame' $@.ptxas >&2; exit $$rc
DQATOMIC_OBJ := $(filter-out $(B)/obj/kernels/cuda/attention_tc_bwd.o,$(CUDA_TEST_OBJ)) \
                $(B)/obj/dqatomic/kernels/cuda/attention_tc_bwd.o
$(B)/bench_cuda_dqatomic: tools/bench_cuda.c $(DQATOMIC_OBJ)
	$(CC) $(CFLAGS) -DBENCH_DQ_ATOMIC -I$(CUDA_HOME)/include -Iruntime -Ikernels/cpu -o $@ $< $(DQATOMIC_OBJ) $(CUDA_LIBS) -lm -lpthread

# Builds into build-cuda/ (not build/) and runs the GPU tests
# (tools/test_cuda.sh; "skipped" where no GPU is visible): test_cuda, the
# kernels against their CPU twins (cuda-check: that alone, no
# MPI/libuv/OpenBLAS/LuaJIT); test_cuda_seams, the Seams API (stream.c,
# pinned host tier, nvme) on the GPU through the whole library;
# test_cuda_nccl under mpirun -np 2, device-tensor collectives through MPI
# staged in pinned memory and through NCCL; then whole training steps
# through build-cuda/ztrain (spec/cuda/whole_step.lua, CPU against GPU;
# spec/cuda/strategies.lua, dp and ZeRO 1-3 on 2 ranks sharing the GPU).
test-cuda:
	$(MAKE) CUDA=1 B=build-cuda build-cuda/libztrain.so build-cuda/ztrain build-cuda/test_cuda \
	    build-cuda/test_cuda_seams build-cuda/test_cuda_nccl
	sh tools/ptxas_check.sh build-cuda
	sh tools/test_cuda.sh build-cuda
cuda-check:
	$(MAKE) CUDA=1 B=build-cuda build-cuda/test_cuda
	build-cuda/test_cuda

deps:
	@sh tools/deps.sh

$(B)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) $(UV_CFLAGS) -Iruntime -Ikernels/cpu -c $< -o $@

$(B)/libztrain.so: $(LIB_OBJ)
	$(CC) $(CFLAGS) -shared -o $@ $(LIB_OBJ) $(LIBS)

$(B)/ztrain: host/main.c
	@mkdir -p $(B)
	$(CC) $(CFLAGS) $(LUAJIT_CFLAGS) -o $@ $< $(LUAJIT_LIBS) -ldl -Wl,-E

# comm_stage.c (MPI with device tensors, through the device's execution
# table) and comm_nccl.c under mpirun on the CPU, against a fake device
# (zt_device_install), CUDA and NCCL: comm_nccl.c is CUDA-only, so it is
# compiled here with the CUDA and NCCL headers (skipped without them); its
# zt_comm_use_nccl replaces comm.c's weak one; the rest is the library's.
FAKEDEV_SRC := runtime/comm_nccl.c
FAKEDEV_OBJ := $(patsubst %.c,$(B)/obj/fakenccl/%.o,$(FAKEDEV_SRC)) \
               $(filter-out $(patsubst %.c,$(B)/obj/%.o,$(FAKEDEV_SRC)),$(LIB_OBJ))
$(B)/obj/fakenccl/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) -I$(CUDA_HOME)/include -Iruntime -Ikernels/cpu -c $< -o $@
$(B)/test_mpi_fakecuda: spec/c/test_mpi_fakecuda.c $(FAKEDEV_OBJ) $(wildcard spec/c/*.h)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) -I$(CUDA_HOME)/include -Iruntime -Ikernels/cpu -Ispec/c -o $@ $< \
	    $(FAKEDEV_OBJ) $(LIBS)

# A kernels/cuda file's own source run on the CPU under spec/emu/cuda_emu.h
# (threads, barriers, warp shuffles, WMMA) against its CPU twin, in
# spec/emu/test_NAME_emu.c: C tests of make test (tools/emu_kernel.sh).
EMU_KERNELS := attention attention_tc layernorm xent colsum embedding reduce rope swiglu adamw
EMU_BIN     := $(patsubst %,$(B)/emu/test_%_emu,$(EMU_KERNELS))
$(B)/emu/test_%_emu: kernels/cuda/%.cu spec/emu/test_%_emu.c $(wildcard spec/emu/*.h) \
        tools/emu_kernel.sh $(LIB_OBJ)
	NO_RUN=1 sh tools/emu_kernel.sh $* $(B)
# a family in several files: kernels/cuda/NAME_*.cu and NAME.cuh
$(B)/emu/test_attention_tc_emu: kernels/cuda/attention_tc_fwd.cu kernels/cuda/attention_tc_bwd.cu \
        kernels/cuda/attention_tc.cuh spec/emu/test_attention_tc_emu.c $(wildcard spec/emu/*.h) \
        spec/c/attn_tc_check.h tools/emu_kernel.sh $(LIB_OBJ)
	NO_RUN=1 sh tools/emu_kernel.sh attention_tc $(B)
CTEST_BIN += $(EMU_BIN)

$(B)/test_%: spec/c/test_%.c $(LIB_OBJ) $(wildcard spec/c/*.h)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) -Iruntime -Ikernels/cpu -Ispec/c -o $@ $< $(LIB_OBJ) $(LIBS)

# All C tests and busted specs; the last line is "N passed, N failed".
# Before them, a fuzz smoke run (make fuzz-smoke; one skip line without clang);
# a finding there is counted as one failure.
# Where nvcc is present, first the CUDA backend is compiled and linked into
# build-cuda/ and its test run (it skips with one line without a GPU); a
# CUDA build or test failure fails `make test` after the summary. Among the
# specs, build_dirs_spec checks that build/ stayed the CPU build beside
# build-cuda/, and gpu_kit_spec packs the GPU kit and runs it here with the
# system's Lua modules and libraries hidden (tools/kit_bare.sh).
# The builds run TEST_JOBS compiles at a time (default: this machine's
# cores; nvcc's and g++'s are single-threaded, and `make test` is run
# without -j): make test TEST_JOBS=1 builds one file at a time.
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
test: deps
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) all $(CTEST_BIN)
	@cuda_rc=0; if [ -x "$(NVCC)" ]; then \
	  echo "== CUDA backend (nvcc found): make test-cuda into build-cuda/"; \
	  out=$$($(MAKE) --no-print-directory -s -j$(TEST_JOBS) test-cuda 2>&1); cuda_rc=$$?; \
	  echo "$$out" | grep -v '^ok '; \
	  [ $$cuda_rc -eq 0 ] || echo "make test-cuda FAILED (exit $$cuda_rc)"; \
	fi; \
	extra=$$([ $$cuda_rc -eq 0 ] && echo 0 || echo 1); \
	echo "== fuzz smoke ($(FUZZ_RUNS) inputs per reader; make fuzz runs longer)"; \
	$(MAKE) --no-print-directory -s -j$(TEST_JOBS) fuzz-smoke || extra=$$((extra + 1)); \
	EXTRA_FAILED=$$extra sh tools/run_tests.sh $(CTEST_BIN)

# The busted specs alone, by folder (spec/README.md): spec/unit/ calls
# modules in the test's own process (361 cases, 35 s on 2 cores); spec/e2e/ launches
# build/ztrain or mpirun, or trains whole runs. Each ends with "N passed,
# N failed"; `make test` runs both, after the C tests.
test-unit: deps
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) all
	@SPECS=spec/unit sh tools/run_tests.sh
test-e2e: deps
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) all
	@SPECS=spec/e2e sh tools/run_tests.sh

run: deps all
	$(B)/ztrain recipes/zero3_offload.lua $(ARGS)

bench: deps all $(B)/bench_adamw $(B)/bench_aio $(B)/bench_bf16 $(B)/bench_comm_stats
	@sh tools/bench.sh

# The measured scaling table (issue 14; not part of `make test`; root: network
# namespaces): strategies x link rates x 2 and 4 hosts on tools/netcluster.sh,
# then docs/scaling.md's measured block, the model's fit and docs/scaling.svg,
# and the predictions block. About 4 minutes on 2 quiet cores. Re-render from
# the saved results only: make bench-scale BENCH_SCALE_ARGS=reuse=1
bench-scale: deps all
	$(B)/ztrain --script tools/bench_scale.lua $(BENCH_SCALE_ARGS)
	$(B)/ztrain --script tools/scale_predict.lua

# Per-op profile of a training step (docs/performance.md); BENCH_OPS_ARGS:
# e.g. "model=gpt2 B=8 T=512 steps=5 precision=bf16". Writes build/bench_ops.md.
bench-ops: deps all
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(B)/ztrain --script tools/bench_ops.lua $(BENCH_OPS_ARGS)

# ztrain beside PyTorch eager and torch.compile, one sitting (skips without
# PyTorch: $$ZTRAIN_TORCH_PYTHON or ./.venv-torch/bin/python3);
# BENCH_PEERS_ARGS: "models B T threads", e.g. "gpt2 8 512 16"
bench-peers: deps all
	@sh tools/bench_peers.sh $(BENCH_PEERS_ARGS)

# A venv with PyTorch from PyPI for bench-peers (outside git; ~5.5 GB: PyPI's
# Linux torch links CUDA libraries, so its nvidia-* wheels come too, though
# the bench runs on the CPU). make torch-venv TORCH_VENV=/elsewhere, then
# ZTRAIN_TORCH_PYTHON=/elsewhere/bin/python3 make bench-peers.
TORCH_VENV ?= .venv-torch
torch-venv:
	python3 -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/pip install torch numpy
	$(TORCH_VENV)/bin/python3 -c "import torch; print('torch', torch.__version__, 'in $(TORCH_VENV)')"

# bf16 GEMM (AVX512_BF16 or the portable path) beside fp32 sgemm and both peaks
$(B)/bench_bf16: tools/bench_bf16.c $(patsubst %.c,$(B)/obj/%.o,$(KERNEL_SRC)) kernels/cpu/kernels.h
	$(CC) $(CFLAGS) -Ikernels/cpu -o $@ $< $(patsubst %.c,$(B)/obj/%.o,$(KERNEL_SRC)) -lopenblas -lm

# CPU AdamW GB/s beside memcpy, zk_copy and triad bandwidth (run by tools/bench.sh)
$(B)/bench_adamw: tools/bench_adamw.c $(patsubst %.c,$(B)/obj/%.o,$(KERNEL_SRC)) kernels/cpu/kernels.h
	$(CC) $(CFLAGS) -Ikernels/cpu -o $@ $< $(patsubst %.c,$(B)/obj/%.o,$(KERNEL_SRC)) -lopenblas -lm

# CPU kernels at GPT-2 sizes, scalar vs vector paths A/B; GEMM shapes vs one
# threaded sgemm (by hand: make build/bench_kernels build/bench_gemm_shapes)
$(B)/bench_kernels $(B)/bench_gemm_shapes: $(B)/%: tools/%.c $(patsubst %.c,$(B)/obj/%.o,$(KERNEL_SRC)) kernels/cpu/kernels.h
	$(CC) $(CFLAGS) -Ikernels/cpu -o $@ $< $(patsubst %.c,$(B)/obj/%.o,$(KERNEL_SRC)) -lopenblas -lm

# The aio engine's sequential bandwidth beside fio (run by tools/bench.sh)
$(B)/bench_aio: tools/bench_aio.c $(LIB_OBJ)
	$(CC) $(CFLAGS) -Iruntime -o $@ $< $(LIB_OBJ) $(LIBS)

# The comm layer's bookkeeping, measured (the C tests assert no wall-clock
# bounds): the world's start, the counters' cost per operation, a barrier;
# one local rank and 2 MPI ranks (run by tools/bench.sh)
$(B)/bench_comm_stats: tools/bench_comm_stats.c $(LIB_OBJ) $(HEADERS)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) -Iruntime -o $@ $< $(LIB_OBJ) $(LIBS)

# ---- Sanitizers and valgrind (docs/reliability.md) ----
san: $(B)/libztrain.so $(B)/ztrain $(CTEST_BIN)
	@sh tools/san.sh $(B) $(CTEST_BIN)

# memcheck on the C tests of the plain build (MPI tests on one rank is not
# what they test, so those run under mpirun -np 2, each rank under valgrind)
valgrind: all $(CTEST_BIN)
	@sh tools/valgrind.sh $(filter-out $(EMU_BIN),$(CTEST_BIN))   # the emulator: thousands of threads

# ---- Fuzzing (docs/reliability.md): libFuzzer harnesses of the readers ----
# tools/fuzz/harness.c embeds LuaJIT and feeds each input to one reader
# (tools/fuzz/targets.lua), one binary per target, built by clang with
# ASan + UBSan into build-fuzz/. `make fuzz` runs each for FUZZ_SECONDS
# from its seeds (spec/fuzz/TARGET/, read-only; new inputs go to
# build-fuzz/corpus/TARGET/); `make fuzz-smoke` (part of `make test`) runs
# FUZZ_RUNS inputs each. Without clang both say so in one line and pass.
FUZZ_TARGETS := safetensors tokbin bpe_vocab bpe_merges checkpoint recipe
FUZZ_SECONDS ?= 60
FUZZ_RUNS    ?= 500
FUZZ_CC      ?= clang
FUZZ_BIN     := $(patsubst %,build-fuzz/fuzz_%,$(FUZZ_TARGETS))
build-fuzz/fuzz_%: tools/fuzz/harness.c
	@mkdir -p build-fuzz
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	    -DZT_FUZZ_TARGET='"$*"' $(LUAJIT_CFLAGS) -o $@ $< $(LUAJIT_LIBS) -ldl -Wl,-E
# can FUZZ_CC link a libFuzzer binary at all (clang without compiler-rt cannot)?
FUZZ_PROBE = command -v $(FUZZ_CC) >/dev/null 2>&1 && mkdir -p build-fuzz && \
  echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' | \
  $(FUZZ_CC) -fsanitize=fuzzer -x c - -o build-fuzz/probe >/dev/null 2>&1
fuzz: all
	@if ! ($(FUZZ_PROBE)); then echo "fuzz: skipped ($(FUZZ_CC) with libFuzzer not installed)"; \
	else $(MAKE) --no-print-directory -s $(FUZZ_BIN) && \
	  sh tools/fuzz/run.sh -max_total_time=$(FUZZ_SECONDS) $(FUZZ_TARGETS); fi
fuzz-smoke: all
	@if ! ($(FUZZ_PROBE)); then echo "fuzz-smoke: skipped ($(FUZZ_CC) with libFuzzer not installed)"; \
	else $(MAKE) --no-print-directory -s $(FUZZ_BIN) && \
	  sh tools/fuzz/run.sh -runs=$(FUZZ_RUNS) $(FUZZ_TARGETS); fi

clean:
	rm -rf $(B) build-cuda build-san build-fuzz
