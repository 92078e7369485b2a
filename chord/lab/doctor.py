"""``chord doctor``: will this installation serve? One line per check, PASS / FAIL / SKIP.

What a pip user runs after installing (no tests, no checkout needed):

* ``chord``        -- the version and where it is installed (INFO);
* ``environment``  -- every CHORD_* value is valid;
* ``humming``      -- ``import humming`` is Chord's module root, and upstream ``humming-kernels``
  (which owns the same import name) is not installed beside it;
* ``GPU``          -- a CUDA device of compute capability 9.0 (H100 / H200); SKIP without a GPU;
* ``nvcc``         -- the CUDA compiler the kernels are built with (>= 12.3 for sm_90a);
* ``kernel cache`` -- the cubin cache folder is writable, and how many kernels it holds;
* ``profile``      -- the GPU profile and the selection policy in use, and the profile's deployments;
* ``forward``      -- a small MoE GEMM through the ``humming`` root (what vLLM calls) against an
  independent float32 computation: on Chord's kernels with a GPU; without one on the float32
  reference path (weight import, layout and dispatch checked, kernels not run: SKIP for them).

Exit status 1 when any check FAILs, else 0 (SKIPs do not fail: a machine without a GPU is not a
broken installation, but it cannot serve, and the SKIP lines say so).
"""
from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
from pathlib import Path
from typing import Callable, TextIO

PASS, FAIL, SKIP, INFO = "PASS", "FAIL", "SKIP", "INFO"
MIN_NVCC = (12, 3)
FORWARD_TOL = 1e-2  # bf16 output of a float32-accumulated GEMM against float32: ~2e-3 expected


@dataclasses.dataclass
class Check:
    status: str
    name: str
    detail: str


def _gpu() -> tuple[str, str]:
    """(status, detail) of the GPU check."""
    import torch

    if not torch.cuda.is_available():
        return SKIP, ("no CUDA GPU found: Chord's kernels cannot run on this machine, so it cannot serve; "
                      "everything that needs no GPU (this check, `chord precompile`, the notebooks' recorded "
                      "views, `chord bench`'s reference path) works")
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return FAIL, f"{name} is sm_{major}{minor}; Chord's kernels are built for sm_90a (H100 / H200)"
    return PASS, f"{name}, sm_90, {torch.cuda.get_device_properties(0).multi_processor_count} SMs"


def check_environment() -> Check:
    from chord.lab import _args

    try:
        _args.check_environment()
    except _args.UsageError as exc:
        return Check(FAIL, "environment", str(exc))
    from chord import _env

    set_vars = list(_env.current())
    return Check(PASS, "environment", f"CHORD_* values valid ({', '.join(set_vars) or 'none set'})")


def check_humming() -> Check:
    import importlib.metadata as md

    try:
        upstream = md.version("humming-kernels")
    except md.PackageNotFoundError:
        upstream = None
    if upstream is not None:
        return Check(FAIL, "humming", f"upstream humming-kernels {upstream} is installed beside Chord and owns the "
                                      "same import name: pip uninstall -y humming-kernels chord-moe, then reinstall "
                                      "Chord")
    try:
        import humming
    except ImportError as exc:
        return Check(FAIL, "humming", f"import humming failed: {exc}")
    import chord

    where = Path(humming.__file__).resolve().parent
    if getattr(humming, "BACKEND", None) != "chord" or where.parent != Path(chord.__file__).resolve().parent.parent:
        return Check(FAIL, "humming", f"import humming resolves to {where}, not to Chord's module root next to {chord.__file__}")
    return Check(PASS, "humming", f"Chord's module root ({where}); upstream humming-kernels not installed")


def check_nvcc(has_gpu: bool) -> Check:
    from chord import jit

    try:
        nvcc = jit.nvcc_path()
        version = jit.nvcc_version(nvcc)
    except jit.JitError as exc:
        status = FAIL if has_gpu else SKIP
        why = "" if has_gpu else " (no GPU here, so nothing needs compiling; `chord precompile` needs it)"
        return Check(status, "nvcc", f"{exc}{why}")
    m = re.search(r"(?:release |V|cuda_)(\d+)\.(\d+)", version)
    if m and (int(m.group(1)), int(m.group(2))) < MIN_NVCC:
        return Check(FAIL, "nvcc", f"{nvcc} is {version}: sm_90a needs CUDA >= {MIN_NVCC[0]}.{MIN_NVCC[1]}")
    return Check(PASS, "nvcc", f"{nvcc} ({version})")


def check_cache() -> Check:
    from chord import jit

    root = jit.cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Check(FAIL, "kernel cache", f"{root} is not writable ({exc}); set CHORD_CACHE_DIR to a writable folder")
    kernels = sum(1 for _ in (root / "cubin").glob("*.cubin")) if (root / "cubin").is_dir() else 0
    hint = "" if kernels else "; kernels compile on first use, or ahead with `chord precompile`"
    return Check(PASS, "kernel cache", f"{root} (writable, {kernels} kernels{hint})")


def check_profile() -> Check:
    from chord.schedule import current_policy, gpu_profile_name, load_profile_file

    name = gpu_profile_name()
    try:
        pf = load_profile_file(name)
        policy = current_policy().name
    except ValueError as exc:
        return Check(FAIL, "profile", str(exc))
    return Check(PASS, "profile", f"{name} ({pf.path}; deployments {', '.join(sorted(pf.deployments))}); "
                                  f"policy {policy}")


def _small_moe(device: str):
    """(humming layer, inputs, expert offsets, float32 expected output): 4 experts, N = K = 256, a
    contiguous routing with one expert left empty; the expected output is computed from the int4
    codes and scales directly, not through chord.reference."""
    import torch

    from chord import formats
    from humming.layer import HummingLayer
    from humming.schema import HummingWeightSchema

    e, n, k = 4, 256, 256
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (e, n, k), generator=g, dtype=torch.int8)
    scales = (torch.rand(e, n, k // 32, generator=g) * 0.02 + 0.001).to(torch.bfloat16)
    layer = HummingLayer.from_tensors({"weight": formats.pack_compressed_tensors(q), "weight_scale": scales}, n, k,
                                      HummingWeightSchema(weight_scale_group_size=32), num_experts=e)
    counts = torch.tensor([3, 0, 9, 4])
    offsets = torch.zeros(e + 1, dtype=torch.int64)
    offsets[1:] = counts.cumsum(0)
    x = torch.randn(int(counts.sum()), k, generator=g).to(torch.bfloat16)
    w = q.float() * scales.float().repeat_interleave(32, -1)
    expert = torch.repeat_interleave(torch.arange(e), counts)
    want = torch.einsum("rk,rnk->rn", x.float(), w[expert])
    return layer.to(device), x.to(device), offsets.to(device), want


def _forward_error(device: str) -> float:
    import torch

    layer, x, offsets, want = _small_moe(device)
    out = torch.full((x.shape[0], want.shape[1]), float("nan"), dtype=torch.bfloat16, device=device)
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):  # the untuned-shape note of a 4-expert layer
        y = layer(x, "grouped_contiguous", expert_layout=offsets, outputs=out)
    if device == "cuda":
        torch.cuda.synchronize()
    y = y.float().cpu()
    if not torch.isfinite(y).all():
        return float("inf")
    return float((y - want).norm() / want.norm())


def check_forward(has_gpu: bool) -> list[Check]:
    if has_gpu:
        try:
            err = _forward_error("cuda")
        except Exception as exc:  # a compile or launch failure is this check's answer
            return [Check(FAIL, "forward", f"humming root on Chord's kernels: {type(exc).__name__}: {exc}")]
        status = PASS if err <= FORWARD_TOL else FAIL
        return [Check(status, "forward", f"humming root on Chord's kernels, 4 experts x 256 x 256, grouped_contiguous: "
                                         f"relative error {err:.1e} against float32 (limit {FORWARD_TOL:.0e})")]
    from humming import _chord

    try:
        with _chord.cpu_reference_backend():
            err = _forward_error("cpu")
    except Exception as exc:
        return [Check(FAIL, "forward", f"humming root on the float32 reference path: {type(exc).__name__}: {exc}")]
    status = PASS if err <= FORWARD_TOL else FAIL
    return [Check(status, "forward", f"humming root on the float32 reference path (no GPU): relative error {err:.1e} "
                                     "against float32; checks weight import, layout and dispatch"),
            Check(SKIP, "forward kernels", "no CUDA GPU found: Chord's kernels were not run")]


def run_checks() -> list[Check]:
    import chord

    checks = [Check(INFO, "chord", f"{chord.__version__} ({Path(chord.__file__).resolve().parent})")]
    checks.append(check_environment())
    checks.append(check_humming())
    status, detail = _gpu()
    checks.append(Check(status, "GPU", detail))
    has_gpu = status == PASS
    checks.append(check_nvcc(has_gpu))
    checks.append(check_cache())
    checks.append(check_profile())
    if status == FAIL:  # a GPU Chord cannot run on: the forward would only repeat that
        checks.append(Check(SKIP, "forward", "the GPU is not sm_90 (see above)"))
    else:
        checks += check_forward(has_gpu)
    return checks


def main(out: TextIO | None = None, checks: Callable[[], list[Check]] = run_checks) -> int:
    out = out or sys.stdout
    results = checks()
    for c in results:
        print(f"{c.status:4s}  {c.name:15s} {c.detail}", file=out, flush=True)
    counts = {s: sum(c.status == s for c in results) for s in (PASS, FAIL, SKIP)}
    verdict = ("this installation can serve" if not counts[FAIL] and not counts[SKIP] else
               "this installation cannot serve on this machine (see SKIP)" if not counts[FAIL] else
               "fix the FAIL lines above")
    print(f"chord doctor: PASS {counts[PASS]}, FAIL {counts[FAIL]}, SKIP {counts[SKIP]}: {verdict}", file=out)
    return 1 if counts[FAIL] else 0


if __name__ == "__main__":
    sys.exit(main())
