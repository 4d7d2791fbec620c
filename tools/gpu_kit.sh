#!/bin/sh
# tools/gpu_kit.sh -- everything a GPU session needs, built here and carried
# to a GPU machine that has CUDA, nvcc and python3 with PyTorch but no
# package registry and no Debian packages beyond a base image (the tool
# library's `device`; docs/gpu.md "Running the GPU checks").
#
#   sh tools/gpu_kit.sh pack         here: build build-cuda/ (sm_80, sm_90),
#                                    fetch the runtime .debs into .gpukit/debs,
#                                    print the device call to make
#   sh tools/gpu_kit.sh run PART...  there: unpack the .debs into $ZKIT_DIR
#                                    (default /tmp/zkit; dpkg -x, nothing
#                                    installed), then each PART in turn:
#     check  the kit alone, no GPU needed: every carried binary's libraries
#            resolve, 2 MPI ranks of a tiny CPU training (LuaJIT, lua-cjson,
#            Open MPI, OpenBLAS, libuv), tools/bench_gpu.lua on the CPU
#     test   tools/test_cuda.sh (make test-cuda's tests, without make)
#     bench  build-cuda/bench_cuda, build-cuda/bench_cuda_dqatomic (the
#            attention backward with dQ by atomics: the price of
#            determinism), then tools/bench_gpu.lua (GPT-2 124M,
#            B=16 T=1024 bf16) with each attention mode (ZKIT_ATTENTION=bf16:
#            that one alone), and the tensor-core one again with the
#            backward's ordered dQ (ZTRAIN_ATTN_DQ=ordered)
#     torch  tools/torch_gpt2_bench.py, eager and torch.compile, same shape;
#            tools/torch_attention_bench.py, flash attention at bench_cuda's
#            attention shapes
#     all    check test bench torch (also what `run` alone does)
# One log per part (PART.log) and kit.log (the GPU, each part's time and
# status) go to $OUT (the device tool's folder) when set, else
# build-cuda/kit/: at most 5 files. Each part runs under a time limit (LIMITS
# below; the sum, 530 s, keeps `run all` inside 9.5 minutes with the unpack);
# a part that fails or runs out of time is named, the others still run, and
# the exit status says whether all passed.
# Checked here by spec/e2e/gpu_kit_spec.lua (make test): pack, then `run all`
# under tools/kit_bare.sh, a mount namespace in which the system's Lua
# modules and its copies of what the kit carries are hidden (without a GPU,
# test and bench load everything and skip; torch needs the machine's own
# PyTorch).
set -e
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/.."
KIT=.gpukit
Z=${ZKIT_DIR:-/tmp/zkit}
# Runtime libraries of build-cuda/ (ldd: OpenBLAS, Open MPI, libuv, liburing
# where the build found it, LuaJIT, libgomp), what Open MPI's and PMIx's plugins load, and the Lua modules a
# run requires outside the tree (lua-cjson: cjson.so). Not glibc, libgcc_s,
# libstdc++ or zlib: every base image has them and the GPU machine's own are
# newer (tools/kit_bare.sh's BASE list, the same set).
# (libfabric needs ibverbs-providers' libefa: without it Open MPI's ofi
# plugins fail to load, a line each. No libhwloc-plugins: hwloc looks for
# them only under its build-time path, never the kit's.)
PKGS="openmpi-bin openmpi-common libopenmpi3 libpmix2 libevent-core-2.1-7 libevent-pthreads-2.1-7
libhwloc15 libudev1 libfabric1 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200
libpsm-infinipath1 libpsm2-2 libucx0 libmunge2 libnuma1 libatomic1 libgomp1 libopenblas0-pthread
libgfortran5 libquadmath0 libuv1 liburing2 libluajit-5.1-2 lua-cjson"
BINS="libztrain.so ztrain test_cuda test_cuda_seams test_cuda_nccl bench_cuda bench_cuda_dqatomic"
BIN_PATHS=$(for b in $BINS; do printf 'build-cuda/%s ' "$b"; done)
# seconds each part may take (sum 530: unpack and all inside 9.5 minutes; test
# holds spec/cuda/strategies.lua's 66 runs, every recipe twice: estimates);
# ZKIT_LIMITS="test=300 ..." overrides some
LIMITS="${ZKIT_LIMITS:-} check=40 test=240 bench=150 torch=100"

pack() {
  make -s CUDA=1 B=build-cuda $BIN_PATHS
  # the host debug sections compressed in place (zlib: gdb and addr2line
  # read them as they are), ~0.8 MB a binary fewer to carry: the kernels'
  # variants (bf16 parameters, 2-byte gradients) took the kit and the tree
  # past 56 of the 64 MiB a call carries
  for p in $BIN_PATHS; do objcopy --compress-debug-sections=zlib "$p"; done
  mkdir -p "$KIT/debs"
  for p in $PKGS; do
    ls "$KIT/debs/${p}_"*.deb >/dev/null 2>&1 && continue
    (cd "$KIT/debs" && apt-get download -q "$p" >/dev/null 2>&1) ||
      { apt-get update -qq >/dev/null 2>&1 || true; (cd "$KIT/debs" && apt-get download -q "$p" >/dev/null 2>&1); } ||
      { echo "gpu_kit: apt-get download $p failed" >&2; exit 1; }
  done
  # a package no longer listed leaves: run unpacks only what PKGS names,
  # but the carried folder should not hold what is not used
  for d in "$KIT"/debs/*.deb; do
    n=$(basename "$d"); n=${n%%_*}
    case " $(echo $PKGS) " in *" $n "*) ;; *) echo "gpu_kit: $n is not in the kit's list: removed"; rm -f "$d" ;; esac
  done
  # the commit the binaries were built from (the device's copy of .git is
  # the one its first call carried: kit.log named b5a2cb2 for four calls
  # made from four commits)
  { git rev-parse --short HEAD; git diff --quiet HEAD -- . 2>/dev/null || echo "(with uncommitted changes)"; } |
    tr '\n' ' ' > "$KIT/debs/BUILT_FROM"
  kib=$(du -ck $KIT/debs $BIN_PATHS | tail -1 | cut -f1)
  tree=$(git ls-files -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  echo "gpu_kit: $(ls $KIT/debs | wc -l) .debs and $(echo $BINS | wc -w) binaries, $((kib / 1024)) MiB," \
       "with the tree $(((kib + tree) / 1024)) MiB of the 64 MiB a device call carries"
  echo "device run: carry = [\"$KIT/debs\"$(for p in $BIN_PATHS; do printf ', "%s"' "$p"; done)]"
  echo "            command = \"sh tools/gpu_kit.sh run all\" (or some of check test bench torch), timeout_s = 590"
}

unpack() {
  [ -d "$KIT/debs" ] || { echo "gpu_kit: no $KIT/debs here: run 'sh tools/gpu_kit.sh pack' where apt works, and carry $KIT/debs" >&2; exit 2; }
  for p in $BIN_PATHS; do
    [ -f "$p" ] || { echo "gpu_kit: $p missing: carry it (pack prints the list)" >&2; exit 2; }
  done
  debs=""
  for p in $PKGS; do
    d=$(ls "$KIT/debs/${p}_"*.deb 2>/dev/null | head -1)
    [ -n "$d" ] || { echo "gpu_kit: $KIT/debs has no $p: run pack again and carry $KIT/debs" >&2; exit 2; }
    debs="$debs $d"
  done
  # unpacked once per list of .debs: a changed kit is unpacked afresh
  stamp=$(echo $debs)
  if [ "$(cat $Z/.kit 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$Z"; mkdir -p "$Z"
    for d in $debs; do dpkg -x "$d" "$Z"; done
    echo "$stamp" > "$Z/.kit"
  fi
  L=$Z/usr/lib/x86_64-linux-gnu
  # dpkg -x makes no update-alternatives links: name the real files
  mkdir -p $Z/bin
  ln -sf $Z/usr/bin/orterun $Z/bin/mpirun
  ln -sf $Z/usr/lib/libpsm1/libpsm_infinipath.so.1.16 $L/libpsm_infinipath.so.1
  export PATH=$Z/bin:$Z/usr/bin:$PATH
  # (libnl-3-200 installs into /lib, the others into /usr/lib)
  export LD_LIBRARY_PATH=$L:$Z/lib/x86_64-linux-gnu:$L/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # Lua modules (cjson.so) from the kit first, then the defaults (;;)
  export LUA_CPATH="$L/lua/5.1/?.so;;"
  export LUA_PATH="$Z/usr/share/lua/5.1/?.lua;$Z/usr/share/lua/5.1/?/init.lua;;"
  # Open MPI and PMIx find their plugins and help files under the prefix
  export OPAL_PREFIX=$Z/usr PMIX_PREFIX=$L/pmix2
  export PMIX_MCA_mca_base_component_path=$L/pmix2/lib/pmix
  export OMPI_MCA_mca_base_component_path=$L/openmpi/lib/openmpi3
  # No plugin noise. Every plugin's libraries are carried (check shows any
  # that fails to load), but on the GPU machine PMIx's zlib plugin printed
  # "pmix_mca_pcompress_zlib.so: undefined symbol" in every process: a
  # plugin that cannot be opened is skipped without a line (Open MPI's
  # switch; it hands it to PMIx), and PMIx without compression does not
  # warn that it has none.
  export OMPI_MCA_mca_base_component_show_load_errors=0
  export PMIX_MCA_pcompress_base_silence_warning=1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
}

check() {
  echo "ldd: every carried binary's libraries"
  missing=$(for b in $BIN_PATHS; do ldd "$b" | sed -n "s|^[[:space:]]*\([^ ]*\) => not found.*|$b: \1|p"; done)
  [ -z "$missing" ] || { echo "not found:"; echo "$missing"; return 1; }
  echo "ok; from the kit: $(ldd $BIN_PATHS | grep -o "$Z/[^ ]*" | sed 's|.*/||' | sort -u | tr '\n' ' ')"
  export ZTRAIN_LIB="$(pwd)/build-cuda/libztrain.so"
  run_dir=/tmp/zkit-check.$$
  trap 'rm -rf "$run_dir"' EXIT; trap 'exit 143' TERM
  rm -rf "$run_dir"; mkdir -p "$run_dir"
  # with plugin load failures shown (the other parts hide them): none may
  # fail here but PMIx's zlib plugin, the GPU machine's known case
  OMPI_MCA_mca_base_component_show_load_errors=1 build-cuda/ztrain --nproc 2 recipes/dp.lua \
    device.backend=cpu model.size=gpt2-tiny data.seq_len=32 batch.micro=2 train.steps=2 train.eval_every=0 \
    data.tokenizer=bytes "data.text=$(pwd)/docs/*.md" out=$run_dir/run > $run_dir/log 2>&1 || rc=$?
  cat $run_dir/log
  [ "${rc:-0}" = 0 ] || return 1
  if grep -i "unable to open\|dlopen\|cannot open shared" $run_dir/log | grep -v pcompress_zlib; then
    echo "check: a plugin failed to load (above): its library is not in the kit"; return 1
  fi
  build-cuda/ztrain --script tools/bench_gpu.lua backend=cpu \
    model=gpt2-tiny B=2 T=64 precision=fp32 steps=1 profile=1 peak_tflops=0
}

bench() {
  rc=0
  # a failed kernel bench leaves the step's bench to run (the part fails)
  build-cuda/bench_cuda || rc=1
  # the attention backward with dQ by atomics: the price of determinism
  build-cuda/bench_cuda_dqatomic || rc=1
  for m in ${ZKIT_ATTENTION:-exact bf16}; do
    echo "== bench_gpu attention=$m"
    t0=$(date +%s)
    build-cuda/ztrain --script tools/bench_gpu.lua attention=$m || rc=1
    echo "== bench_gpu attention=$m: $(($(date +%s) - t0)) s"
  done
  # the step with the tensor-core backward's dQ in its dK/dV kernel and
  # the forward's pair blocks (the profile times each apart)
  case " ${ZKIT_ATTENTION:-exact bf16} " in *" bf16 "*)
    echo "== bench_gpu attention=bf16 ZTRAIN_ATTN_DQ=ordered ZTRAIN_ATTN_FWD=pair"
    ZTRAIN_ATTN_DQ=ordered ZTRAIN_ATTN_FWD=pair build-cuda/ztrain --script tools/bench_gpu.lua attention=bf16 || rc=1 ;;
  esac
  return $rc
}

torch() { # PyTorch's step (eager, torch.compile), then its flash attention alone
  rc=0
  PYTHONUNBUFFERED=1 python3 tools/torch_gpt2_bench.py || rc=1
  PYTHONUNBUFFERED=1 python3 tools/torch_attention_bench.py || rc=1
  return $rc
}

run() {
  unpack
  LOGS=${OUT:-build-cuda/kit}
  mkdir -p "$LOGS"
  failed=""
  start=$(date +%s)
  { echo "gpu_kit run $*: $(date -u '+%Y-%m-%d %H:%M UTC'), binaries built from $(cat $KIT/debs/BUILT_FROM 2>/dev/null || echo '(unknown: pack again)')"
    command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "no nvidia-smi here"; } 2>&1 | tee "$LOGS/kit.log"
  for what in "$@"; do
    case $what in
      check) part check check ;;
      test)  part test sh tools/test_cuda.sh build-cuda ;;
      bench) part bench bench ;;
      torch) part torch torch ;;
    esac
  done
  total=$(($(date +%s) - start))
  if [ -n "$failed" ]; then msg="gpu_kit: FAILED:$failed ($total s)"; else msg="gpu_kit: all passed ($*; $total s)"; fi
  echo "$msg" | tee -a "$LOGS/kit.log"
  [ -z "$failed" ]
}

part() { # part NAME command...: run it under NAME's time limit, output also to $LOGS/NAME.log; note a failure, go on
  name=$1; shift
  limit=$(echo $LIMITS | tr ' ' '\n' | sed -n "s/^$name=//p" | head -1)
  echo "== gpu_kit $name (at most $limit s)"
  t0=$(date +%s)
  rcf=$(mktemp)
  # the shell functions (check, bench) run in a child sh so that timeout can
  # end them; no input (timeout's own process group may not read a terminal)
  { rc=0; timeout -k 10 "$limit" sh "$SELF" --in "$@" </dev/null 2>&1 || rc=$?; echo $rc > "$rcf"; } |
    tee "$LOGS/$name.log"
  rc=$(cat "$rcf"); rm -f "$rcf"
  secs=$(($(date +%s) - t0))
  if [ "$rc" = 0 ]; then line="$name: passed in $secs s"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then line="$name: FAILED: out of time ($limit s)"; failed="$failed $name"
  else line="$name: FAILED (exit $rc) in $secs s"; failed="$failed $name"; fi
  echo "== gpu_kit $line" | tee -a "$LOGS/kit.log"
}

usage() { echo "usage: sh tools/gpu_kit.sh pack | run [all | check test bench torch...]" >&2; exit 2; }
case ${1:-} in
  pack) pack ;;
  run) shift
       [ $# -gt 0 ] || set -- all
       parts=""
       for w in "$@"; do
         case $w in
           all) parts="$parts check test bench torch" ;;
           check|test|bench|torch) parts="$parts $w" ;;
           *) echo "gpu_kit: run takes all, check, test, bench or torch, not '$w'" >&2; usage ;;
         esac
       done
       run $parts ;;
  --in) # a part's child (part() above; the kit's environment is inherited)
       shift
       case $1 in check|bench|torch) "$1" ;; *) exec "$@" ;; esac ;;
  *) usage ;;
esac
