"""Builds llmc's C kernels; everything else about the package is in pyproject.toml.

The paged-attention kernel is a plain shared library (no PyInit), loaded with ctypes by
``llmc/plugins/paged_attention/cpu.py``. Built with ``-march=native``: like a CPU engine, the
build is for the host it runs on. ``pip install -e .`` or ``python setup.py build_ext --inplace``
puts it next to cpu.py.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "llmc/plugins/paged_attention/paged_attention.c"
# Keep equal to COMPILE_FLAGS in cpu.py.
COMPILE_FLAGS = ["-O3", "-fopenmp-simd", "-pthread", "-march=native", "-fno-math-errno"]
# Embedded so cpu.py can tell an extension built from an older source and rebuild instead.
SOURCE_SHA256 = hashlib.sha256((Path(__file__).parent / SOURCE).read_bytes()).hexdigest()

setup(
    ext_modules=[
        Extension(
            "llmc.plugins.paged_attention._paged_attention_cpu",
            sources=[SOURCE],
            define_macros=[("LLMC_PA_SOURCE_SHA256", f'"{SOURCE_SHA256}"')],
            extra_compile_args=COMPILE_FLAGS,
            extra_link_args=["-pthread"],
        )
    ]
)
