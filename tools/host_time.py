"""Host time of one GEMM call (CPU side, warm caches): issue 6 item 4, Chord and upstream Humming.

    python tools/host_time.py [--scenario tp8-m1] [--calls 2000] [--humming-dir /tmp/humming]
                              [--profile NAME] [--cprofile] [--parts]

Each call alone with time.perf_counter around it (chord.bench.timing.host_time: the launch is
asynchronous, so this is the host's share; the GPU is kept ahead with a sleep kernel so no call
waits for a full launch queue). Measured, for the scenario's gate_up and down GEMMs:

* Chord's `humming_forward` (Chord's `humming` root), with the layer built by vLLM 0.33's
  load-time calls (chord.bench.humming_baseline.build_layer): what a vLLM server runs;
* `chord.ops.gemm_indexed` (routing trusted, as the bench calls it), `gemm_indexed_raw`, and
  `gemm_indexed` with the default routing check (its device->host read waits for the GPU, so its
  time includes the kernel: no sleep ahead of it);
* the driver's launch alone (`chord.jit.Kernel.launch` with a packed parameter block) and a torch
  elementwise kernel launch, the floor any per-call launch path pays on this host;
* where the C launch path is on (`chord.launch.status()`), the humming_forward and trusted
  chord.ops calls again with it off (`chord.launch.fast_launch(False)`): its ablation;
* with --humming-dir: upstream Humming 0.1.20's `humming_forward` in a worker process
  (`python -m chord.bench.humming_baseline --host-time`), same scenario, seed and calls.

Prints median and p90 in microseconds. --profile: the Chord profile file (profiles/<name>.json),
by default the library's own ($CHORD_PROFILE, else h200: chord.schedule.gpu_profile_name); it
is set as CHORD_PROFILE for the run (chord._env.override) so Chord's humming root decides with the same file. --cprofile:
the trusted call under cProfile. --parts: the pieces of the Python side of one raw call, each
timed alone (the validation memo key, the schedule id, the split-K buffer lookup, parameter
packing, the raw stream).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    """The command line; `profile` resolved to the library's default profile when not given."""
    from chord import _env

    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="tp8-m1")
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per measurement (>= 1)")
    ap.add_argument("--humming-dir", default=_env.get("CHORD_HUMMING_DIR"))
    ap.add_argument("--profile", default=None,
                    help="Chord profile file (profiles/<name>.json; default $CHORD_PROFILE or h200)")
    ap.add_argument("--cprofile", action="store_true", help="cProfile the trusted chord.ops call")
    ap.add_argument("--parts", action="store_true", help="time the pieces of a raw call's Python side")
    a = ap.parse_args(argv)
    if a.calls < 1:
        ap.error("--calls must be >= 1")
    from chord.schedule import gpu_profile_name, load_profile_file

    if a.profile is None:
        a.profile = gpu_profile_name()
    try:
        load_profile_file(a.profile)  # a bad name or file is a usage error, before any GPU work
    except ValueError as exc:
        ap.error(f"--profile: {exc}")
    return a


def main() -> None:
    a = parse_args()
    from chord import _env

    with _env.override(CHORD_PROFILE=a.profile):  # Chord's humming root (profile_for) reads it
        _measure(a)


def _measure(a: argparse.Namespace) -> None:
    import torch

    from chord import jit, ops
    from chord.bench import humming_baseline as HB
    from chord.bench import inputs as I
    from chord.bench.runner import ChordAPI, _chord_calls, humming_env
    from chord.bench.suite import load_suite
    from chord.bench.timing import host_time
    from chord.schedule import Schedule

    dev = torch.device("cuda")
    sc = load_suite().scenario(a.scenario)
    w = I.expert_weights(sc, 0, dev)
    w13, w2 = ChordAPI.pack(w.q13, w.s13), ChordAPI.pack(w.q2, w.s2)
    data = I.scenario_data(sc, 0, dev)
    fi = I.family_inputs("indexed", data)
    prof = ChordAPI.profile(a.profile, sc)
    gate_up, down, gu, _dn, info = _chord_calls("indexed", sc, data, fi, w13, w2, prof)
    s1 = Schedule.from_id(info["schedule_gate_up"])  # the decision _chord_calls made, not a second one
    r1 = ChordAPI.align(data.topk_ids, s1.block_m, sc.experts)

    def checked():
        ops.gemm_indexed(fi.gate_up_in, w13, r1, top_k=sc.top_k, out=gu, schedule=s1)

    def raw():
        ops.gemm_indexed_raw(fi.gate_up_in, w13.qweight, w13.scales, r1.sorted_ids, r1.expert_ids,
                             r1.num_tokens_post_padded, gu, sc.top_k, s1.block_m, s1.id, check_routing=False)

    kernel = jit.kernel_for_schedule(s1)
    grid = (r1.sorted_ids.numel() // s1.block_m, s1.grid_n(sc.n_gate_up), s1.split_k)
    params = jit.pack_gemm_params(
        x=fi.gate_up_in.data_ptr(), qweight=w13.qweight.data_ptr(), scales=w13.scales.data_ptr(), out=gu.data_ptr(),
        sorted_ids=r1.sorted_ids.data_ptr(), expert_ids=r1.expert_ids.data_ptr(),
        num_tokens_post_padded=r1.num_tokens_post_padded.data_ptr(), n=sc.n_gate_up, k=sc.k_gate_up,
        num_experts=sc.experts, top_k=sc.top_k, num_valid_ids=sc.rows * sc.top_k, num_blocks=grid[0],
        **ops._split_args(s1, fi.gate_up_in, grid[0], grid[1]))
    stream = ops._raw_stream(dev.index or 0)
    scratch = torch.empty(64, device=dev)

    # Chord's humming root, the layer built as vLLM builds it (one process: `humming` is Chord's)
    import humming

    import chord

    if not Path(humming.__file__).resolve().is_relative_to(Path(chord.__file__).resolve().parents[1]):
        raise SystemExit(f"tools/host_time.py must import Chord's humming root, got {humming.__file__}")
    l13 = HB.build_layer("w13", w.q13, w.s13, gated=True, families=["indexed"], device=dev)
    l2 = HB.build_layer("w2", w.q2, w.s2, gated=False, families=["indexed"], device=dev)
    locks = torch.zeros(8 * torch.cuda.get_device_properties(dev).multi_processor_count, dtype=torch.int32, device=dev)
    hf_gate_up, hf_down, *_ = HB.prepare_calls("indexed", sc, data, fi, l13, l2, locks, "all")

    from chord import launch

    rows = []
    fast = launch.status()
    for name, fn in ((f"Chord humming_forward gate_up (vLLM path; C launch path {fast})", hf_gate_up),
                     ("Chord humming_forward down (vLLM path)", hf_down),
                     ("chord.ops.gemm_indexed gate_up (trusted, as the bench)", gate_up),
                     ("chord.ops.gemm_indexed down (trusted)", down),
                     ("chord.ops.gemm_indexed_raw gate_up (trusted)", raw),
                     ("driver launch alone (jit.Kernel.launch)", lambda: kernel.launch(grid, (s1.threads, 1, 1), params,
                                                                                        dev.index or 0, stream)),
                     ("torch elementwise launch (scratch.add_(1))", lambda: scratch.add_(1))):
        h = host_time(fn, calls=a.calls)
        rows.append((name, h.median_us, h.p90_us))
    if launch.MODULE is not None:  # the ablation: the same calls on the Python launch path
        launch.fast_launch(False)
        for name, fn in (("Chord humming_forward gate_up, C launch path off (CHORD_FAST_LAUNCH=0)", hf_gate_up),
                         ("Chord humming_forward down, C launch path off", hf_down),
                         ("chord.ops.gemm_indexed gate_up (trusted), C launch path off", gate_up)):
            h = host_time(fn, calls=a.calls)
            rows.append((name, h.median_us, h.p90_us))
        launch.fast_launch(True)
    # the checked call reads device values, so it waits for the GPU anyway: time it plainly
    h = host_time(checked, calls=min(a.calls, 500), keep_ahead=False)
    rows.append(("chord.ops.gemm_indexed gate_up (default: routing checked)", h.median_us, h.p90_us))

    if a.humming_dir:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "humming.json")
            env = humming_env(a.humming_dir)
            cmd = [sys.executable, "-P", "-m", "chord.bench.humming_baseline", "--humming-dir", a.humming_dir,
                   "--scenarios", a.scenario, "--families", "indexed", "--json-out", out, "--host-time",
                   "--host-calls", str(a.calls), "--no-split", "--rep-ms", "50", "--warmup-ms", "20"]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"upstream Humming worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            for r in json.load(open(out))["rows"]:
                if r["metric"].startswith("host_us_"):
                    rows.append((f"upstream Humming humming_forward {r['metric'][8:]}", r["p50"], r.get("p90")))

    print(f"\nhost time per call, {sc.id}, schedules {info['schedule_gate_up']} / {info['schedule_down']}, "
          f"{torch.cuda.get_device_name()}")
    for name, med, p90 in rows:
        print(f"  {name:62s} median {med:6.1f} us  p90 {p90:6.1f} us", flush=True)

    if a.parts:
        tensors = (fi.gate_up_in, w13.qweight, w13.scales, r1.sorted_ids, r1.expert_ids, r1.num_tokens_post_padded, gu)
        fresh = Schedule.from_id(s1.id)
        print("\nthe Python side of one raw call, piece by piece:")
        for name, fn in (("validation memo key (7 tensors' metadata)",
                          lambda: tuple((t.dtype, t.get_device(), t.shape, t.stride(), t.data_ptr() & 15)
                                        for t in tensors)),
                         ("schedule id (cached after the first read)", lambda: fresh.id),
                         ("split-K buffer lookup", lambda: ops._split_args(s1, fi.gate_up_in, grid[0], grid[1])),
                         ("parameter packing", lambda: jit.pack_gemm_params(x=1, qweight=2, scales=3, out=4, n=5, k=6,
                                                                            num_experts=7)),
                         ("raw CUDA stream", lambda: ops._raw_stream(dev.index or 0))):
            h = host_time(fn, calls=a.calls)
            print(f"  {name:62s} median {h.median_us:6.2f} us  p90 {h.p90_us:6.2f} us", flush=True)

    if a.cprofile:
        import cProfile
        import pstats

        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.calls):
            gate_up()
        prof.disable()
        torch.cuda.synchronize()
        print(f"cProfile of {a.calls} trusted calls (times are totals over all calls):")
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
