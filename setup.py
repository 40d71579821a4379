"""The native CPU kernels (kvserve.model.quant._qmm): built by ``pip install`` (also editable).

Optional: where no C compiler is found the package installs without them and the quantized
CPU path falls back to torch's int4 kernel (the load log says which path runs)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvserve.model.quant._qmm",
            ["src/kvserve/model/quant/qmm.c"],
            # no -march: each instruction set's functions carry their own target attributes and
            # are chosen at run time; -ffp-contract=off keeps every path's float operations the same
            extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off", "-std=gnu11"],
            extra_link_args=["-fopenmp"],
            optional=True,
        )
    ]
)
