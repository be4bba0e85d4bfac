"""Quantization numerics and the format protocol, below calibration and the compiler.

``grids``: symmetric grids (INT8, INT4, FP8 E4M3) and weights on them; ``microscaling``:
NVFP4 and MXFP8 block scales, weights and activations on them; ``protocol``: what a
quantization format says about itself (``QuantFormat``) and the options it reads
(``QuantSpec``). Numpy and torch only: calibration algorithms import this, never the compiler.
The formats themselves, one module each, are ``llmc.compiler.quantize.formats``.
"""
