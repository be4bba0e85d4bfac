"""The quantization formats: one module each, one registry.

Each module holds one ``FORMAT`` with the members of ``llmc.quant.protocol.QuantFormat``; adding
a format is one new module and one entry in ``FORMATS`` below. ``BuildConfig`` offers the
registered formats as ``--quant`` choices, takes their defaults, and checks their target rules;
the Q/DQ rewrite, the CPU and TensorRT lowerings and the fast-path check ask the format.
"""

from __future__ import annotations

from collections.abc import Iterator

from llmc.compiler.quantize.formats import fp8, int4, int8, int8_weight_only, mxfp8, none, nvfp4
from llmc.quant.protocol import QuantFormat

FORMATS: dict[str, QuantFormat] = {
    f.name: f
    for f in (
        none.FORMAT,
        fp8.FORMAT,
        int8.FORMAT,
        int4.FORMAT,
        nvfp4.FORMAT,
        mxfp8.FORMAT,
        int8_weight_only.FORMAT,
    )
}
#: The format ``--weight-only8`` gives its modules.
WEIGHT_ONLY8 = int8_weight_only.FORMAT.name


class QuantChoices:
    """The ``--quant`` choices: the offered formats of ``FORMATS``, read at each use (so a
    format registered after import is a choice too)."""

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, f in FORMATS.items() if f.offered])

    def __contains__(self, name: object) -> bool:
        return name in FORMATS and FORMATS[name].offered

    def __len__(self) -> int:
        return len(list(iter(self)))

    def __repr__(self) -> str:
        return f"QuantChoices({', '.join(self)})"


def format_of(name: str) -> QuantFormat:
    """The registered format ``name``; raises ValueError naming the known ones."""
    if name not in FORMATS:
        raise ValueError(f"unknown quantization format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name]
