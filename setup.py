"""The native CPU kernels (kvserve.model.quant._qmm, the linear layers; kvserve.model._attn, attention;
kvserve.model._ops_cpu, the layer's norms, RoPE with the KV write and activations): built by
``pip install`` (also editable).

Optional: where no C compiler is found the package installs without them and the quantized
CPU path falls back to torch's int4 kernel (the load log says which path runs), CPU attention to
torch's SDPA and the layer ops to the torch layer code."""

from setuptools import Extension, setup

QUANT = "src/kvserve/model/quant"
# qmm.c: the module and driver; one file per instruction set's kernels (qmm.h lists them)
SOURCES = ["qmm.c", "qmm_scalar.c", "qmm_avx2.c", "qmm_avx512.c", "qmm_amx.c"]
HEADERS = ["qmm.h", "qmm_simd.h", "qmm_cols.h"]
# no -march: each instruction set's functions carry their own target attributes and are chosen at
# run time; -ffp-contract=off keeps every path's float operations the same
FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-std=gnu11"]

setup(
    ext_modules=[
        Extension(
            "kvserve.model.quant._qmm",
            [f"{QUANT}/{f}" for f in SOURCES],
            depends=[f"{QUANT}/{f}" for f in HEADERS],
            extra_compile_args=FLAGS,
            extra_link_args=["-fopenmp"],
            optional=True,
        ),
        Extension(
            "kvserve.model._attn",
            [f"src/kvserve/model/{f}" for f in ("attn_cpu.c", "attn_scalar.c", "attn_avx512.c")],
            depends=["src/kvserve/model/attn_cpu.h"],
            extra_compile_args=FLAGS,
            extra_link_args=["-fopenmp", "-lm"],
            optional=True,
        ),
        Extension(
            "kvserve.model._ops_cpu",
            ["src/kvserve/model/ops_cpu.c"],
            depends=[f"{QUANT}/qmm.h"],
            # -fno-trapping-math lets the SiLU loop vectorize (selects instead of branches); no
            # result changes: it only drops the assumption that float exceptions trap
            extra_compile_args=FLAGS + ["-fno-trapping-math"],
            extra_link_args=["-fopenmp", "-lm"],
            optional=True,
        ),
    ]
)
