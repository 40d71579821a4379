"""Compile every Triton kernel the CUDA path launches (dense and quantized GEMVs, the quantizers,
norms, RoPE + KV write, decode, cascade and extend attention) for sm90 (an H100/H200) on a
machine without a GPU, with the ptxas of Triton's wheel: the checks of Triton's compiler (types,
shapes, return values) that its interpreter does not make.

    TRITON_INTERPRET= python -m tests.unit.sm90_compile     # prints a line a kernel; exit 1 on a failure
"""

from __future__ import annotations

import sys

import triton
from gguf import GGMLQuantizationType as Q
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kvserve.model import _gemv_triton, _norm_triton
from kvserve.model.backends.triton_kernels import cascade, decode, extend, fused_decode, rope
from kvserve.model.quant import triton_gemv, triton_q8, triton_q8_pair, triton_q8_tile
from kvserve.model.quant.cuda_pack import FORMATS, SUB

TARGET = GPUTarget("cuda", 90, 32)
FLOAT_ARGS = {"eps", "qk_scale", "RS_EPS"}


def signature(fn, consts: dict, ptrs: dict) -> dict:
    """Every argument of ``fn``: constexpr (in ``consts``), a pointer (``*_ptr``: ``ptrs`` or *i32),
    float32 (``FLOAT_ARGS``) or int32."""
    out = {}
    for a in fn.arg_names:
        if a in consts:
            out[a] = "constexpr"
        elif a.endswith("_ptr"):
            out[a] = ptrs.get(a, "*i32")
        else:
            out[a] = "fp32" if a in FLOAT_ARGS else "i32"
    return out


def layout(q: Q, planes: bool = False) -> dict:
    bits, gs, zero, _, _ = FORMATS[q]
    return dict(BITS=6 if planes else bits, GS=gs, ZERO=zero, TWO_LEVEL=q in (Q.Q4_K, Q.Q5_K, Q.Q6_K),
                HAS_O=q in (Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q5_K), SIGNED=q == Q.Q6_K, SUB=SUB.get(q, 1))


def cases():
    act = {"xd_ptr": "*fp32", "xs_ptr": "*fp32", "x_ptr": "*bf16", "y_ptr": "*bf16", "p_ptr": "*fp32",
           "b_ptr": "*fp32", "w_ptr": "*bf16", "rs_ptr": "*fp32", "nr_ptr": "*bf16", "nw_ptr": "*fp32",
           "nq_ptr": "*i8", "nd_ptr": "*fp32", "ns_ptr": "*fp32", "nss_ptr": "*fp32"}
    for q, planes in ((Q.Q4_K, False), (Q.Q6_K, False), (Q.Q6_K, True), (Q.Q5_K, False), (Q.Q4_0, False),
                      (Q.Q8_0, False)):
        m = layout(q, planes)
        name = q.name + (" planes" if planes else "")
        tile = dict(m, HAS_BIAS=False, BM=1, BN=64, G=8, SPLIT=True, STAGES=1, SB=16, PRE=True, GDC=True,
                    TRIGGER=True, RSCALE=False, NRSP=1, NORM_OUT=False)
        yield f"{name} tiled GEMV", triton_q8_tile._tile_kernel, 2, act, dict(tile, ACT=0)
        if not planes:  # the output and down projections: the first half of the RMSNorm after them
            yield (f"{name} tiled GEMV + residual add, Σ s² and codes of s · w", triton_q8_tile._tile_kernel, 2, act,
                   dict(tile, ACT=0, NORM_OUT=True, BM=4))
            yield (f"{name} tiled GEMV scaled by the rows' 1 / rms", triton_q8_tile._tile_kernel, 2, act,
                   dict(tile, ACT=0, RSCALE=True, NRSP=128, BM=2))
        if q == Q.Q4_K and not planes:  # gate/up: act(g) * u quantized for down by the last program of a pair
            yield (f"{name} tiled GEMV + act(gate) * up + quantize", triton_q8_tile._tile_kernel, 2,
                   dict(act, aq_ptr="*i8", ad_ptr="*fp32", as_ptr="*fp32"), dict(tile, ACT=1))
            yield (f"{name} tiled GEMV scaled by 1 / rms + act(gate) * up + quantize", triton_q8_tile._tile_kernel, 1,
                   dict(act, aq_ptr="*i8", ad_ptr="*fp32", as_ptr="*fp32"), dict(tile, ACT=1, RSCALE=True, NRSP=64,
                                                                                 BN=32))
        if q == Q.Q6_K and not planes:  # Q4_K Q/K and Q6_K V in one launch
            k4 = {f"{k}_a": v for k, v in dict(layout(Q.Q4_K), HAS_BIAS=True, BN=64, G=8, SPLIT=True, STAGES=1).items()}
            k6 = {f"{k}_b": v for k, v in dict(m, HAS_BIAS=True, BN=32, G=16, SPLIT=True, STAGES=1).items()}
            yield ("Q4_K + Q6_K tiled GEMVs in one launch", triton_q8_pair._pair_kernel, 2,
                   dict(act, **{f"{n}{s}_ptr": t for s in "ab" for n, t in (("y", "*bf16"), ("b", "*fp32"),
                                                                            ("p", "*fp32"))}),
                   dict(k4, **k6, BM=1, SB=16, PRE=True, GDC=True, TRIGGER=True, RSCALE=False, NRSP=1))
            yield ("Q4_K + Q6_K tiled GEMVs in one launch, scaled by the rows' 1 / rms", triton_q8_pair._pair_kernel,
                   2, dict(act, **{f"{n}{s}_ptr": t for s in "ab" for n, t in (("y", "*bf16"), ("b", "*fp32"),
                                                                                ("p", "*fp32"))}),
                   dict(k4, **k6, BM=1, SB=16, PRE=True, GDC=True, TRIGGER=True, RSCALE=True, NRSP=128))
        if planes:
            continue
        base = dict(m, HAS_BIAS=True, BM=4, BN=128, SPLIT=True, STAGES=1, SB=16)
        yield f"{name} float GEMV", triton_gemv._gemv_kernel, 1, act, base
        yield f"{name} int8 GEMV", triton_q8._q8_kernel, 1, act, base
        yield f"{name} dequantize", triton_gemv._dequant_kernel, 4, act, dict(m, BN=128)
    bf16 = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "q_out_ptr", "out_ptr", "k_cache_ptr", "v_cache_ptr",
                                 "x_ptr", "r_ptr", "s_ptr", "y_ptr", "gu_ptr", "w_ptr", "b_ptr", "sum_ptr")}
    f32 = {n: "*fp32" for n in ("mid_o_ptr", "mid_lse_ptr", "cos_ptr", "sin_ptr", "p_ptr", "nw_ptr", "d_ptr")}
    ptrs = {**bf16, **f32}
    attn = dict(H=32, HKV=8, G=4, D=128, PS=16, PREC="tf32")
    yield "RMSNorm", _norm_triton._rms_norm_kernel, 8, ptrs, dict(BLOCK=4096)
    yield "residual add + RMSNorm", _norm_triton._add_rms_norm_kernel, 8, ptrs, dict(BLOCK=4096)
    yield "act(gate) * up", _norm_triton._act_mul_kernel, 4, ptrs, dict(GELU=False, BLOCK=1024)
    for pro in (0, 1, 2):
        yield (f"dense GEMV, prologue {pro}", _gemv_triton.gemv_kernel, 4, dict(ptrs, s_ptr="*bf16", q_ptr="*fp32"),
               dict(PRO=pro, GELU=False, HAS_BIAS=pro == 0, BM=1, BN=16, BK=256, SPLIT=True, SB=8, STAGES=1, PRE=1,
                    PDL=True))
    yield "RoPE + KV write", rope._rope_write_kernel, 2, ptrs, dict(H=32, HKV=8, D=128, RD=128, NEOX=False, PS=16,
                                                                     BLOCK_H=4, BLOCK_D=128)
    yield ("decode attention, splits", decode._decode_split_kernel, 4, ptrs,
           dict(attn, BLOCK_G=16, BLOCK_D=128, BLOCK_N=64, HAS_START=True))
    yield ("decode attention, merge", decode._decode_merge_kernel, 4, ptrs,
           dict(H=32, D=128, BLOCK_S=32, BLOCK_D=128, HAS_START=True))
    yield ("shared-prefix (cascade) attention", cascade._shared_prefix_kernel, 4, ptrs,
           dict(attn, BLOCK_M=64, BLOCK_N=64, BLOCK_D=128))
    yield "extend attention", extend._extend_kernel, 4, ptrs, dict(attn, BLOCK_M=64, BLOCK_N=64, BLOCK_D=128)
    qptrs = dict(ptrs, q_ptr="*i8", d_ptr="*fp32", s_ptr="*fp32", x_ptr="*bf16", w_ptr="*bf16")
    yield "quantize x", triton_q8._quant_x_kernel, 4, qptrs, dict(NB=16, WAIT=True, TRIGGER=True)
    yield ("residual add + RMSNorm + quantize", triton_q8._norm_quant_kernel, 16, dict(qptrs, sum_ptr="*bf16"),
           dict(BLOCK=4096, WAIT=True, TRIGGER=True))
    yield "act(gate) * up + quantize", triton_q8._act_quant_kernel, 4, qptrs, dict(GELU=False, BLOCK=1024, WAIT=True,
                                                                                    TRIGGER=True)
    for quant in (False, True):
        yield (f"decode attention{' + quantized output' if quant else ''}", fused_decode._decode_fused_kernel, 4,
               {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "mid_o_ptr": "*fp32", "mid_lse_ptr": "*fp32",
                "out_ptr": "*bf16", "xq_ptr": "*i8", "xd_ptr": "*fp32", "xs_ptr": "*fp32"},
               dict(H=32, HKV=8, G=4, D=128, PS=16, RD=128, NEOX=False, ROPE=True, BLOCK_G=16, GP=4, BLOCK_D=128,
                    BLOCK_N=32, BLOCK_S=32, PREC="tf32", PDL=True, TRIGGER=True, QUANT=quant))


def main() -> int:
    failed = 0
    for name, fn, warps, ptrs, consts in cases():
        consts = {k: v for k, v in consts.items() if k in fn.arg_names}
        try:
            triton.compile(ASTSource(fn, signature(fn, consts, ptrs), consts), target=TARGET,
                           options={"num_warps": warps})
            print(f"ok    {name}")
        except Exception as e:  # a compile error: printed, counted
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:2000]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
