"""The activation between gate_up and down (humming.ops.process_input / may_process_input).

Every activation vLLM 0.33 defines (vllm/.../quantization/utils/humming/activation.py, strings
copied below as data, already formatted the way get_humming_activation formats them) must
work: the torch path evaluates the CUDA expression text (humming._cexpr) and must match the
PyTorch formula of the activation; the CUDA kernel compiles (nvcc sm_90a, no GPU needed) and
on the GPU must agree with the torch path. Layouts normal / grouped_mask / scatter and the
num_valid_tokens / zero_invalid bounds are checked against an explicit per-row oracle.
"""
from __future__ import annotations

import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from humming import activation, _cexpr
from humming.ops import process_input

BF16 = torch.bfloat16

_SILU = "a / (1.f + expf(-a))"
_GELU = "0.5f * a * (1.f + erff(a * 0.7071067811865476f))"
_RELU2 = "fmaxf(a, 0.f) * fmaxf(a, 0.f)"
_GELU_TANH = """[](float a) {
    const float cubic = 0.044715f * a * a * a;
    const float inner = 0.7978845608028654f * (a + cubic);
    return 0.5f * a * (1.f + tanhf(inner));
}(a)"""


def _clamped_silu(limit, alpha, beta):
    return f"""[](float a, float b) {{
    const float gate = fminf(a, ({limit}f));
    const float up = fmaxf(fminf(b, ({limit}f)), -({limit}f));
    const float activated_gate = gate / (1.f + expf(-({alpha}f) * gate));
    return activated_gate * (up + ({beta}f));
}}(a, b)"""


_SITU = """[](float a, float b) {
            const float gate = (4.0f) * tanhf(a / (4.0f));
            const float activated_gate = gate / (1.f + expf(-a));
            const float up = (2.0f) * tanhf(b / (2.0f));
            return activated_gate * up;
        }(a, b)"""
_SWIGLUSTEP = """[](float a, float b) {
            const float activated_gate = a / (1.f + expf(-a));
            const float gate = fminf(activated_gate, 7.f);
            const float up = fmaxf(fminf(b, 7.f), -7.f);
            return gate * up;
        }(a, b)"""


def _gelu_tanh(a):
    return F.gelu(a, approximate="tanh")


# name: (activation_type, activation_impl, torch formula of (gate, up))
VLLM_ACTIVATIONS = {
    "silu": ("binary_split", f"({_SILU}) * b", lambda a, b: F.silu(a) * b),
    "gelu": ("binary_split", f"({_GELU}) * b", lambda a, b: F.gelu(a) * b),
    "gelu_tanh": ("binary_split", f"({_GELU_TANH}) * b", lambda a, b: _gelu_tanh(a) * b),
    "relu2": ("binary_split", f"({_RELU2}) * b", lambda a, b: F.relu(a) ** 2 * b),
    "swigluoai": ("binary_interleaved", _clamped_silu(7.0, 1.702, 1.0),
                  lambda a, b: a.clamp(max=7) * torch.sigmoid(1.702 * a.clamp(max=7)) * (b.clamp(-7, 7) + 1)),
    "silu_clamped": ("binary_split", _clamped_silu(10.0, 1.0, 0.0),
                     lambda a, b: F.silu(a.clamp(max=10)) * b.clamp(-10, 10)),
    "situ": ("binary_split", _SITU, lambda a, b: 4 * torch.tanh(a / 4) * torch.sigmoid(a) * 2 * torch.tanh(b / 2)),
    "swiglustep": ("binary_split", _SWIGLUSTEP, lambda a, b: F.silu(a).clamp(max=7) * b.clamp(-7, 7)),
    "silu_no_mul": ("unary", _SILU, lambda a, b: F.silu(a)),
    "gelu_no_mul": ("unary", _GELU, lambda a, b: F.gelu(a)),
    "gelu_tanh_no_mul": ("unary", _GELU_TANH, lambda a, b: _gelu_tanh(a)),
    "relu2_no_mul": ("unary", _RELU2, lambda a, b: F.relu(a) ** 2),
}


def _split(act_type, x):
    x = x.float()
    if act_type == "binary_split":
        return x.chunk(2, dim=-1)
    if act_type == "binary_interleaved":
        return x[:, 0::2], x[:, 1::2]
    return x, torch.zeros_like(x)


@pytest.mark.parametrize("name", sorted(VLLM_ACTIVATIONS))
def test_expression_matches_the_activation_formula(name):
    act_type, impl, formula = VLLM_ACTIVATIONS[name]
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(sorted(VLLM_ACTIVATIONS).index(name))) * 6
    a, b = _split(act_type, x)
    got = _cexpr.evaluate(impl, a, b if act_type != "unary" else None)
    torch.testing.assert_close(got, formula(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(VLLM_ACTIVATIONS))
def test_process_input_torch_path_matches_formula(name):
    act_type, impl, formula = VLLM_ACTIVATIONS[name]
    x = (torch.randn(33, 2 * 40) * 4).to(BF16)
    out, gs, ts = process_input(x, activation_type=act_type, activation_impl=impl)
    assert gs is None and ts is None
    a, b = _split(act_type, x)
    assert out.dtype == BF16 and out.shape == (33, 40 if act_type != "unary" else 80)
    assert torch.equal(out, formula(a, b).to(BF16)) or torch.allclose(out.float(), formula(a, b), rtol=8e-3,
                                                                       atol=1e-5)


@pytest.mark.parametrize("text, message", [
    ("a + foo(b)", "unknown function"), ("a +", "expected an expression"), ("c * a", "unknown name"),
    ("[](float a) { a = 1.f; return a; }(a)", "declaration"), ("expf(a, b)", "takes 1"),
])
def test_bad_expressions_fail_loudly(text, message):
    with pytest.raises(ValueError, match=message):
        _cexpr.evaluate(text, torch.zeros(3), torch.zeros(3))


def test_c_semantics_of_the_expression_grammar():
    a = torch.tensor([-1.5, 0.0, 2.5])
    assert torch.equal(_cexpr.evaluate("a > 0.f ? a : 1 / 2", a), torch.tensor([0.0, 0.0, 2.5]))  # int division
    assert torch.equal(_cexpr.evaluate("(float)1 / 2 + a * 0", a), torch.full((3,), 0.5))
    assert torch.equal(_cexpr.evaluate("fmaxf(a, 0.f) && a < 3.f ? 1.f : 0.f", a), torch.tensor([0.0, 0.0, 1.0]))
    assert torch.equal(_cexpr.evaluate("roundf(a)", a), torch.tensor([-2.0, 0.0, 3.0]))  # halves away from zero


# --------------------------------------------------------------------------------------------
# layouts (the torch path here; the kernel is compared to it on the GPU)


def _oracle(x, out0, act_type, impl, formula, layout, scatter_idx=None, expert_tokens=None, nv=None, zero=False):
    out = out0.clone()
    a, b = _split(act_type, x)
    y = _cexpr.evaluate(impl, a, b).to(BF16)  # the layout logic is under test here, not the math
    rows = scatter_idx.shape[0] if layout == "scatter" else x.shape[0]
    for r in range(rows):
        if layout == "scatter":
            for dst in scatter_idx.view(rows, -1)[r].tolist():
                if dst < 0 or dst >= min(out.shape[0], scatter_idx.numel()):
                    continue
                if nv is not None and dst >= nv:
                    if zero:
                        out[dst] = 0
                    continue
                out[dst] = y[r]
            continue
        if layout == "grouped_mask":
            max_rows = x.shape[0] // expert_tokens.numel()
            ok = r % max_rows < int(expert_tokens[r // max_rows])
        else:
            ok = nv is None or r < nv
        if ok:
            out[r] = y[r]
        elif zero:
            out[r] = 0
    return out


LAYOUT_CASES = {
    "normal": dict(layout="normal"),
    "normal-valid-int64": dict(layout="normal", nv=("int64", 5)),
    "normal-valid-int32-zero": dict(layout="normal", nv=("int32", 3), zero=True),
    "grouped-mask": dict(layout="grouped_mask", expert_tokens=[2, 0, 3, 1]),
    "grouped-mask-zero": dict(layout="grouped_mask", expert_tokens=[2, 0, 3, 1], zero=True),
    "scatter-topk": dict(layout="scatter", scatter=[[0, 5], [3, -1], [1, 2], [7, 40]], nv=("int64", 6)),
    "scatter-identity": dict(layout="scatter", scatter=[[0], [-1], [2], [3], [-1], [5], [6], [7]]),
}


def _layout_args(case, rows, device):
    kw = {"layout": case["layout"], "zero_invalid": case.get("zero", False)}
    if "nv" in case:
        dt, v = case["nv"]
        kw["num_valid_tokens"] = torch.tensor([v], dtype=getattr(torch, dt), device=device)
    if "expert_tokens" in case:
        kw["expert_tokens"] = torch.tensor(case["expert_tokens"], dtype=torch.int32, device=device)
    if "scatter" in case:
        kw["scatter_idx"] = torch.tensor(case["scatter"], dtype=torch.int32, device=device)
    return kw


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
@pytest.mark.parametrize("name", ["silu", "swigluoai", "gelu_no_mul"])
def test_layouts_torch_path(case, name):
    act_type, impl, formula = VLLM_ACTIVATIONS[name]
    spec = LAYOUT_CASES[case]
    x = (torch.randn(8, 48) * 3).to(BF16)
    kw = _layout_args(spec, 8, "cpu")
    cols = 24 if act_type != "unary" else 48
    out0 = torch.full((8, cols), 9.0, dtype=BF16)
    out = out0.clone()
    process_input(x, outputs=out, activation_type=act_type, activation_impl=impl, **kw)
    nv = int(kw["num_valid_tokens"][0]) if "num_valid_tokens" in kw else None
    want = _oracle(x, out0, act_type, impl, formula, spec["layout"], kw.get("scatter_idx"), kw.get("expert_tokens"), nv,
                   kw["zero_invalid"])
    assert torch.equal(out, want)


def test_identity_scatter_is_an_exact_copy():
    """grouped w13: activation 'none' + scatter moves hidden rows into the permuted buffer bit-exactly."""
    x = torch.randn(4, 64).to(BF16)
    idx = torch.tensor([[2, 0], [5, 7], [1, 3], [6, 4]], dtype=torch.int32)
    out = torch.full((8, 64), float("nan"), dtype=BF16)
    process_input(x, outputs=out, layout="scatter", scatter_idx=idx)
    for r in range(4):
        for d in idx[r].tolist():
            assert torch.equal(out[d], x[r])


def test_process_input_under_torch_compile_fullgraph():
    from humming.config import LayerConfig
    from humming.forward import may_process_input

    cfg = LayerConfig(shape_n=256, shape_k=128, num_experts=4)
    act_type, impl, formula = VLLM_ACTIVATIONS["silu"]

    def f(x, out, nv):
        y, _, _ = may_process_input(cfg, x, outputs=out, activation_type=act_type, activation_impl=impl,
                                    layout="normal", num_valid_tokens=nv)
        return y * 1

    x = torch.randn(6, 64).to(BF16)
    out = torch.zeros(6, 32, dtype=BF16)
    got = torch.compile(f, fullgraph=True)(x, out, torch.tensor([4]))
    a, b = x.float().chunk(2, -1)
    assert torch.equal(got[:4], formula(a, b).to(BF16)[:4]) and torch.equal(got[4:], torch.zeros(2, 32, dtype=BF16))


def test_custom_op_opcheck():
    act_type, impl, _ = VLLM_ACTIVATIONS["silu"]
    x = torch.randn(5, 16).to(BF16)
    out = torch.zeros(5, 8, dtype=BF16)
    torch.library.opcheck(torch.ops.chord.humming_process_input.default,
                          (x, out, None, None, torch.tensor([3]), act_type, impl, "normal", False, "auto"))


def test_may_process_input_does_nothing_when_there_is_nothing_to_do():
    from humming.config import LayerConfig
    from humming.forward import may_process_input

    cfg = LayerConfig(shape_n=256, shape_k=128, num_experts=4)
    x = torch.randn(4, 128).to(BF16)
    y, gs, ts = may_process_input(cfg, x, outputs=None, layout="grouped_mask",
                                  expert_tokens=torch.tensor([1, 1, 1, 1], dtype=torch.int32))
    assert y is x and gs is None and ts is None
    buf = torch.empty_like(x)
    y, _, _ = may_process_input(cfg, x, outputs=buf)
    assert y is buf and torch.equal(buf, x)


# --------------------------------------------------------------------------------------------
# the CUDA kernel: compiles without a GPU; agrees with the torch path on one

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("CHORD_NVCC")
                                and not os.environ.get("CI"), reason="nvcc not installed (CI never skips this)")


def test_rendered_source_holds_the_expression_and_a_content_hash_name():
    src, name = activation.render("binary_split", "(a / (1.f + expf(-a))) * b")
    assert "(a / (1.f + expf(-a))) * b" in src and f"void {name}(" in src
    assert name == activation.render("binary_split", "(a / (1.f + expf(-a))) * b")[1]
    assert name != activation.render("binary_split", "a * b")[1]
    assert name != activation.render("binary_interleaved", "(a / (1.f + expf(-a))) * b")[1]


@pytest.mark.parametrize("narrow", [False, True])
def test_kernels_wait_for_the_gemm_before_any_global_access_and_pdl_is_a_switch(narrow):
    """The rendered kernel is one call of csrc/activation/elementwise.cuh's act_narrow / act_wide,
    and both begin with the grid-dependency wait and then the trigger (no-ops in a plain launch);
    CHORD_ACTIVATION_PDL (off by default) makes the launch a programmatic one."""
    from chord import _env, jit

    src, name = activation.render("binary_split", "a * b", narrow)
    body = src[src.index(f"void {name}("):]
    part = "act_narrow" if narrow else "act_wide"
    assert body.split("{", 1)[1].strip().startswith(f"chord::act::{part}<ChordAct>(p);")
    header = (jit.csrc_dir() / "activation" / "elementwise.cuh").read_text()
    for fn in ("act_narrow", "act_wide"):
        assert header.split(f"void {fn}(", 1)[1].split("{", 1)[1].lstrip().startswith("grid_dependency();"), fn
    helper = header[header.index("void grid_dependency()"):]
    assert helper.index("griddepcontrol.wait") < helper.index("griddepcontrol.launch_dependents")
    assert activation._pdl() is False
    with _env.override(CHORD_ACTIVATION_PDL=True):
        assert activation._pdl() is True


@needs_nvcc
@pytest.mark.parametrize("name", sorted(VLLM_ACTIVATIONS) + ["none"])
def test_every_vllm_activation_compiles_for_sm90a(name):
    from chord import jit

    act_type, impl = ("none", None) if name == "none" else VLLM_ACTIVATIONS[name][:2]
    src, kname = activation.render(act_type, impl)
    res = jit.build(src, name=kname)
    assert res.cubin.exists() and res.spill_bytes == 0


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [40, 37, 2048])
@pytest.mark.parametrize("name", sorted(VLLM_ACTIVATIONS) + ["none"])
def test_cuda_kernel_matches_torch_path(name, cols):
    act_type, impl = ("none", None) if name == "none" else VLLM_ACTIVATIONS[name][:2]
    in_cols = cols if act_type in ("unary", "none") else 2 * cols
    x = (torch.randn(70, in_cols, device="cuda") * 4).to(BF16)
    a, _, _ = process_input(x, activation_type=act_type, activation_impl=impl, backend="cuda")
    b, _, _ = process_input(x, activation_type=act_type, activation_impl=impl, backend="torch")
    if name == "none":
        assert torch.equal(a, x)
    torch.testing.assert_close(a.float(), b.float(), rtol=1.6e-2, atol=1e-4)  # last-ulp expf/erff/tanhf differences
    assert (a != b).float().mean() < 0.02


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
@pytest.mark.parametrize("cols", [24, 13])
def test_cuda_kernel_layouts(case, cols):
    act_type, impl, _ = VLLM_ACTIVATIONS["silu"]
    spec = LAYOUT_CASES[case]
    x = (torch.randn(8, 2 * cols, device="cuda") * 3).to(BF16)
    kw = _layout_args(spec, 8, "cuda")
    outs = []
    for backend in ("cuda", "torch"):
        out = torch.full((8, cols), 9.0, dtype=BF16, device="cuda")
        process_input(x, outputs=out, activation_type=act_type, activation_impl=impl, backend=backend, **kw)
        outs.append(out)
    torch.testing.assert_close(outs[0].float(), outs[1].float(), rtol=1.6e-2, atol=1e-4)
    assert torch.equal(outs[0] == 9.0, outs[1] == 9.0)  # same rows left untouched


@pytest.mark.gpu
def test_cuda_kernel_in_a_cuda_graph_reads_counts_on_device():
    act_type, impl, _ = VLLM_ACTIVATIONS["silu"]
    x = torch.randn(16, 64, device="cuda").to(BF16)
    out = torch.full((16, 32), 9.0, dtype=BF16, device="cuda")
    nv = torch.tensor([3], dtype=torch.int64, device="cuda")
    process_input(x, outputs=out, activation_type=act_type, activation_impl=impl, num_valid_tokens=nv)  # warm up
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        process_input(x, outputs=out, activation_type=act_type, activation_impl=impl, num_valid_tokens=nv)
    out.fill_(9.0)
    nv.fill_(11)
    g.replay()
    torch.cuda.synchronize()
    assert (out[:11] != 9.0).all() and (out[11:] == 9.0).all()
