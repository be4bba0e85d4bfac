"""``llmc``: the command line. A thin layer over the Python API: parse, call, print."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from llmc.errors import LlmcError


def _add_build(sub) -> None:
    import inspect

    from llmc.compiler.config.build_config import GROUPS
    from llmc.compiler.config.source import SourceOptions
    from llmc.option_flags import add_option_flags

    p = sub.add_parser(
        "build",
        help="build an engine from a checkpoint",
        description="Build an engine from a checkpoint. Every option below may also be set in a "
        "--config YAML file, by its name (block_size: 8) or under its group (export: "
        "{block_size: 8}); flags win.",
    )
    p.add_argument(
        "model", nargs="?", default=argparse.SUPPRESS, help=_help(SourceOptions, "model")
    )
    for title, group in GROUPS.items():
        about = " ".join(inspect.getdoc(group).split("\n\n")[0].split())
        add_option_flags(p.add_argument_group(title, about), group, skip=("model",))
    p.add_argument("--config", help="YAML file setting any build option; flags win")
    p.add_argument("--print-config", action="store_true", help="print the resolved config, exit")
    p.add_argument(
        "--from",
        dest="from_stage",
        metavar="STAGE",
        default=None,
        help="finish a portable stage (written by `llmc build --arch smXX` on a host without "
        "TensorRT or the GPU) into a TensorRT engine on this GPU builder",
    )
    _add_log_format(p)


def _add_log_format(p) -> None:
    from llmc.compiler.stages.progress import LOG_FORMATS

    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="auto",
        help="progress: auto (bars on a terminal; elsewhere, e.g. in CI, one line per stage "
        "and step with elapsed time and peak RSS, at least once a minute), text, or json lines",
    )


def _help(cls, name: str) -> str:
    f = next(f for f in fields(cls) if f.name == name)
    return f"{f.metadata['help']} (default: {f.default})".replace("%", "%%")


def _run_build(args: argparse.Namespace) -> int:
    from llmc.compiler.backends.registry import backend_for
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig
    from llmc.compiler.stages.progress import BuildProgress

    skip = ("command", "config", "print_config", "from_stage", "log_format")
    cli = {k: v for k, v in vars(args).items() if k not in skip}
    if args.from_stage is not None:
        from llmc.compiler.backends.tensorrt.finish import finish_stage
        from llmc.engine.stage import read_stage

        target = read_stage(args.from_stage, verify=False).target
        print(backend_for(target).why(target), file=sys.stderr)
        with BuildProgress(args.log_format) as progress:
            result = finish_stage(args.from_stage, cli, progress.stage)
        print(f"engine: {result.engine_dir}")
        return 0
    config = BuildConfig.from_sources(args.config, cli)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
        return 0
    print(backend_for(config.target.arch).why(config.target.arch), file=sys.stderr)
    with BuildProgress(args.log_format) as progress:
        result = build(config, progress)
    print(result.format())
    return 0


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate completions for prompts with an engine")
    p.add_argument("engine", help="engine directory, or a model id in the registry")
    _add_registry_option(p)
    p.add_argument("prompts", nargs="+", help="one or more prompts")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    p.add_argument("--n", type=int, default=1, help="completions per prompt")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    constrained = p.add_mutually_exclusive_group()
    constrained.add_argument(
        "--json-schema", metavar="FILE", help="the output is JSON valid against this schema"
    )
    constrained.add_argument("--regex", help="the output matches this regular expression")
    constrained.add_argument(
        "--grammar", metavar="FILE", help="the output is in this grammar (Lark or GBNF)"
    )


def _structured_outputs(args: argparse.Namespace):
    """``--json-schema`` / ``--regex`` / ``--grammar`` as a constraint, or None."""
    from llmc.runtime.structured.structured_outputs import StructuredOutputsParams

    if args.json_schema:
        return StructuredOutputsParams(json=_read_text("--json-schema", args.json_schema))
    if args.regex:
        return StructuredOutputsParams(regex=args.regex)
    if args.grammar:
        return StructuredOutputsParams(grammar=_read_text("--grammar", args.grammar))
    return None


def _read_text(option: str, path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{option} {path}: {exc.strerror}") from exc


def _run_generate(args: argparse.Namespace) -> int:
    from llmc.runtime.llm import LLM
    from llmc.runtime.sampling_params import SamplingParams

    engine = _engine_dir(args)
    llm = LLM(engine.path, expected_manifest_sha256=engine.manifest_sha256)
    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        n=args.n,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=args.stop,
        structured_outputs=_structured_outputs(args),
    )
    if args.chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params)
    else:
        outputs = llm.generate(list(args.prompts), params)
    for prompt, out in zip(args.prompts, outputs, strict=True):
        for o in out.outputs:
            if args.json:
                print(
                    json.dumps(
                        {
                            "prompt": prompt,
                            "index": o.index,
                            "text": o.text,
                            "token_ids": o.token_ids,
                            "finish_reason": o.finish_reason,
                        }
                    )
                )
            else:
                print(f"{prompt}{o.text}\n")
    return 0


def _add_serve(sub) -> None:
    from llmc.runtime.server.serve_flags import add_arguments

    p = sub.add_parser(
        "serve",
        help="serve an engine with the OpenAI-compatible API",
        description="Serve ENGINE with the OpenAI-compatible API until SIGTERM, which drains. "
        "Every option below may also be set in a --config YAML file by its name "
        "(max_num_seqs: 8); flags win.",
    )
    p.add_argument("engine", help="engine directory, or a model id in the registry")
    _add_registry_option(p)
    add_arguments(p)


def _run_serve(args: argparse.Namespace) -> int:
    from llmc.runtime.server.api_server import serve
    from llmc.runtime.server.serve_flags import from_args

    config = from_args(args)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(config.redacted().to_dict(), sort_keys=False), end="")
        return 0
    engine = _engine_dir(args)
    if config.replicas.enabled:
        from llmc.deploy.ray.run import serve_replicas as serve
    serve(
        engine.path,
        config,
        model_id=engine.model_name,
        expected_manifest_sha256=engine.manifest_sha256,
    )
    return 0


def _add_verify(sub) -> None:
    from llmc.compiler.verify.config import VerifyConfig

    p = sub.add_parser(
        "verify",
        help="compare an engine with the unquantized model it was built from",
        description="Re-run the accuracy report of ENGINE against the unquantized graph of its "
        "checkpoint, and compare every engine segment with the unquantized one through "
        "Polygraphy. Exit code 0 when the logits segment passes at --rtol/--atol, 1 when not. "
        "Quantized and bfloat16 engines differ by design: give them looser tolerances.",
    )
    p.add_argument("engine", help="engine directory")
    for f in fields(VerifyConfig):
        kind = {"int": int, "float": float}.get(str(f.type).removesuffix(" | None"), str)
        p.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f.name,
            type=kind,
            default=f.default,
            help=f.metadata["help"] + ("" if f.default is None else f" (default: {f.default})"),
        )
    _add_log_format(p)


def _run_verify(args: argparse.Namespace) -> int:
    from rich.console import Console

    from llmc.compiler.stages.progress import BuildProgress
    from llmc.compiler.verify.config import VerifyConfig
    from llmc.compiler.verify.verify import result_tables, verify_engine

    config = VerifyConfig(**{f.name: getattr(args, f.name) for f in fields(VerifyConfig)})
    with BuildProgress(args.log_format) as progress:
        result = verify_engine(args.engine, config, progress)
    console = Console()
    for part in result_tables(result):
        console.print(part)
    return 0 if result.passed else 1


def _add_bench(sub) -> None:
    from llmc.bench.command import add_arguments

    p = sub.add_parser(
        "bench",
        help="load-test an OpenAI-compatible server: TTFT, TPOT, ITL, throughput",
        description="Send requests to an OpenAI-compatible server (llmc serve, vLLM, llama.cpp "
        "server ...) and report TTFT, TPOT, inter-token latency, end-to-end latency (p50/p95/p99) "
        "and throughput, with vLLM's definitions. Exit code 1 when any request failed.",
    )
    add_arguments(p)


def _run_bench(args: argparse.Namespace) -> int:
    from llmc.bench.command import run

    return run(args)


def _add_registry_option(p) -> None:
    from llmc.registry.cli import TRUSTED_STATE_HELP, default_root

    p.add_argument(
        "--registry",
        default=default_root(),
        help="registry a model id is resolved in (default: $LLMC_REGISTRY or engines)",
    )
    p.add_argument(
        "--verify-key",
        default=None,
        help="with a model id: serve only an engine signed by this Ed25519 public key (PEM)",
    )
    p.add_argument("--trusted-state", metavar="DIR", help=TRUSTED_STATE_HELP)


def _engine_dir(args: argparse.Namespace):
    from llmc.registry.cli import trusted_state
    from llmc.registry.resolve import engine_dir_for

    trusted = trusted_state(args.trusted_state)
    return engine_dir_for(args.engine, args.registry, args.verify_key, trusted)


def _add_registry(sub) -> None:
    from llmc.registry.cli import add_parser

    add_parser(sub)


def _run_registry(args: argparse.Namespace) -> int:
    from llmc.registry.cli import run

    return run(args)


def _add_inspect(sub) -> None:
    p = sub.add_parser(
        "inspect",
        help="describe an engine, portable stage or .onnx file and run the TensorRT lint",
        description="Exit code 0 when the TensorRT lint passes (or does not apply), 1 when not.",
    )
    p.add_argument("path", help="engine directory, portable stage directory, or .onnx file")
    p.add_argument("--target", default=None, help="GPU arch the lint checks (default: its own)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _run_inspect(args: argparse.Namespace) -> int:
    from llmc.compiler.verify.inspect import inspect_path

    result = inspect_path(args.path, args.target)
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.format())
    return 0 if result.passed else 1


def _add_lora(sub) -> None:
    from llmc.runtime.lora.cli import add_parser

    add_parser(sub)


def _run_lora(args: argparse.Namespace) -> int:
    from llmc.runtime.lora.cli import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    """The ``llmc`` argument parser with every subcommand. Building it imports only base
    dependencies (pyproject's ``dependencies``), so ``llmc <command> --help`` works after
    ``pip install -e .`` alone."""
    parser = argparse.ArgumentParser(prog="llmc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_build(sub)
    _add_generate(sub)
    _add_serve(sub)
    _add_verify(sub)
    _add_bench(sub)
    _add_registry(sub)
    _add_inspect(sub)
    _add_lora(sub)
    return parser


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[list[str]]:
    """Every command path of ``parser``, itself first: [], [build], ..., [registry, ls], ..."""
    paths = [list(prefix)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths += command_paths(child, (*prefix, name))
    return paths


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``llmc`` command; returns the process exit code."""
    args = build_parser().parse_args(argv)
    run = {
        "build": _run_build,
        "generate": _run_generate,
        "serve": _run_serve,
        "verify": _run_verify,
        "bench": _run_bench,
        "registry": _run_registry,
        "inspect": _run_inspect,
        "lora": _run_lora,
    }[args.command]
    try:
        return run(args)
    except (LlmcError, ValueError) as e:  # ValueError: a bad prompt or sampling parameter
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
