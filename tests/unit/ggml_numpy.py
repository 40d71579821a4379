"""numpy models of llama.cpp's CPU arithmetic (ggml-cpu built with gcc -march=native on an AVX-512
machine), written from its sources, for the native kernels' bit-for-bit tests: an exact float32
fma, ggml_v_expf / swiglu, the rope cache and rotation, and the quantized dot products' lanes."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

F32, F64 = np.float32, np.float64


def H(s: str) -> np.float32:
    """a C hex float literal"""
    return F32(float.fromhex(s))


def fma32(a, b, c) -> np.ndarray:
    """fma(a, b, c) of float32 arrays rounded once: a·b + c in float64 (a·b exact), and where that
    float64 sum is a tie between two float32s, the sum's rounding error (TwoSum) decides."""
    a, b, c = (np.asarray(v, F32) for v in (a, b, c))
    p = a.astype(F64) * b.astype(F64)
    t = p + c.astype(F64)
    bb = t - p
    e = (p - (t - bb)) + (c.astype(F64) - bb)  # t + e == p + c exactly
    r = t.astype(F32)
    lo = np.where(r.astype(F64) > t, np.nextafter(r, F32(-np.inf)), r)
    hi = np.nextafter(lo, F32(np.inf))
    tie = (lo.astype(F64) + hi.astype(F64)) / 2 == t
    fix = tie & (e != 0)
    return np.where(fix, np.where(e > 0, hi, lo), r).astype(F32)


def v_expf(x) -> np.ndarray:
    """ggml_v_expf (vec.h, AVX-512) lane by lane."""
    x = np.asarray(x, F32)
    with np.errstate(over="ignore", invalid="ignore"):
        z = fma32(x, H("0x1.715476p+0"), H("0x1.8p23"))
        n = (z - H("0x1.8p23")).astype(F32)
        b = fma32(-n, H("0x1.7f7d1cp-20"), fma32(-n, H("0x1.62e4p-1"), x))
        u = (b * b).astype(F32)
        j = fma32(fma32(fma32(H("0x1.0e4020p-7"), b, H("0x1.573e2ep-5")), u,
                        fma32(H("0x1.555e66p-3"), b, H("0x1.fffdb6p-2"))),
                  u, fma32(H("0x1.ffffecp-1"), b, F32(1.0)))
        res = np.ldexp(j.astype(F64), np.nan_to_num(n, nan=0).astype(np.int64)).astype(F32)  # scalef: one rounding
        big = ~(np.abs(n) <= 192)
        alt = np.where(n <= 0, F32(0), F32(np.inf))
        out = np.where(big & ~np.isnan(n), alt, res)
        return np.where(np.isnan(x), x, out).astype(F32)


_libm = ctypes.CDLL(ctypes.util.find_library("m"))
for _f in ("expf", "cosf", "sinf", "powf"):
    getattr(_libm, _f).restype = ctypes.c_float
_libm.expf.argtypes = _libm.cosf.argtypes = _libm.sinf.argtypes = [ctypes.c_float]
_libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]


def swiglu(g, u) -> np.ndarray:
    """ggml_vec_swiglu_f32 over rows: silu(g)·u, ggml_v_expf on each row's 16-element blocks and
    libm's expf on the tail."""
    g, u = np.asarray(g, F32), np.asarray(u, F32)
    n = g.shape[-1]
    nv = n - n % 16
    e = np.empty_like(g)
    e[..., :nv] = v_expf((F32(0) - g[..., :nv]).astype(F32))
    tail = g[..., nv:]
    e[..., nv:] = np.vectorize(lambda v: _libm.expf(float(-v)), otypes=[F32])(tail) if tail.size else tail
    with np.errstate(over="ignore"):
        return ((g / (F32(1) + e).astype(F32)).astype(F32) * u).astype(F32)


def rope_cache(positions, rope_dim: int, base: float, freq_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """ggml_rope_cache_init's cos/sin [len(positions), rope_dim // 2] (no YaRN, attn_factor 1)."""
    ts = F32(_libm.powf(base, F32(-2.0) / F32(rope_dim)))
    theta = np.asarray(positions).astype(F32)
    cos = np.empty((theta.size, rope_dim // 2), F32)
    sin = np.empty_like(cos)
    for i in range(rope_dim // 2):
        t = (F32(freq_scale) * theta).astype(F32)
        cos[:, i] = [_libm.cosf(float(v)) for v in t]
        sin[:, i] = [_libm.sinf(float(v)) for v in t]
        theta = (theta * ts).astype(F32)
    return cos, sin


def rope(x, cos, sin, neox: bool) -> np.ndarray:
    """rotate_pairs: x [T, H, D] by cos/sin [T, rd / 2]; x0' = fma(x0, c, −(x1·s)), x1' = fma(x0, s, x1·c)."""
    x = np.array(x, F32)
    rd = 2 * cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    if neox:
        x0, x1 = x[..., : rd // 2].copy(), x[..., rd // 2 : rd].copy()
        x[..., : rd // 2], x[..., rd // 2 : rd] = fma32(x0, c, -(x1 * s)), fma32(x0, s, x1 * c)
    else:
        x0, x1 = x[..., 0:rd:2].copy(), x[..., 1:rd:2].copy()
        x[..., 0:rd:2], x[..., 1:rd:2] = fma32(x0, c, -(x1 * s)), fma32(x0, s, x1 * c)
    return x


def hsum8(acc: np.ndarray) -> np.ndarray:
    """hsum_float_8 over the last axis (8 lanes): ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))."""
    a = np.asarray(acc, F32)
    r = (a[..., 4:] + a[..., :4]).astype(F32)
    r2 = (r[..., :2] + r[..., 2:]).astype(F32)
    return (r2[..., 0] + r2[..., 1]).astype(F32)
