"""tools/sass_mix.py: the main K loop found in a SASS listing, its instruction classes per 256
weights, on a listing written here and on kernels built here (nvcc and cuobjdump, no GPU)."""
import pytest
from conftest import load_tool

from chord import jit
from chord.schedule import Schedule

mix_tool = load_tool("sass_mix")

LISTING = """
        /*0000*/                   S2R R0, SR_TID.X ;                        /* 0x0 */
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;     /* 0x0 */
        /*0020*/                   LOP3.LUT R1, R2, 0xf000f, R3, 0xea, !PT ; /* 0x0 */
        /*0030*/                   HADD2.BF16_V2 R1, R1, -136, -136 ;        /* 0x0 */
        /*0040*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;     /* 0x0 */
        /*0050*/               @P0 BRA 0x20 ;                                /* 0x0 */
        /*0060*/                   STG.E desc[UR4][R2.64], R4 ;              /* 0x0 */
        /*0070*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;     /* 0x0 */
        /*0080*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;     /* 0x0 */
        /*0090*/              @!P1 BRA 0x0 ;                                 /* 0x0 */
        /*00a0*/                   EXIT ;                                    /* 0x0 */
        /*00b0*/                   BRA 0xb0;                                 /* 0x0 */
"""


def test_the_innermost_mma_loop_is_the_main_loop_even_when_an_outer_one_holds_more():
    ins = mix_tool.parse(LISTING)
    assert [op for _, op, _ in ins][:2] == ["S2R", "HMMA.16816.F32.BF16"] and len(ins) == 12
    loop = mix_tool.main_loop(ins)  # the outer loop 0x0-0x90 holds 4 MMAs, the inner 0x20-0x50 one
    assert (loop.start, loop.end, loop.mma) == (0x20, 0x50, 1)
    assert loop.by_class() == {"dequant": 2, "mma": 1, "branch": 1}
    assert mix_tool.main_loop(mix_tool.parse(LISTING.replace("HMMA.16816.F32.BF16", "FFMA"))) is None


def test_mma_per_k_block_follows_the_tile():
    assert mix_tool.mma_per_k_block(Schedule.from_id("idx-m8n256k64-w4-s6-c1")) == 4 * 4  # 4 tiles x 4 k16 steps
    assert mix_tool.mma_per_k_block(Schedule.from_id("idx-m32n256k64-w4-s4-c1")) == 4 * 4 * 4  # x 4 token tiles
    assert mix_tool.mma_per_k_block(Schedule.from_id("idx-m8n256k64-w4-s6-c1-fo1")) == 16 + 4  # + 4 bias MMAs (one per k16 step)
    assert mix_tool.mma_per_k_block(Schedule.from_id("idx-m64n128k64-w4-s4-c1-wgmma-gs2-r8")) == 2 * 4


@pytest.mark.parametrize("schedule_id,fold", [("idx-m8n256k64-w4-s6-c1", False), ("idx-m8n256k64-w4-s6-c1-fo1", True),
                                              ("idx-m64n128k64-w4-s4-c1-wgmma-gs2-r8", False)])
def test_built_kernels_dequantize_one_swap16_word_per_256_weights(schedule_id, fold, tmp_path, monkeypatch):
    """One 32-bit word holds a lane's 8 codes of a 16 x 16 tile: 3 shifts, 4 LOP3 (mask and bf16
    exponent), 4 HADD2 (-136) and 4 HMUL2 (scale) per 256 weights; folded scales leave the LOP3s
    and move the scale to fp32 partial sums."""
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    if jit._cuobjdump() is None:
        pytest.fail("cuobjdump not found (the nvidia-cuda-cuobjdump dev dependency provides it)")
    row = mix_tool.mix(Schedule.from_id(schedule_id))
    per = row["per_256_weights"]
    k_blocks = row["k_blocks_per_iteration"]
    assert k_blocks >= 1 and k_blocks == int(k_blocks)  # the loop is whole K blocks (unrolled or not)
    if fold:
        assert 6 <= per["dequant"] < 8 and per["fp32"] > 0
    else:
        assert 15 <= per["dequant"] < 16 and per.get("fp32", 0) == 0
    assert 0.9 <= per["mma"] <= (1.3 if fold else 1.1)  # fold: + the bias MMAs
    assert row["total_per_256_weights"] > per["dequant"]
