#!/bin/sh
# deps.sh -- install ztrain's system packages from Debian, only if missing.
# Idempotent and quiet when everything is present; needs root (or sudo) to install.
set -e
PKGS="build-essential pkg-config luajit libluajit-5.1-dev libuv1-dev libopenblas-dev \
libopenmpi-dev openmpi-bin lua-busted lua-cjson fortunes fio libpcre2-8-0 libunistring2 libreadline8 tmux \
slurm-wlm liburing-dev"
# slurm-wlm (slurmctld, slurmd, srun; ~12 MiB installed, 7 packages with munge and
# the plugins): spec/e2e/slurm_spec.lua runs a one-node Slurm here. Its services are
# not started by us; the spec starts its own daemons with a private config.
# libunistring2 (1.0 on Debian 12; usually present already): NFC for tokenizer.json
# normalizers (Qwen 2.5), lua/ztrain/model/data/unorm.lua.
# liburing-dev (2.3 on Debian 12): the aio engine's io_uring backend
# (runtime/aio_uring.c); the Makefile builds without it (the thread pool only).
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "deps: installing$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
