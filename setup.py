"""Builds the optional C kernels; everything else about the package is in pyproject.toml.

The kernels are plain C (no torch headers), so building needs only a C compiler and the
Python headers. ``-march=native``: the wheel is built where it runs (``pip install .``);
set ``DRAFTWISE_PORTABLE_BUILD=1`` to build for any x86-64 instead.
"""

import os
import platform

from setuptools import Extension, setup

flags = ["-O3", "-ffp-contract=fast", "-fno-math-errno", "-std=c11", "-pthread"]
if os.environ.get("DRAFTWISE_PORTABLE_BUILD") != "1" and platform.machine() in ("x86_64", "AMD64"):
    flags.append("-march=native")

setup(
    ext_modules=[
        Extension(
            "draftwise._cpu_kernels",
            sources=["core/csrc/module.c", "core/csrc/paged_attention.c", "core/csrc/elementwise.c",
                     "core/csrc/gemm_bf16.c", "core/csrc/markov.c",
                     "core/csrc/threadpool.c",
                     "core/csrc/gemm_quant.c", "core/csrc/gemm_quant_avx2.c",
                     "core/csrc/gemm_quant_avx512.c",
                     "core/csrc/quant_pack.c", "core/csrc/gemm_nvfp4.c",
                     "core/csrc/gemm_nvfp4_avx2.c", "core/csrc/decoder_stack.c",
                     "core/csrc/gguf_strings.c"],
            depends=["core/csrc/kernels.h", "core/csrc/vec.h", "core/csrc/threadpool.h",
                     "core/csrc/gemm_bf16.h", "core/csrc/paged_attention_products.h",
                     "core/csrc/markov_screen.h",
                     "core/csrc/quant.h", "core/csrc/quant_layout.h", "core/csrc/quant_codes.h",
                     "core/csrc/gemm_quant_avx512_body.h"],
            extra_compile_args=flags,
            extra_link_args=["-pthread"],
            optional=True,  # no compiler: the torch attention path runs instead
        )
    ]
)
