#!/usr/bin/env python3
"""Throughput of a kernel object's innermost FMA loops as llvm-mca models them, per processor.

For the attention kernels' AVX2 build on processors this project has no machine of (Zen 2): every
conditional backward branch of the object's disassembly that closes a loop of at most 120 instructions
with 12 or more FMAs is one loop body; llvm-mca runs it (--iterations) for each --mcpu and prints its cycles per
iteration against the FMA bound (two FMA pipes: FMAs / 2).  A model's prediction, not a measurement:
it leaves out caches, the loop's trip count and what runs between loops.

  .venv/bin/python bench/mca_loops.py build/CMakeFiles/olmo.dir/src/backend/cpu/cpu_attention_avx2.c.o
"""
import argparse
import re
import shutil
import subprocess
import sys
import tempfile

INSN = re.compile(r"\s*([0-9a-f]+):\t(.*)")
BRANCH = re.compile(r"(j(?!mp)[a-z]+)\s+([0-9a-f]+)")  # conditional: a jmp back is the compiler's layout


def loops(disassembly, min_fma, max_len):
    """(address of the closing branch, function, [instructions]) of each loop body."""
    lines = disassembly.splitlines()
    at, func, owner = {}, None, {}
    for i, line in enumerate(lines):
        m = re.match(r"[0-9a-f]+ <(.*)>:", line)
        if m:
            func = m.group(1)
        m = INSN.match(line)
        if m:
            at[int(m.group(1), 16)] = i
            owner[i] = func
    found = []
    for i, line in enumerate(lines):
        m = INSN.match(line)
        b = BRANCH.match(m.group(2)) if m else None
        if not b or int(b.group(2), 16) >= int(m.group(1), 16) or int(b.group(2), 16) not in at:
            continue
        body = [INSN.match(x).group(2) for x in lines[at[int(b.group(2), 16)]:i + 1] if INSN.match(x)]
        body = [re.sub(r"\s+<.*>", "", x).strip() for x in body]
        if len(body) <= max_len and sum("vfmadd" in x for x in body) >= min_fma:
            found.append((int(m.group(1), 16), owner[i], body))
    return found


def mca_cycles(body, mcpu, iterations):
    """llvm-mca's cycles per iteration of the loop body (its closing branch aimed at its first line)."""
    text = "L:\n" + "\n".join(re.sub(r"^(j[a-z]+)\s+\S+", r"\1 L", x) for x in body) + "\n"
    with tempfile.NamedTemporaryFile("w", suffix=".s") as f:
        f.write(text)
        f.flush()
        out = subprocess.run(["llvm-mca", f"-mcpu={mcpu}", f"-iterations={iterations}", f.name],
                             capture_output=True, text=True)
    m = re.search(r"Total Cycles:\s+(\d+)", out.stdout)
    if not m:
        raise RuntimeError(f"llvm-mca -mcpu={mcpu}: {out.stderr.strip() or 'no cycle count'}")
    return int(m.group(1)) / iterations


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("object", help="an object file (e.g. the AVX2 attention kernels' .o)")
    ap.add_argument("--mcpu", default="znver2,icelake-server",
                    help="llvm-mca processor models, comma-separated (default: znver2,icelake-server)")
    ap.add_argument("--min-fma", type=int, default=12, help="FMAs a loop body needs to be listed (default 12)")
    ap.add_argument("--iterations", type=int, default=300, help="llvm-mca's iterations (default 300)")
    args = ap.parse_args()
    for tool in ("objdump", "llvm-mca"):
        if not shutil.which(tool):
            sys.exit(f"mca_loops: {tool} not found (binutils, llvm)")
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", args.object], capture_output=True, text=True)
    if dis.returncode != 0:
        sys.exit(f"mca_loops: objdump {args.object}: {dis.stderr.strip()}")
    found = loops(dis.stdout, args.min_fma, 120)
    if not found:
        sys.exit(f"mca_loops: no loop with {args.min_fma} or more FMAs in {args.object}")
    cpus = args.mcpu.split(",")
    print(f"# {args.object}: {len(found)} loops; cycles per iteration by llvm-mca model; bound = FMAs / 2 "
          "(two FMA pipes)")
    print(f"{'branch':>8} {'function':32} {'insns':>5} {'FMAs':>4} {'int':>3} {'bound':>5} " +
          " ".join(f"{c:>14}" for c in cpus))
    for addr, func, body in found:
        fma = sum("vfmadd" in x for x in body)
        ints = sum(not x.startswith(("v", "prefetch", "nop", "xchg", "cs ")) for x in body)
        cyc = [mca_cycles(body, c, args.iterations) for c in cpus]
        print(f"{addr:8x} {func[:32]:32} {len(body):5d} {fma:4d} {ints:3d} {fma / 2:5.1f} " +
              " ".join(f"{c:8.2f} ({fma / 2 / c:3.0%})" for c in cyc))


if __name__ == "__main__":
    main()
