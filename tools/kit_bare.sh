#!/bin/sh
# tools/kit_bare.sh CMD... -- runs CMD as on a bare GPU machine: in a new
# mount namespace (unshare -m; root) where the system's Lua modules, and
# every library and program a kit run would load from the system beyond a
# base image, are hidden. spec/e2e/gpu_kit_spec.lua runs
# `sh tools/gpu_kit.sh run check` under it, so a package missing from the
# kit fails here, not on the GPU machine.
#
# Hidden (nothing outside the namespace changes):
#   folders, by an empty tmpfs: the Lua module trees (/usr/share/lua,
#     /usr/lib/x86_64-linux-gnu/lua, /usr/local/..., LuaJIT's jit.*), and the
#     plugin, data and configuration folders of Open MPI, PMIx, OpenBLAS,
#     hwloc, libfabric, UCX and libibverbs;
#   libraries, by an empty unreadable file bound over the real file: the
#     closure, by ldd on this machine, of build-cuda's binaries, the Lua C
#     modules and every plugin in those folders -- each library it reaches
#     but BASE's (glibc, libgcc_s, libstdc++, zlib, and what dpkg itself
#     needs: every base image has them) and CUDA's;
#   programs: mpirun (orterun), orted, luajit.
# Exit status: CMD's; 77 when a mount namespace cannot be made here.
set -e
cd "$(dirname "$0")/.."
if [ "${KIT_BARE_INNER:-}" != 1 ]; then
  [ $# -gt 0 ] || { echo "usage: sh tools/kit_bare.sh CMD..." >&2; exit 2; }
  unshare -m true 2>/dev/null || { echo "kit_bare: cannot make a mount namespace here (unshare -m needs root)" >&2; exit 77; }
  exec env KIT_BARE_INNER=1 unshare -m --propagation private sh "$0" "$@"
fi
L=/usr/lib/x86_64-linux-gnu
BASE="libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libutil.so.1 libresolv.so.2
ld-linux-x86-64.so.2 libgcc_s.so.1 libstdc++.so.6 libz.so.1 liblzma.so.5 libmd.so.0 libbsd.so.0 libuuid.so.1"
DIRS="/usr/share/lua /usr/local/share/lua /usr/local/lib/lua /usr/lib/lua $L/lua $(ls -d /usr/share/luajit* 2>/dev/null)
$L/openmpi $L/pmix2 $L/openblas-pthread $L/blas $L/lapack $L/hwloc $L/libfabric $L/ucx $L/libibverbs
/usr/lib/libpsm1 /usr/share/openmpi /usr/share/pmix /usr/share/hwloc /etc/openmpi /etc/libibverbs.d"
dirs=""
for d in $DIRS; do [ -d "$d" ] && dirs="$dirs $d"; done
objs=$(for b in libztrain.so ztrain test_cuda test_cuda_seams test_cuda_nccl bench_cuda bench_cuda_dqatomic; do
         [ -f build-cuda/$b ] && echo build-cuda/$b; done
       find $dirs -name '*.so*' -type f 2>/dev/null)
progs=""
for p in mpirun mpiexec orterun orted luajit; do
  f=$(command -v $p 2>/dev/null) && progs="$progs $(readlink -f "$f")"
done
# the closure: "soname => path" of every object and program, resolved here
libs=$(for o in $objs $progs; do ldd "$o" 2>/dev/null || true; done |
       awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
       while read -r name path; do
         case " $(echo $BASE) " in *" $name "*) continue ;; esac
         case $path in /usr/local/cuda*) continue ;; esac
         readlink -f "$path"
       done | sort -u)
hide=$(mktemp -d /tmp/kit_bare.XXXXXX)
: > "$hide/nothing"; chmod 000 "$hide/nothing"
for d in $dirs; do mount -t tmpfs -o size=1m,mode=755 kit_bare "$d"; done
nl=0
for f in $libs $progs; do
  [ -e "$f" ] || continue
  mount --bind "$hide/nothing" "$f"; nl=$((nl + 1))
done
echo "kit_bare: hid $(echo $dirs | wc -w) folders (Lua modules, MPI/PMIx/OpenBLAS/hwloc/fabric plugins)" \
     "and $nl libraries and programs: $(for f in $libs $progs; do basename "$f"; done | sed 's/\.so.*//' | sort -u | tr '\n' ' ')"
unset KIT_BARE_INNER
exec "$@"
