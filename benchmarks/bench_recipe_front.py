"""The accuracy-versus-speed front of each format's recipes, measured here and written to the
table the compiler reads for its default recipe (``llmc/compiler/quantize/front.json``).

    python benchmarks/bench_recipe_front.py --build gemma-3-270m --quant int8,int4 \
        --calib-data /work/shared/data/tinyshakespeare.txt --out-dir /tmp/front --repeat 3 --write
    python benchmarks/bench_recipe_front.py --engine engines/a --engine engines/b --repeat 3

``--build MODEL`` first builds every recipe of each ``--quant`` (``llmc build MODEL --quant Q
--recipe R -o OUT_DIR/MODEL-Q-R``, ``--anchor none``: the anchor does not change the engine);
``--engine`` adds engines already built. Every engine's accuracy is its manifest's accuracy
report (the build's, against the unquantized model on the held-out text); its speed the S1 and
S16 scenarios of ``bench_e2e.py`` (all engines in one process, ``--repeat`` interleaved rounds,
medians). The recipe of an engine is read from its manifest (its resolved patterns and blocks
matched to the format's recipes, so engines built before a recipe had its name count too); one
that matches no recipe is printed but not written. ``--write`` replaces this host's and model's
rows in the table; ``tests/compiler/test_recipe_front.py`` checks that the compiler's default
is the recipe the table's front names.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_e2e  # noqa: E402

from llmc.compiler.quantize.formats import FORMATS  # noqa: E402
from llmc.compiler.quantize.front import FRONT_FILE, family_of  # noqa: E402

TABLE = Path(__file__).resolve().parents[1] / "llmc" / "compiler" / "quantize" / FRONT_FILE
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def host_name() -> str:
    """The CPU model and the ISA flags that change which kernels run, e.g. ``AMD EPYC (avx2)``."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if "model name" in ln), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return f"{model} ({', '.join(f for f in ISA_FLAGS if f in flags)})"


def recipe_of_engine(manifest: dict) -> str | None:
    """The recipe whose patterns and 8-bit blocks the engine was built with, else None."""
    spec = manifest["quantization"]["spec"]
    block = spec.get("weight_only8_block_size", spec["int4_block_size"])
    for recipe in FORMATS[manifest["quant"]].recipe_list():
        d = recipe.defaults
        same = (
            tuple(spec["weight_only8"]) == tuple(p for p in d.weight_only8.split(",") if p)
            and tuple(spec["exclude"]) == tuple(p for p in d.exclude.split(",") if p)
            and (not spec["weight_only8"] or block == d.weight_only8_block_size)
        )
        if same:
            return recipe.name
    return None


def build_recipes(args: argparse.Namespace) -> list[str]:
    """Build every recipe of every ``--quant`` of ``--build``; returns the engine dirs."""
    dirs = []
    for quant in args.quant.split(","):
        for recipe in FORMATS[quant].recipe_list():
            out = args.out_dir / f"{Path(args.build).name}-{quant}-{recipe.name}"
            if not (out / "manifest.json").exists():
                cmd = ["llmc", "build", args.build, "--quant", quant, "--recipe", recipe.name,
                       "--anchor", "none", "-o", str(out)]  # fmt: skip
                if args.calib_data:
                    cmd += ["--calib-data", args.calib_data]
                print("+", " ".join(cmd), flush=True)
                subprocess.run(cmd, check=True)
            dirs.append(str(out))
    return dirs


def rows_of(engines: list[str], results: dict, host: str) -> list[dict]:
    """One row per engine: its accuracy report, its median speed, its recipe (or None)."""
    rows = []
    for path in engines:
        manifest = json.loads((Path(path) / "manifest.json").read_text())
        report, speed = manifest["accuracy_report"], results["engines"][Path(path).name]
        rows.append({
            "family": family_of(manifest["target"]),
            "host": host,
            "model": manifest["model_id"],
            "quant": manifest["quant"],
            "recipe": recipe_of_engine(manifest),
            "mean_kl": round(report["mean_kl"], 5),
            "top1": round(report["top1_agreement"], 4),
            "s1_decode_tok_s": round(speed["s1"]["decode_tok_s"], 1),
            "s16_total_tok_s": round(speed["s16"]["total_tok_s"], 1),
            "s1_ttft_ms": round(speed["s1"]["ttft_ms"], 1),
            "s16_mean_ttft_ms": round(speed["s16"]["mean_ttft_ms"], 1),
            "engine": Path(path).name,
        })  # fmt: skip
    return rows


def write_table(rows: list[dict]) -> None:
    """Replace the table's rows of these hosts and models by ``rows`` (those with a recipe)."""
    table = json.loads(TABLE.read_text())
    measured = {(r["family"], r["host"], r["model"], r["quant"]) for r in rows}
    kept = [
        m
        for m in table["measurements"]
        if (m["family"], m["host"], m["model"], m["quant"]) not in measured
    ]
    table["measurements"] = kept + [r for r in rows if r["recipe"] is not None]
    TABLE.write_text(json.dumps(table, indent=2) + "\n")


def print_rows(rows: list[dict]) -> None:
    """The rows as a Markdown table."""
    cols = ("quant", "recipe", "engine", "mean_kl", "top1", "s1_decode_tok_s", "s1_ttft_ms")
    cols += ("s16_total_tok_s", "s16_mean_ttft_ms")
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")


def main() -> None:
    """Build (``--build``) and measure the engines, print the rows, write them (``--write``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", action="append", default=[], help="an engine directory")
    p.add_argument("--build", help="build every recipe of --quant of this model first")
    p.add_argument("--quant", default="int8,int4", help="formats whose recipes --build builds")
    p.add_argument("--calib-data", help="--calib-data of the builds")
    p.add_argument("--out-dir", type=Path, default=Path("engines/front"))
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    p.add_argument("--write", action="store_true", help=f"update {TABLE.name}")
    p.add_argument("--json", type=Path, help="write the rows and the speed rounds here")
    args = p.parse_args()
    engines = (build_recipes(args) if args.build else []) + args.engine
    e2e = argparse.Namespace(
        engine=engines, skip_hf=True, repeat=args.repeat, scenarios=["s1", "s16"],
        prompt_len=128, new_tokens=128, concurrency=16, prompt_style="text",
        num_speculative_tokens=4, disable_by_batch_size=None, json_schema=None,
    )  # fmt: skip
    results = bench_e2e.run_all(e2e)
    rows = rows_of(engines, results, host_name())
    print(host_name())
    print_rows(rows)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "speed": results}, indent=2))
    if args.write:
        write_table(rows)


if __name__ == "__main__":
    main()
