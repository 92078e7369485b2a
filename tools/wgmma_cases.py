"""Runs single wgmma GEMM cases, each in its own subprocess (a device fault kills only that case),
and prints one line per case: schedule, K, status, relative error vs the float32 reference.

    python tools/wgmma_cases.py idx-m8n64k64-w4-s4-c1-wgmma:704 idx-m128n128k64-w8-s4-c1-wgmma:2048
"""
import subprocess
import sys


def one(sid: str, k: int) -> None:
    import torch

    from chord import ops, reference, routing
    from chord.schedule import Schedule
    from chord.testing import poisoned, random_experts, rel_err

    s = Schedule.from_id(sid)
    e, n, m, top_k = 12, 512, 157, 4
    qe, pw = random_experts(e, n, k)
    r = routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=1, device="cuda"), s.block_m, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = poisoned(m * top_k, n)
    ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
    torch.cuda.synchronize()
    print(f"{sid:40s} K={k:5d} ok  rel_err={rel_err(out, reference.indexed_gemm_ref(x, qe, None, r, top_k)):.2e}")


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        one(sys.argv[2], int(sys.argv[3]))
    else:
        for case in sys.argv[1:]:
            sid, k = case.split(":")
            p = subprocess.run([sys.executable, __file__, "--one", sid, k], capture_output=True, text=True)
            if p.returncode:
                err = [l for l in (p.stdout + p.stderr).splitlines() if "Error" in l or "error" in l]
                print(f"{sid:40s} K={int(k):5d} FAIL {err[-1][:120] if err else p.returncode}")
            else:
                print(p.stdout.strip())
