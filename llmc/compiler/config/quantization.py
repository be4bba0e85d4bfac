"""``QuantOptions``: the quantization format (``--quant``), its recipe (``--recipe``) and its
knobs.

Unset options a recipe sets (``--exclude``, ``--weight-only8``, ``--weight-only8-block-size``,
``--calib-method``) take the recipe's values (``FormatDefaults``), resolved by the properties
below; an unset ``--recipe`` is the one the recorded front names for the target
(``BuildConfig`` resolves it, ``llmc.compiler.quantize.front``).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmc.compiler.config.option import check_choices, option
from llmc.compiler.quantize.formats import FORMATS, QuantChoices
from llmc.compiler.quantize.search.accuracy_target import AccuracyTarget
from llmc.config_file import short_repr
from llmc.errors import BuildConfigError
from llmc.quant.protocol import FormatDefaults, Recipe

QUANTS = QuantChoices()  # the offered formats of the registry, llmc.compiler.quantize.formats
KV_CACHE_DTYPES = ("auto", "fp8", "int8")
INT4_METHODS = ("awq", "rtn")
WEIGHT_ROUNDINGS = ("gptq", "nearest")
INT4_BLOCK_SIZES = (32, 64, 128)
WEIGHT_ONLY8_BLOCK_SIZES = (32, 64, 128)


def recipe_of(quant: str, name: str | None) -> Recipe | None:
    """Recipe ``name`` of format ``quant`` (None: its first), None when the registry lacks
    the format or the format the recipe."""
    if quant not in FORMATS:
        return None
    try:
        return FORMATS[quant].recipe(name)
    except KeyError:
        return None


def format_defaults(quant: str, recipe: str | None = None) -> FormatDefaults:
    """What recipe ``recipe`` (None: the first) of format ``quant`` sets (empty defaults for a
    name the registry lacks)."""
    found = recipe_of(quant, recipe)
    return found.defaults if found is not None else FormatDefaults()


def per_quant(default: str) -> str:
    """``default``'s value in every recipe of every quantizing --quant choice, for an
    option's help."""
    values = [
        (f"{q} {r.name}", getattr(r.defaults, default))
        for q in QUANTS
        if FORMATS[q].quantizes
        for r in FORMATS[q].recipe_list()
    ]
    return "; ".join(f"{q}: {v or 'none'}" for q, v in values)


def _recipes_help() -> str:
    return "; ".join(
        f"{q}: " + ", ".join(f"{r.name} ({r.summary})" for r in FORMATS[q].recipe_list())
        for q in QUANTS
        if FORMATS[q].quantizes
    )


def _kv_auto() -> str:
    """Which --quant choices store the KV cache in another dtype for ``auto``, for the help."""
    by_dtype: dict[str, list[str]] = {}
    for q in QUANTS:
        if format_defaults(q).kv_cache_dtype != "auto":
            by_dtype.setdefault(format_defaults(q).kv_cache_dtype, []).append(q)
    return "; ".join(f"{kv} with --quant {' and '.join(qs)}" for kv, qs in by_dtype.items())


def _patterns(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.split(",") if p.strip())


@dataclass(frozen=True)
class QuantOptions:
    """Quantization: the Q/DQ format, the KV-cache storage, and the format's options."""

    quant: str = option(
        "none",
        "quantization as Q/DQ nodes: "
        + ", ".join(f"{q} ({FORMATS[q].summary})" for q in QUANTS if FORMATS[q].quantizes),
        QUANTS,
    )
    recipe: str | None = option(
        None,
        "the named recipe of --quant (the modules it quantizes otherwise or keeps float, its "
        "observer and blocks): " + _recipes_help() + ". Default: the recipe the measured "
        "accuracy-versus-speed front names for the target (README's quantization guide)",
    )
    kv_cache_dtype: str = option(
        "auto",
        f"KV cache storage: fp8, int8, or auto: the compute dtype ({_kv_auto()})",
        KV_CACHE_DTYPES,
    )
    int4_block_size: int = option(128, "int4: input channels per weight scale", INT4_BLOCK_SIZES)
    weight_only8_block_size: int | None = option(
        None,
        "8-bit weight-only: input channels per weight scale; default: the recipe's "
        "(32, llama.cpp's Q8_0 block)",
        WEIGHT_ONLY8_BLOCK_SIZES,
    )
    int4_method: str = option("awq", "int4: AWQ activation-aware scales or plain RTN", INT4_METHODS)
    weight_rounding: str = option(
        "gptq",
        "how quantized weights are rounded to their grid: gptq (GPTQ error compensation with "
        "the calibration inputs' Hessian; same scales and Q/DQ nodes) or nearest",
        WEIGHT_ROUNDINGS,
    )
    weight_only8: str | None = option(
        None,
        "comma-separated module patterns given 8-bit weight-only (block-wise) weights instead "
        "of --quant's format; default per --quant: " + per_quant("weight_only8") + " ('' for none)",
    )
    smoothquant_alpha: float = option(0.5, "int8: SmoothQuant migration strength in [0, 1]")
    smoothquant_alpha_grid: str = option(
        "",
        "int8: comma-separated alphas in [0, 1] (or 'auto' for 0, 0.1, ..., 1) to choose from per "
        "layer, by the layer's output error on the calibration sample; replaces "
        "--smoothquant-alpha ('' for none)",
    )
    exclude: str | None = option(
        None,
        "comma-separated module patterns kept unquantized (fnmatch on checkpoint names, e.g. "
        "'lm_head,*.down_proj'); default per --quant: " + per_quant("exclude") + " ('' for none)",
    )
    accuracy_target: str | None = option(
        None,
        "METRIC=VALUE (top1=0.95, kl=0.01, ppl_change=0.02): choose each decoder layer's format "
        "among --quant's, its fallbacks (8-bit weight-only, ...) and float, the cheapest "
        "assignment whose held-out accuracy keeps the target (per-layer sensitivity on the "
        "calibration text); fails the build when only float would",
    )
    draft: str | None = option(
        None,
        "also build a draft engine of the same checkpoint in this --quant format into "
        "DIR/draft, for speculative decoding (llmc serve --speculative-config "
        '\'{"method": "draft", "num_speculative_tokens": 4}\'); cpu targets',
        QUANTS,
    )

    @property
    def quantizes(self) -> bool:
        """Whether ``--quant`` rewrites the graph (every format but ``none``)."""
        return FORMATS[self.quant].quantizes

    @property
    def target(self) -> AccuracyTarget | None:
        """``--accuracy-target`` parsed (None when unset). Raises BuildConfigError as
        ``AccuracyTarget.parse``."""
        return None if self.accuracy_target is None else AccuracyTarget.parse(self.accuracy_target)

    @property
    def defaults(self) -> FormatDefaults:
        """What ``--recipe`` of ``--quant`` sets (unset: the format's first recipe; a
        ``BuildConfig`` resolves it for its target)."""
        return format_defaults(self.quant, self.recipe)

    @property
    def weight_only8_blocks(self) -> int:
        """``--weight-only8-block-size``; unset means the recipe's."""
        block = self.weight_only8_block_size
        return self.defaults.weight_only8_block_size if block is None else block

    @property
    def weight_only8_patterns(self) -> tuple[str, ...]:
        """``--weight-only8`` split into patterns; unset means the default of ``--quant``."""
        return _patterns(
            self.defaults.weight_only8 if self.weight_only8 is None else self.weight_only8
        )

    @property
    def exclude_patterns(self) -> tuple[str, ...]:
        """``--exclude`` split into fnmatch patterns; unset means the default of ``--quant``."""
        return _patterns(self.defaults.exclude if self.exclude is None else self.exclude)

    @property
    def smoothquant_alphas(self) -> tuple[float, ...]:
        """``--smoothquant-alpha-grid`` as floats (empty: one fixed alpha). Raises
        BuildConfigError for a value that is not a number in [0, 1]."""
        text = self.smoothquant_alpha_grid.strip()
        if text == "auto":
            return tuple(i / 10 for i in range(11))
        alphas = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            try:
                alpha = float(part)
            except ValueError:
                alpha = -1.0
            if not 0.0 <= alpha <= 1.0:
                raise BuildConfigError(
                    "--smoothquant-alpha-grid takes numbers in [0, 1] or 'auto', "
                    f"got {short_repr(part)}"
                )
            alphas.append(alpha)
        return tuple(alphas)

    def validate(self) -> None:
        """Raise BuildConfigError for an unknown choice or an alpha outside [0, 1]."""
        check_choices(self)
        if self.recipe is not None and recipe_of(self.quant, self.recipe) is None:
            names = [r.name for r in FORMATS[self.quant].recipe_list()]
            raise BuildConfigError(
                f"--recipe {short_repr(self.recipe)} is not a recipe of --quant {self.quant}; "
                f"its recipes: {', '.join(names)}"
            )
        _ = self.smoothquant_alphas  # BuildConfigError if the grid does not parse
        if self.target is not None and not self.quantizes:
            raise BuildConfigError(
                "--accuracy-target chooses among a format's fallbacks: give a --quant "
                "(fp8, int8, int4, ...)"
            )
        if not 0.0 <= self.smoothquant_alpha <= 1.0:
            raise BuildConfigError(
                f"--smoothquant-alpha must be in [0, 1], got {self.smoothquant_alpha}"
            )
