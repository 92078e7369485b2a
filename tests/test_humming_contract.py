"""The `humming` module root as vLLM 0.33 sees it: every facade name resolves, import is light,
co-installation with upstream humming-kernels is refused, and everything Chord does not serve
raises ChordUnsupportedError at load time (schema creation, conversion, tuning) with a message
that names the scheme.

The export table below is vLLM 0.33.0's ``vllm/utils/humming.py:_EXPORTS`` copied as data.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

VLLM_033_EXPORTS = {
    "dtypes": "humming.dtypes",
    "DataType": "humming.dtypes:DataType",
    "GemmType": "humming.config:GemmType",
    "LayerConfig": "humming.config:LayerConfig",
    "WeightScaleType": "humming.config:WeightScaleType",
    "WeightScale2Type": "humming.config:WeightScale2Type",
    "InputQuantizationMode": "humming.config:InputQuantizationMode",
    "MmaType": "humming.config:MmaType",
    "humming_forward": "humming.forward:humming_forward",
    "may_process_input": "humming.forward:may_process_input",
    "process_input": "humming.ops:process_input",
    "may_quant_input": "humming.forward:may_quant_input",
    "prepare_and_transform_humming_tensors": "humming.transform:prepare_and_transform_humming_tensors",
    "get_heuristics_config": "humming.tune:get_heuristics_config",
    "BaseInputSchema": "humming.schema:BaseInputSchema",
    "BaseWeightSchema": "humming.schema:BaseWeightSchema",
    "HummingInputSchema": "humming.schema:HummingInputSchema",
    "HummingWeightSchema": "humming.schema:HummingWeightSchema",
    "quantize_weight": "humming.utils.weight:quantize_weight",
    "AWQWeightSchema": "humming.schema:AWQWeightSchema",
    "BitnetWeightSchema": "humming.schema:BitnetWeightSchema",
    "ModeloptMxfp8WeightSchema": "humming.schema.modelopt:ModeloptMxfp8WeightSchema",
    "ModeloptNvfp4InputSchema": "humming.schema.modelopt:ModeloptNvfp4InputSchema",
    "ModeloptNvfp4WeightSchema": "humming.schema.modelopt:ModeloptNvfp4WeightSchema",
    "CompressedTensorsInputSchema": "humming.schema:CompressedTensorsInputSchema",
    "CompressedTensorsWeightSchema": "humming.schema:CompressedTensorsWeightSchema",
    "Fp8InputSchema": "humming.schema:Fp8InputSchema",
    "Fp8WeightSchema": "humming.schema.fp8:Fp8WeightSchema",
    "Mxfp4WeightSchema": "humming.schema:Mxfp4WeightSchema",
    "GptOssMxfp4WeightSchema": "humming.schema:GptOssMxfp4WeightSchema",
    "GPTQWeightSchema": "humming.schema:GPTQWeightSchema",
}


def _resolve(spec: str):
    """What vllm.utils.humming.__getattr__ does with one _EXPORTS entry."""
    if ":" in spec:
        mod, attr = spec.split(":", 1)
        return getattr(importlib.import_module(mod), attr)
    return importlib.import_module(spec)


@pytest.mark.parametrize("name", sorted(VLLM_033_EXPORTS))
def test_every_facade_export_resolves(name):
    assert _resolve(VLLM_033_EXPORTS[name]) is not None


def test_humming_layer_module_imports():
    layer = importlib.import_module("humming.layer")
    assert hasattr(layer, "HummingLayer")


def test_vllm_import_time_dtype_tables_build():
    """vllm/.../utils/humming/schema.py builds dicts keyed by these names at import (has_humming())."""
    from humming import dtypes as d

    quant_keys = [d.float4e0m3, d.float4e2m1, d.float6e2m3, d.float6e3m2, d.float8e3m4, d.float8e4m3, d.float8e5m2,
                  d.int8, d.uint4, d.uint8, d.uint2, d.uint3, d.uint5, d.uint6, d.uint7]
    scale_keys = [d.float8e8m0, d.float8e4m3, d.float16, d.bfloat16, d.float32]
    assert len({k: 0 for k in quant_keys}) == len(quant_keys)
    assert len({k: 0 for k in scale_keys}) == len(scale_keys)
    # fused_humming_moe.get_buffer_metas maps these to torch dtypes and reads .num_bits
    for k in (d.float16, d.bfloat16, d.float32, d.float8e3m4, d.float8e4m3, d.float8e5m2, d.int8, d.int4, d.float4e0m3,
              d.float4e2m1):
        assert isinstance(k.num_bits, int)
    assert d.DataType.from_str("uint4") == d.uint4 and str(d.uint4) == "uint4"
    assert d.DataType.from_any(torch.bfloat16) == d.bfloat16
    assert d.DataType.from_any(torch.float8_e4m3fn) == d.float8e4m3
    assert str(d.float8e4m3).startswith("float8")  # vLLM: q_dtype.startswith("float8")
    assert d.float4e2m1.is_floating_point_type and not d.uint4.is_floating_point_type


def test_input_quantization_mode_properties_vllm_reads():
    from humming.config import InputQuantizationMode as Q

    assert not Q.Disabled.should_quantize and not Q.Disabled.has_group_scale and not Q.Disabled.has_secondary_scale
    assert Q.DynamicGroupToken.has_secondary_scale and Q.StaticTensorDynamicGroup.has_secondary_scale
    assert Q.DynamicGroup.has_group_scale and not Q.DynamicGroup.has_secondary_scale
    assert Q("dynamic_group") is Q.DynamicGroup and Q.DynamicGroup == "dynamic_group"  # vLLM compares with str


def test_schema_maps_cover_every_quant_method_vllm_can_pass():
    from humming.schema import BaseInputSchema, BaseWeightSchema

    for method in ("auto-round", "auto_round", "awq", "bitnet", "compressed-tensors", "fp8", "gptq", "humming",
                   "modelopt", "mxfp4", "gpt_oss_mxfp4", "quark"):
        assert method in BaseWeightSchema.WEIGHT_SCHEMA_MAP
    # vLLM decides *whether* a checkpoint quantizes inputs with `quant_method in INPUT_SCHEMA_MAP`:
    # a missing key would silently drop input quantization instead of refusing it.
    for method in ("compressed-tensors", "fp8", "humming", "modelopt", "quark"):
        assert method in BaseInputSchema.INPUT_SCHEMA_MAP


# --------------------------------------------------------------------------------------------
# import: light, no compilation; refuses co-installation with upstream humming-kernels


def _run(code: str, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    paths = [str(REPO)] + ([extra_path] if extra_path else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=str(REPO), timeout=120)


def test_import_is_light_and_compiles_nothing():
    proc = _run("""
        import subprocess, sys, time
        calls = []
        real_popen = subprocess.Popen.__init__
        def spy(self, *a, **k):
            calls.append(a[0] if a else k.get("args"))
            return real_popen(self, *a, **k)
        subprocess.Popen.__init__ = spy
        t0 = time.perf_counter()
        import humming
        dt = time.perf_counter() - t0
        heavy = sorted(m for m in ("torch", "chord", "chord.jit", "chord.ops", "triton") if m in sys.modules)
        print(dt, heavy, calls)
    """)
    assert proc.returncode == 0, proc.stderr
    dt, heavy, calls = proc.stdout.strip().split(" ", 2)
    assert float(dt) < 1.0, f"import humming took {dt} s"
    assert heavy == "[]", f"import humming pulled in {heavy}"
    assert calls == "[]", f"import humming started processes: {calls}"


def test_import_refuses_upstream_humming_kernels(tmp_path):
    dist = tmp_path / "humming_kernels-0.1.20.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: humming-kernels\nVersion: 0.1.20\n")
    proc = _run("import humming", extra_path=str(tmp_path))
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "humming-kernels 0.1.20" in proc.stderr and "cannot be installed together" in proc.stderr


# --------------------------------------------------------------------------------------------
# refusals at load time

from humming.errors import ChordUnsupportedError  # noqa: E402

KIMI_WEIGHTS = {"num_bits": 4, "type": "int", "symmetric": True, "group_size": 32, "strategy": "group",
                "block_structure": None, "dynamic": False, "actorder": None, "observer": "minmax",
                "observer_kwargs": {}, "quant_method": "compressed-tensors", "format": "pack-quantized"}


def _ct(**changes):
    return {**KIMI_WEIGHTS, **changes}


def test_kimi_compressed_tensors_weights_are_served():
    from humming.schema import BaseWeightSchema, CompressedTensorsWeightSchema

    s = BaseWeightSchema.from_config(KIMI_WEIGHTS)
    assert isinstance(s, CompressedTensorsWeightSchema)
    h = s.to_humming_schema(torch.bfloat16)
    assert (str(h.b_dtype), str(h.bs_dtype), h.weight_scale_group_size, h.has_zero_point) == ("uint4", "bfloat16",
                                                                                            32, False)


@pytest.mark.parametrize("config, words", [
    (_ct(num_bits=8), "int8"),
    (_ct(symmetric=False), "asymmetric"),
    (_ct(format="float-quantized", type="float", num_bits=8), "float-quantized"),
    (_ct(format="int-quantized", num_bits=8), "int-quantized"),
    (_ct(format="nvfp4-pack-quantized", type="float", strategy="tensor_group", group_size=16), "FP4"),
    (_ct(format="mxfp4-pack-quantized", type="float", group_size=32), "FP4"),
    (_ct(group_size=16), "group size 16"),
    (_ct(group_size=48), "group size 48"),
    (_ct(strategy="tensor", group_size=None), "strategy 'tensor'"),
    (_ct(strategy="block", block_structure=[128, 128], group_size=None), "strategy 'block'"),
    (_ct(actorder="group"), "actorder"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "FP8"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, "AWQ"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}, "GPTQ"),
    ({"quant_method": "mxfp4"}, "MXFP4"),
    ({"quant_method": "gpt_oss_mxfp4"}, "MXFP4"),
    ({"quant_method": "bitnet"}, "BitNet"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "ModelOpt"),
    ({"quant_method": "quark"}, "Quark"),
    ({"quant_method": "auto-round", "bits": 4}, "AutoRound"),
    ({"quant_method": "humming", "dtype": "uint8", "group_size": 32}, "uint8"),
    ({"quant_method": "humming", "dtype": "float4e2m1", "group_size": 32, "scale_dtype": "float8e8m0"},
     "float4e2m1"),
    ({"quant_method": "humming", "dtype": "uint4", "group_size": 32, "has_zero_point": True}, "zero points"),
    ({"quant_method": "humming", "dtype": "uint4", "group_size": 32, "hadamard_block_size": 32}, "Hadamard"),
    ({"quant_method": "humming", "dtype": "uint4", "group_size": 32, "hadamard_block_size": -1}, "Hadamard"),
    ({"quant_method": "humming", "dtype": "uint4", "group_size": 32, "scale_2_type": "tensor"}, "secondary"),
    ({"quant_method": "humming", "dtype": "uint4", "group_size": 32, "scale_dtype": "float8e4m3"}, "float8e4m3"),
    ({"quant_method": "humming", "dtype": "uint4", "group_size": 128, "group_size_n": 128}, "128"),
    ({"quant_method": "no-such-method"}, "no-such-method"),
])
def test_unsupported_weight_schemes_raise_at_creation(config, words):
    from humming.schema import BaseWeightSchema

    with pytest.raises(ChordUnsupportedError) as info:
        BaseWeightSchema.from_config(config)
    msg = str(info.value)
    assert words in msg, msg
    assert "Chord serves W4A16 only" in msg


@pytest.mark.parametrize("name", ["AWQWeightSchema", "GPTQWeightSchema", "BitnetWeightSchema", "Mxfp4WeightSchema",
                                  "GptOssMxfp4WeightSchema", "Fp8InputSchema", "CompressedTensorsInputSchema"])
def test_refused_schema_names_import_and_fail_only_when_created(name):
    import humming.schema as S

    cls = getattr(S, name)  # importing is fine
    with pytest.raises(ChordUnsupportedError):
        cls()


@pytest.mark.parametrize("config", [
    # VLLM_HUMMING_INPUT_QUANT_CONFIG (vLLM adds quant_method "humming")
    {"quant_method": "humming", "dtype": "float8e4m3", "quant_mode": "dynamic_token"},
    {"quant_method": "humming", "dtype": "int8"},
    {"quant_method": "humming", "dtype": "float8e4m3", "group_size": 128, "quant_mode": "dynamic_group"},
    # compressed-tensors input_activations (W4A8)
    {"quant_method": "compressed-tensors", "format": "pack-quantized", "num_bits": 8, "type": "float",
     "strategy": "token", "dynamic": True},
    {"quant_method": "fp8", "activation_scheme": "dynamic"},
    {"quant_method": "modelopt", "quant_algo": "NVFP4"},
])
def test_input_quantization_is_refused(config):
    from humming.schema import BaseInputSchema

    with pytest.raises(ChordUnsupportedError, match="(?i)input|activation"):
        BaseInputSchema.from_config(config)


def test_unquantized_bf16_input_schemas_are_served():
    from humming.config import InputQuantizationMode
    from humming.schema import BaseInputSchema, HummingInputSchema

    assert HummingInputSchema().input_quant_mode is None
    HummingInputSchema(input_quant_mode=InputQuantizationMode.Disabled)  # vLLM's quant_key_to_input_schema(None)
    assert BaseInputSchema.from_config({"quant_method": "humming", "dtype": "bfloat16"}).a_dtype == "bfloat16"


def test_fp16_model_is_refused_clearly():
    from humming.schema import HummingInputSchema, HummingWeightSchema

    with pytest.raises(ChordUnsupportedError, match="bfloat16"):
        HummingInputSchema().is_compatible_with(HummingWeightSchema(weight_scale_group_size=32), torch.float16)
    with pytest.raises(ChordUnsupportedError, match="bfloat16"):
        HummingInputSchema(a_dtype="float16")  # vLLM's fallback candidate for an fp16 model


def _small_layer_config(num_experts=4):
    from humming.config import LayerConfig

    return LayerConfig(shape_n=256, shape_k=128, num_experts=num_experts)


def test_tuning_refuses_f16_accum():
    from humming.tune import get_heuristics_config

    with pytest.raises(ChordUnsupportedError, match="VLLM_HUMMING_USE_F16_ACCUM"):
        get_heuristics_config(layer_config=_small_layer_config(), gemm_type="indexed", use_f16_accum=True)
    with pytest.raises(TypeError, match="use_batch_invariant must be a bool"):
        get_heuristics_config(layer_config=_small_layer_config(), gemm_type="indexed", use_batch_invariant="yes")


@pytest.mark.parametrize("gemm_type", ["indexed", "grouped_contiguous", "grouped_masked"])
def test_batch_invariant_tuning_is_one_schedule_for_every_m(gemm_type):
    from humming.config import LayerConfig
    from chord.schedule import Schedule
    from humming.tune import get_heuristics_config, rows_for

    cfg = LayerConfig(shape_n=4096, shape_k=7168, num_experts=48)
    rows = get_heuristics_config(layer_config=cfg, gemm_type=gemm_type, use_batch_invariant=True)
    assert len(rows) == 1 and rows[0][0] <= 0 and rows[0][1] >= 2**31 - 1
    s = Schedule.from_id(rows[0][2]["schedule"])
    assert s.split_k == 1
    for m in (1, 7, 64, 4096, 100000):
        one = get_heuristics_config(layer_config=cfg, gemm_type=gemm_type, use_batch_invariant=True, shape_m=m)
        assert one["schedule"] == s.id
    # the ordinary table differs over M (that is what batch-invariant mode gives up)
    assert len({c["schedule"] for _, _, c in rows_for(s.family, 48, 4096, 7168)}) > 1


def test_forward_batch_invariant_needs_one_schedule_rows():
    from humming.config import LayerConfig
    from humming.forward import _decision
    from humming.tune import get_heuristics_config

    compute = json.dumps({"use_batch_invariant": True, "gemm_type": "indexed"})
    cfg = LayerConfig(shape_n=4096, shape_k=7168, num_experts=48)
    inv = json.dumps(get_heuristics_config(layer_config=cfg, gemm_type="indexed", use_batch_invariant=True))
    schedules = {_decision(compute, inv, 48, 4096, 7168, m)[1] for m in (1, 48, 3000, 30000)}
    assert len(schedules) == 1
    assert {_decision(compute, None, 48, 4096, 7168, m)[1] for m in (1, 30000)} == schedules
    many = json.dumps(get_heuristics_config(layer_config=cfg, gemm_type="indexed"))
    with pytest.raises(ValueError, match="use_batch_invariant=True"):
        _decision(compute, many, 48, 4096, 7168, 5)


@pytest.mark.parametrize("flag", ["use_f16_accum"])
def test_forward_refuses_compute_flags(flag):
    from humming.forward import humming_forward

    cfg = _small_layer_config()
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    compute = json.dumps({"use_batch_invariant": False, "use_f16_accum": False, "gemm_type": "indexed", flag: True})
    with pytest.raises(ChordUnsupportedError):
        humming_forward(cfg, x, torch.zeros(4, 16, 2, 32, 4, dtype=torch.int32),
                        torch.zeros(4, 16, 2, 8, 2, 2, dtype=torch.bfloat16), compute_config=compute)


@pytest.mark.parametrize("arg", ["zero_point", "bias", "weight_scale_2", "input_scale", "input_scale_2"])
def test_forward_refuses_extra_tensors(arg):
    from humming.forward import humming_forward

    cfg = _small_layer_config()
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    with pytest.raises(ChordUnsupportedError, match=arg):
        humming_forward(cfg, x, torch.zeros(1), torch.zeros(1), compute_config={"gemm_type": "indexed"},
                        **{arg: torch.zeros(1)})


def test_layer_config_refuses_what_the_kernels_cannot_run():
    from humming.config import InputQuantizationMode, LayerConfig

    with pytest.raises(ChordUnsupportedError):
        LayerConfig(shape_n=256, shape_k=128, a_dtype="float8e4m3",
                    input_quant_mode=InputQuantizationMode.DynamicToken)
    with pytest.raises(ChordUnsupportedError):
        LayerConfig(shape_n=256, shape_k=128, has_bias=True)
    with pytest.raises(ChordUnsupportedError):
        LayerConfig(shape_n=256, shape_k=128, b_dtype="uint8")
    with pytest.raises(ValueError, match="shape_k % 64"):
        LayerConfig(shape_n=256, shape_k=96)
    cfg = LayerConfig(shape_n=256, shape_k=128, num_experts=8)
    assert cfg.input_quant_mode is InputQuantizationMode.Disabled  # vLLM reads mode.should_quantize
    assert LayerConfig.from_str(cfg.to_str()) == cfg and hash(cfg) == hash(LayerConfig.from_str(cfg.to_str()))


def test_transform_refuses_bias_and_fp16_model():
    from humming.schema import HummingWeightSchema
    from humming.transform import prepare_and_transform_humming_tensors

    ws = HummingWeightSchema(weight_scale_group_size=32)
    tensors = {"weight": torch.zeros(2, 64, 16, dtype=torch.int32), "weight_scale": torch.ones(2, 64, 4,
                                                                                              dtype=torch.bfloat16)}
    with pytest.raises(ChordUnsupportedError, match="bias"):
        prepare_and_transform_humming_tensors({**tensors, "bias": torch.zeros(2, 64)}, 64, 128, ws, num_experts=2,
                                              has_bias=True)
    with pytest.raises(ChordUnsupportedError, match="bfloat16"):
        prepare_and_transform_humming_tensors(tensors, 64, 128, ws, num_experts=2, torch_dtype=torch.float16)


def test_process_input_refuses_quantization_and_hadamard():
    from humming.ops import process_input

    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ChordUnsupportedError):
        process_input(x, quant_mode="dynamic_token", quant_dtype="float8e4m3")
    with pytest.raises(ChordUnsupportedError, match="Hadamard"):
        process_input(x, hadamard_block_size=32)


def test_reference_backend_is_refused_on_gpu_machines(monkeypatch):
    from humming import _chord

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="without a CUDA device"):
        with _chord.cpu_reference_backend():
            pass


def test_cpu_tensors_without_reference_backend_get_a_clear_error():
    from humming import _chord

    with pytest.raises(ValueError, match="CUDA tensors"):
        _chord.gemm_contiguous(torch.zeros(1, 64, dtype=torch.bfloat16), None, None, None, None, "x")


def test_layer_rows_reserve_the_split_rows_workspaces_at_init(monkeypatch):
    """get_heuristics_config's rows call (once per layer, at vLLM's expert init) sizes the split-K
    workspace of every row up to its max_m on the layer's device; the open last row and the
    masked family are left to grow on first need; without a CUDA device nothing is reserved."""
    import torch

    from chord import ops
    from chord.schedule import Schedule
    from humming.config import GemmType, LayerConfig
    from humming.tune import get_heuristics_config

    calls = []
    monkeypatch.setattr(ops, "reserve_workspace",
                        lambda sched, n, rows, e, device=None: calls.append((sched, n, rows, e, device)) or 7)
    cfg = LayerConfig(shape_n=512, shape_k=7168, num_experts=384)  # TP8 gate_up: a split-K row at 1 token
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rows = get_heuristics_config(layer_config=cfg, gemm_type=GemmType.INDEXED)
    assert not calls  # no CUDA device: nothing to reserve
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert get_heuristics_config(layer_config=cfg, gemm_type=GemmType.INDEXED) == rows
    closed = [(cfg_["schedule"], hi) for _, hi, cfg_ in rows if hi < 2**31 - 1]
    assert [(c[0], c[2]) for c in calls] == closed and all(c[1] == 512 and c[3] == 384 for c in calls)
    assert all(c[4] is None for c in calls)  # the current CUDA device (chord.ops resolves it)
    assert any(Schedule.from_id(s).split_k > 1 for s, _ in closed)  # the row that needs it is among them
    calls.clear()
    get_heuristics_config(layer_config=LayerConfig(shape_n=4096, shape_k=7168, num_experts=48),
                          gemm_type=GemmType.GROUPED_MASKED)
    assert not calls
    get_heuristics_config(layer_config=cfg, gemm_type=GemmType.INDEXED, shape_m=4)  # one config: no reservation
    assert not calls
    get_heuristics_config(layer_config=cfg, gemm_type=GemmType.INDEXED, device="cpu")
    assert not calls
