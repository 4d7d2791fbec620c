#!/bin/sh
# tools/gpu_kit.sh -- everything a GPU session needs, built here and carried
# to a GPU machine that has CUDA, nvcc and PyTorch but no package registry
# (the tool library's `device`; docs/gpu.md "Running the GPU checks").
#
#   sh tools/gpu_kit.sh pack         here: build build-cuda/ (sm_80, sm_90),
#                                    fetch the runtime .debs into .gpukit/,
#                                    print the device call to make
#   sh tools/gpu_kit.sh run WHAT...  there: unpack the .debs into /tmp/zkit
#                                    (dpkg -x, nothing installed), then
#                                    WHAT = check | test | bench | torch
#     check  MPI works from the kit: 2 ranks of a tiny CPU training
#     test   tools/test_cuda.sh (make test-cuda's tests, without make)
#     bench  build-cuda/bench_cuda, then tools/bench_gpu.lua (GPT-2 124M,
#            B=16 T=1024 bf16) with each attention mode
#     torch  tools/torch_gpt2_bench.py, eager and torch.compile, same shape
# Logs go to $OUT (the device tool's folder) when set, else build-cuda/kit/.
set -e
cd "$(dirname "$0")/.."
KIT=.gpukit
Z=/tmp/zkit
# Runtime libraries of build-cuda/ (ldd: OpenBLAS, Open MPI, libuv, LuaJIT)
# and what Open MPI's and PMIx's plugins load. Not libc/libstdc++: the GPU
# machine's own are newer.
PKGS="openmpi-bin openmpi-common libopenmpi3 libpmix2 libevent-core-2.1-7 libevent-pthreads-2.1-7
libhwloc15 libhwloc-plugins libfabric1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
libpsm-infinipath1 libpsm2-2 libucx0 libmunge2 libnuma1 libatomic1 libopenblas0-pthread
libgfortran5 libquadmath0 libuv1 libluajit-5.1-2"
BINS="libztrain.so ztrain test_cuda test_cuda_seams test_cuda_nccl bench_cuda"
BIN_PATHS=$(for b in $BINS; do printf 'build-cuda/%s ' "$b"; done)

pack() {
  make -s CUDA=1 B=build-cuda $BIN_PATHS
  mkdir -p "$KIT/debs"
  for p in $PKGS; do
    ls "$KIT/debs/${p}_"*.deb >/dev/null 2>&1 || (cd "$KIT/debs" && apt-get download -q "$p" >/dev/null 2>&1) \
      || { echo "gpu_kit: apt-get download $p failed (run apt-get update first)" >&2; exit 1; }
  done
  kib=$(du -ck $KIT $BIN_PATHS | tail -1 | cut -f1)
  tree=$(git ls-files -z | du -ck --files0-from=- | tail -1 | cut -f1)
  echo "gpu_kit: $(ls $KIT/debs | wc -l) .debs and $(echo $BINS | wc -w) binaries, $((kib / 1024)) MiB," \
       "with the tree $(((kib + tree) / 1024)) MiB of the 64 MiB a device call carries"
  echo "device run: carry = [\".gpukit\"$(for p in $BIN_PATHS; do printf ', "%s"' "$p"; done)]"
  echo "            command = \"sh tools/gpu_kit.sh run check test bench torch\" (or fewer, one call each)"
}

unpack() {
  [ -d "$KIT/debs" ] || { echo "gpu_kit: no $KIT/debs here: run 'sh tools/gpu_kit.sh pack' where apt works, and carry $KIT" >&2; exit 2; }
  for p in $BIN_PATHS; do
    [ -f "$p" ] || { echo "gpu_kit: $p missing: carry it (pack prints the list)" >&2; exit 2; }
  done
  if [ ! -d $Z/usr ]; then
    for d in "$KIT"/debs/*.deb; do dpkg -x "$d" $Z; done
  fi
  L=$Z/usr/lib/x86_64-linux-gnu
  # dpkg -x makes no update-alternatives links: name the real files
  mkdir -p $Z/bin
  ln -sf $Z/usr/bin/orterun $Z/bin/mpirun
  export PATH=$Z/bin:$Z/usr/bin:$PATH
  export LD_LIBRARY_PATH=$L:$L/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # Open MPI and PMIx find their plugins and help files under the prefix
  export OPAL_PREFIX=$Z/usr
  export PMIX_MCA_mca_base_component_path=$L/pmix2/lib/pmix
  export OMPI_MCA_mca_base_component_path=$L/openmpi/lib/openmpi3
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
}

run() {
  unpack
  LOGS=${OUT:-build-cuda/kit}
  mkdir -p "$LOGS"
  failed=""
  command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "gpu_kit: no nvidia-smi here"
  for what in "$@"; do
    case $what in
      check) step check build-cuda/ztrain --nproc 2 recipes/dp.lua device.backend=cpu model.size=gpt2-tiny \
               data.seq_len=32 batch.micro=2 train.steps=2 train.eval_every=0 data.tokenizer=bytes \
               "data.text=$(pwd)/docs/*.md" out=/tmp/zkit-check.$$ ;;
      test)  step test sh tools/test_cuda.sh build-cuda ;;
      bench) step bench_cuda build-cuda/bench_cuda
             for m in exact bf16; do
               step "bench_gpu_$m" build-cuda/ztrain --script tools/bench_gpu.lua attention=$m
             done ;;
      torch) step torch env PYTHONUNBUFFERED=1 python3 tools/torch_gpt2_bench.py ;;
      *) echo "gpu_kit: run takes check, test, bench or torch, not '$what'" >&2; exit 2 ;;
    esac
  done
  if [ -n "$failed" ]; then echo "gpu_kit: FAILED:$failed"; exit 1; fi
  echo "gpu_kit: all passed ($*)"
}

step() { # step NAME command...: run it, output also to $LOGS/NAME.log; note a failure, go on
  name=$1; shift
  echo "== gpu_kit $name: $*"
  { rc=0; "$@" 2>&1 || rc=$?; echo $rc > "$LOGS/.rc.$name"; } | tee "$LOGS/$name.log"
  rc=$(cat "$LOGS/.rc.$name"); rm -f "$LOGS/.rc.$name"
  [ "$rc" = 0 ] || { echo "== gpu_kit $name: FAILED (exit $rc)"; failed="$failed $name"; }
}

case ${1:-} in
  pack) pack ;;
  run) shift; [ $# -gt 0 ] || set -- check test bench torch; run "$@" ;;
  *) echo "usage: sh tools/gpu_kit.sh pack | run [check] [test] [bench] [torch]" >&2; exit 2 ;;
esac
