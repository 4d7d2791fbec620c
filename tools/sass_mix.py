#!/usr/bin/env python3
"""sass_mix.py -- what a CUDA kernel's machine code does per mma, without a GPU.

Reads `cuobjdump -sass` of an object (or a saved dump) and prints, per
kernel, its instruction counts and, for its innermost loops that hold
tensor-core instructions (HMMA), the loop's mix: instructions per HMMA,
ldmatrix (LDSM) per HMMA, barriers, local-memory traffic (LDL/STL: spills),
WARPSYNC (an mma under a branch the compiler cannot prove warp-uniform).
These are static counts of the code, not of its execution: a rolled inner
loop counts once. The attention kernels' ldmatrix-per-mma figures in
docs/gpu.md come from here.

  python3 tools/sass_mix.py build-cuda/obj/kernels/cuda/attention_tc_fwd.o [--arch sm_90] [REGEX]
  python3 tools/sass_mix.py dump.sass [REGEX]

cuobjdump is not in every CUDA toolkit install (not in this machine's
/usr/local/cuda): `pip download --no-deps nvidia-cuda-cuobjdump` and unzip
the wheel (nvidia/cu13/bin/cuobjdump), then CUOBJDUMP=that path or put it
on PATH.
"""
import collections
import os
import re
import shutil
import subprocess
import sys


def sass_text(path, arch):
    if path.endswith(".o") or path.endswith(".so") or path.endswith(".cubin"):
        tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
        if not tool:
            sys.exit("sass_mix: no cuobjdump (set CUOBJDUMP; see --help)")
        r = subprocess.run([tool, "-sass", "-arch", arch, path], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("sass_mix: cuobjdump failed: " + r.stderr.strip())
        return r.stdout
    with open(path) as f:
        return f.read()


INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
KEYS = ("HMMA", "LDSM", "LDS", "STS", "LDG", "LDGSTS", "STG", "MUFU", "BAR", "WARPSYNC", "LDL", "STL")


def kernels(text):
    for part in re.split(r"\n\s*Function : ", text)[1:]:
        name = part.split("\n", 1)[0].strip()
        ins = [(int(a, 16), op.split(".")[0], args) for a, _, op, args in INS.findall(part)]
        yield name, ins


def loops(ins):
    """(lo, hi) of each backward branch, innermost (shortest) first"""
    out = set()
    for a, op, args in ins:
        if op == "BRA":
            m = re.search(r"0x([0-9a-f]+)", args)
            if m and int(m.group(1), 16) < a:
                out.add((int(m.group(1), 16), a))
    return sorted(out, key=lambda r: r[1] - r[0])


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    path, arch, pat = argv[1], "sm_90", None
    rest = argv[2:]
    while rest:
        a = rest.pop(0)
        if a == "--arch":
            arch = rest.pop(0)
        else:
            pat = a
    for name, ins in kernels(sass_text(path, arch)):
        if pat and not re.search(pat, name):
            continue
        c = collections.Counter(op for _, op, _ in ins)
        print("%s: %d instructions, %s" % (name, len(ins), ", ".join("%s %d" % (k, c[k]) for k in KEYS)))
        ls = [r for r in loops(ins)]
        for lo, hi in sorted(ls):
            body = collections.Counter(op for a, op, _ in ins if lo <= a <= hi)
            if body["HMMA"] == 0:
                continue
            inner = any(lo <= a and b <= hi and (a, b) != (lo, hi) for a, b in ls)
            n = sum(body.values())
            print("  loop %x-%x: %d instructions, HMMA %d (%.2f a HMMA), LDSM %.2f a HMMA, BAR %d, "
                  "WARPSYNC %d, LDL/STL %d%s" % (lo, hi, n, body["HMMA"], n / body["HMMA"],
                                                 body["LDSM"] / body["HMMA"], body["BAR"],
                                                 body["WARPSYNC"], body["LDL"] + body["STL"],
                                                 " (holds a loop, counted once)" if inner else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
