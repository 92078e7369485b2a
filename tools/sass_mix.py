"""The instruction mix of a kernel's main loop, read off its SASS: what the MMA warps issue per weight.

    python tools/sass_mix.py [--schedule ID ...] [--profile h200] [--json FILE]

Builds (or finds in the kernel cache) each schedule's kernel, disassembles it with
`cuobjdump --dump-sass`, finds the main K loop (the backward branch whose body holds the most
MMA instructions, HMMA or HGMMA), and counts its instructions by class. Per K block of the
loop, every warp that computes dequantizes and multiplies (block_n / warps) x 64 weights; the
table gives each class per 256 of them (one 16 x 16 weight tile: one mma.m16n8k16 A fragment, or
a warp's share of one wgmma k16 step), so loops of any tile compare directly. Without --schedule
it reads every schedule of the profile. Needs nvcc and cuobjdump, no GPU.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

if __name__ == "__main__":  # run as a script: this checkout's chord, not an installed copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_:]+)*)\s*([^;]*);")

# instruction classes, by opcode (the part before the first dot)
CLASSES = {
    "mma": {"HMMA", "HGMMA"},
    "dequant": {"LOP3", "SHF", "PRMT", "HADD2", "HMUL2", "HFMA2", "F2FP", "I2F", "I2FP"},
    "fp32": {"FFMA", "FMUL", "FADD", "FSEL", "FMNMX"},
    "smem load": {"LDS", "LDSM"},
    "copy": {"LDGSTS", "LDG", "UBLKCP", "UTMALDG", "UBLKPF", "LDGDEPBAR"},
    "sync": {"BAR", "DEPBAR", "SYNCS", "WARPGROUP", "WARPSYNC", "ARRIVES", "MEMBAR", "FENCE", "ERRBAR", "CCTL"},
    "branch": {"BRA", "BSSY", "BSYNC", "EXIT", "CALL", "RET", "YIELD", "NOP", "BPT"},
    "int / address": {"IMAD", "IADD3", "IADD", "LEA", "ISETP", "SEL", "MOV", "IABS", "IMNMX", "VIADD", "VIMNMX",
                      "R2UR", "S2R", "S2UR", "CS2R", "ULDC", "UMOV", "UIADD3", "UIMAD", "ULEA", "USHF", "ULOP3",
                      "UISETP", "USEL", "PLOP3", "P2R", "R2P", "LDC", "POPC", "FLO", "BREV", "UPRMT", "USETMAXREG",
                      "ULEPC", "VOTEU", "VOTE", "SHFL", "IMUL", "UFLO", "UPOPC"},
}
_CLASS_OF = {op: c for c, ops in CLASSES.items() for op in ops}


class Loop:
    """A backward branch's body: its head (the branch target), the branch's address and the
    opcodes (with modifiers) it holds, counted."""

    def __init__(self, start: int, end: int, ops: Counter):
        self.start, self.end, self.ops = start, end, ops

    def by_class(self) -> Counter:
        out = Counter()
        for op, n in self.ops.items():
            out[_CLASS_OF.get(op.split(".")[0], "other")] += n
        return out

    @property
    def mma(self) -> int:
        return sum(n for op, n in self.ops.items() if op.split(".")[0] in CLASSES["mma"])


def parse(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode with modifiers, operands) of every instruction of a cuobjdump listing."""
    out = []
    for ln in sass.splitlines():
        m = _LINE.match(ln)
        if m:
            out.append((int(m.group(1), 16), m.group(2) + m.group(3), m.group(4).strip()))
    return out


def main_loop(instructions: list[tuple[int, str, str]]) -> Loop | None:
    """The main K loop: of the innermost loops that hold MMA instructions (backward branches whose
    body holds no other such loop; an outer one also spans prologues and epilogues), the one with
    the most of them (ties: the shorter); None when no loop holds one."""
    loops = []
    for addr, op, args in instructions:
        m = re.search(r"(0x[0-9a-f]+)", args) if op.startswith("BRA") else None
        if m and int(m.group(1), 16) < addr:
            target = int(m.group(1), 16)
            loops.append(Loop(target, addr, Counter(o for a, o, _ in instructions if target <= a <= addr)))
    with_mma = [lp for lp in loops if lp.mma]
    inner = [lp for lp in with_mma
             if not any(o is not lp and lp.start <= o.start and o.end <= lp.end for o in with_mma)]
    return max(inner, key=lambda lp: (lp.mma, lp.start - lp.end), default=None)


def mma_per_k_block(s) -> int:
    """MMA instructions one computing warp issues per K block of 64 in its main loop."""
    tiles = s.block_n // s.warps // 16  # the warp's 16-row weight tiles
    if s.mainloop == "wgmma":
        return tiles * 4  # one wgmma per weight tile and k16 step
    token_tiles = s.block_m // 8 if s.swap else s.block_m // 16
    per = tiles * 4 * token_tiles if s.swap else (s.block_m // 16) * (s.block_n // s.warps // 8) * 4
    if s.fold:
        per += 4 * token_tiles  # the bias MMAs: -136 times each k16 step's activations, per token tile
    return per


def mix(schedule) -> dict:
    """The main loop's instruction classes per 256 weights of one computing warp."""
    from chord import jit

    res = jit.build_schedule(schedule, 8)
    proc = jit.run_cuobjdump(res.cubin)
    if proc is None or proc.returncode != 0:
        raise SystemExit(f"sass_mix: cuobjdump failed on {res.cubin}")
    loop = main_loop(parse(proc.stdout))
    if loop is None:
        raise SystemExit(f"sass_mix: {schedule.id}: no loop with an MMA instruction")
    k_blocks = loop.mma / mma_per_k_block(schedule)
    weights = k_blocks * (schedule.block_n // schedule.warps) * 64
    per = {c: round(n * 256 / weights, 2) for c, n in sorted(loop.by_class().items())}
    return {"schedule": schedule.id, "loop_instructions": sum(loop.ops.values()), "k_blocks_per_iteration": k_blocks,
            "registers": res.registers, "per_256_weights": per,
            "total_per_256_weights": round(sum(loop.ops.values()) * 256 / weights, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", action="append", default=[], help="a schedule id (repeatable)")
    ap.add_argument("--profile", default="h200", help="without --schedule: every schedule of this profile")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    a = ap.parse_args(argv)
    from chord.schedule import Schedule, load_profile_file

    todo = ([Schedule.from_id(i) for i in a.schedule] if a.schedule
            else sorted(load_profile_file(a.profile).all_schedules(), key=lambda s: s.id))
    rows = [mix(s) for s in todo]
    classes = ["mma", "dequant", "fp32", "smem load", "copy", "sync", "int / address", "branch", "other"]
    print("| schedule | K blocks / iteration | " + " | ".join(classes) + " | total |")
    print("|---|---|" + "---|" * (len(classes) + 1))
    for r in rows:
        cells = [f"{r['per_256_weights'].get(c, 0):g}" for c in classes]
        print(f"| {r['schedule']} | {r['k_blocks_per_iteration']:g} | " + " | ".join(cells)
              + f" | {r['total_per_256_weights']:g} |")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
