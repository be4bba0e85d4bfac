"""Quantization of engine graphs into explicit, symmetric Q/DQ nodes (DESIGN §5)."""
