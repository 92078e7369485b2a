"""Host time of one Chord GEMM call (CPU side, warm caches): issue 6 item 4.

    python tools/host_time.py [--scenario tp8-m1] [--calls 2000]

Times `chord.ops.gemm_indexed` as the bench and serving call it (routing trusted) and with the
default routing check (one device->host read per call), each call alone with
time.perf_counter around it: the launch is asynchronous, so this is the host's share. The GPU
is kept ahead of the host by enqueuing a long sleep kernel first, so no call waits for a full
launch queue (not for the checked call: its read waits for the GPU, which is its real cost).
Prints median and p90 in microseconds.
"""
import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="tp8-m1")
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()

    import torch

    from chord.bench import inputs as I
    from chord.bench.runner import ChordAPI, _chord_calls
    from chord.bench.suite import load_suite
    from chord import ops
    from chord.schedule import Schedule

    dev = torch.device("cuda")
    sc = load_suite().scenario(a.scenario)
    w = I.expert_weights(sc, 0, dev)
    w13, w2 = ChordAPI.pack(w.q13, w.s13), ChordAPI.pack(w.q2, w.s2)
    data = I.scenario_data(sc, 0, dev)
    fi = I.family_inputs("indexed", data)
    prof = ChordAPI.profile("h200", sc.profile_deployment)
    gate_up, _down, gu, _dn, info = _chord_calls("indexed", sc, data, fi, w13, w2, prof)
    s1 = Schedule.from_id(info["schedule_gate_up"])  # the decision _chord_calls made, not a second one
    r1 = ChordAPI.align(data.topk_ids, s1.block_m, sc.experts)

    def checked():
        ops.gemm_indexed(fi.gate_up_in, w13, r1, top_k=sc.top_k, out=gu, schedule=s1)

    def raw():
        ops.gemm_indexed_raw(fi.gate_up_in, w13.qweight, w13.scales, r1.sorted_ids, r1.expert_ids,
                             r1.num_tokens_post_padded, gu, sc.top_k, s1.block_m, s1.id, check_routing=False)

    # the checked call reads device values, so it waits for the GPU anyway: no sleep ahead of it
    for name, fn, ahead in (("chord.ops.gemm_indexed (trusted, as bench/serving)", gate_up, True),
                            ("chord.ops.gemm_indexed_raw (trusted)", raw, True),
                            ("chord.ops.gemm_indexed (default: routing checked)", checked, False)):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        ts = []
        for i in range(a.calls):
            if ahead and i % 200 == 0:
                torch.cuda.synchronize()
                torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time ahead of the host
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        ts.sort()
        print(f"{sc.id} {info['schedule_gate_up']:30s} {name:52s} host median {statistics.median(ts):6.1f} us"
              f"  p90 {ts[int(0.9 * len(ts))]:6.1f} us", flush=True)


if __name__ == "__main__":
    main()
