"""The engine manifest: ``manifest.json``, what an engine is and what it needs (DESIGN §6).

The runtime reads it and checks it against this host (``llmc.engine.host.check_runs_here``)
before anything else in the engine directory is deserialized, so an engine built for another
target, ISA or backend version is refused with a message that says what to rebuild;
``verify_files`` then checks that the directory holds exactly the listed files, each of its
sha256. ``ManifestCore`` is what an engine manifest and a portable TensorRT stage
(``llmc.engine.stage``) both record.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path

from llmc.engine.files import MANIFEST_NAME, sha256_file, verify_engine_files
from llmc.engine.lora import ADAPTERS_DIR
from llmc.engine.provider import ProviderChoice
from llmc.errors import EngineCorruptError, EngineMismatchError, EngineNotFoundError
from llmc.version import __version__

FORMAT_VERSION = 1


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(kw_only=True)
class ManifestCore:
    """The facts an engine manifest and a portable stage share: the model, the build, the KV
    geometry and the serving limits, and the files (``shared_facts`` copies them)."""

    format_version: int
    llmc_version: str = __version__
    model_id: str  # short name: an alias ("gemma-3-270m") or a path's basename
    source: str  # the path or alias given to `llmc build`
    checkpoint_digest: str
    tokenizer_digest: str
    target: str  # a name of the target registry (llmc.engine.targets): "cpu", "sm80" ... "sm120"
    dtype: str  # "float32" | "bfloat16" (cpu); "float16" | "bfloat16" | "float32" (sm*)
    quant: str  # "none" | "int8" | "int4" | "fp8" ...
    kv_cache_dtype: str  # as the engine stores it: the compute dtype, "fp8" or "int8"
    max_seq_len: int  # tokens per sequence (prompt + generated)
    max_num_tokens: int  # tokens per step, over all sequences
    max_batch: int  # sequences per step
    block_size: int  # tokens per KV-cache block
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    plugin_versions: dict[str, str] = field(default_factory=dict)  # "llmc::PagedAttention": "1"
    build_config: dict = field(default_factory=dict)
    build_config_hash: str
    pass_report: dict[str, int] = field(default_factory=dict)  # pass name -> rewrites made
    quantization: dict | None = None  # quantized builds: what was quantized how, fast-path counts
    lora: dict | None = None  # --enable-lora: the adapter slots (``lora.LoRALayout.to_dict``)
    files: dict[str, str] = field(default_factory=dict)
    created_at: str = field(default_factory=_utc_now)  # ISO 8601, UTC


#: Fields of ``ManifestCore`` that describe the file they are in, not the model and its build.
_OWN_FIELDS = {"format_version", "llmc_version", "files", "created_at"}


def shared_facts(m: ManifestCore) -> dict:
    """The facts of ``m`` another manifest copies (every ``ManifestCore`` field but the format,
    the llmc version, the files and the creation time), by field name."""
    return {f.name: getattr(m, f.name) for f in fields(ManifestCore) if f.name not in _OWN_FIELDS}


@dataclass(kw_only=True)
class EngineManifest(ManifestCore):
    """Everything the runtime must know about an engine before loading it (``manifest.json``).

    Digests are sha256 hex strings. ``files`` maps each engine file's path relative to the
    engine directory (POSIX separators) to its digest; ``manifest.json`` itself is not listed.
    """

    format_version: int = FORMAT_VERSION
    isa: list[str]  # canonical ISA features the engine needs (cpu targets), see llmc.engine.isa
    arch: str  # machine architecture: "x86_64" or "aarch64"
    backend: str  # "onnxruntime" | "tensorrt" | "tensorrt-rtx"
    backend_version: str
    execution_provider: str  # e.g. "CPUExecutionProvider"
    execution_precision: str = "f32"  # compute precision asked of the provider: "f32" | "bf16"
    execution_provider_version: str | None = None  # plugin EP package version, if any
    # the hybrid provider: steps of at least this many new tokens run on OpenVINO's runtime
    execution_min_large_tokens: int | None = None
    provider_selection: dict | None = None  # cpu: candidates measured (provider_choice)
    accuracy_report: dict | None = None  # quantized builds: against the unquantized model
    # TensorRT engines: version, cuda_version, compute_capability, plan file, builder options,
    # optimization profiles, lint summary (``llmc.compiler.backends.tensorrt.engine_dir``).
    tensorrt: dict | None = None
    # Wall time and peak RSS of the build, whole and per stage (llmc.compiler.stages.build_stats).
    build_stats: dict | None = None
    # The draft engine built beside it (--draft): {"path", "quant", "manifest_sha256",
    # "accuracy_report"}; the runtime loads it for speculative decoding only if its manifest
    # still has that digest.
    draft: dict | None = None

    @property
    def provider(self) -> ProviderChoice:
        """The execution provider the engine runs on, as recorded."""
        return ProviderChoice(
            self.execution_provider, self.execution_precision, self.execution_min_large_tokens
        )


#: Fields added after format 1 shipped: a manifest without them reads as their default.
_OPTIONAL_FIELDS = {
    "tensorrt",
    "provider_selection",
    "build_stats",
    "draft",
    "execution_min_large_tokens",
    "lora",
}


def write_manifest(m: EngineManifest, engine_dir: str | Path) -> Path:
    """Write ``m`` as ``engine_dir/manifest.json`` atomically (temp file, fsync, os.replace).

    A reader never sees a half-written manifest; a failed write leaves no temp file. Returns the
    manifest's path. Raises TypeError if a dict field holds a value JSON cannot represent.
    """
    path = Path(engine_dir) / MANIFEST_NAME
    text = json.dumps(asdict(m), indent=2) + "\n"
    fd, partial = tempfile.mkstemp(prefix=f".{MANIFEST_NAME}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return path


def read_manifest(engine_dir: str | Path) -> EngineManifest:
    """Read and validate ``engine_dir/manifest.json``.

    Unknown keys are ignored (a newer llmc of the same format may add optional fields).

    Raises:
        EngineNotFoundError: no such directory, or no manifest.json in it.
        EngineCorruptError: the file is not valid JSON, or a field is missing or mistyped.
        EngineMismatchError: the manifest's format_version is not FORMAT_VERSION.
    """
    engine_dir = Path(engine_dir)
    path = engine_dir / MANIFEST_NAME
    if not engine_dir.is_dir():
        raise EngineNotFoundError(
            f"engine directory {engine_dir} does not exist; build one with "
            "`llmc build MODEL --arch cpu` or check the path"
        )
    if not path.is_file():
        raise EngineNotFoundError(
            f"{engine_dir} has no {MANIFEST_NAME}: it is not an llmc engine directory, or its "
            "build was interrupted; rebuild it with `llmc build MODEL --arch cpu`"
        )
    return parse_manifest(path.read_bytes(), str(path))


def parse_manifest(raw: bytes, where: str) -> EngineManifest:
    """Parse and validate the bytes of a ``manifest.json`` (``where`` names it in errors).

    Raises EngineCorruptError and EngineMismatchError as ``read_manifest``.
    """
    broken = f"{where} is corrupt"
    todo = "rebuild the engine with `llmc build` or re-pull it"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise EngineCorruptError(f"{broken}: not valid JSON ({error}); {todo}") from error
    if not isinstance(data, dict):
        raise EngineCorruptError(f"{broken}: expected a JSON object, got {type(data).__name__}")
    if data.get("format_version") != FORMAT_VERSION:
        raise_format_mismatch(data.get("format_version"), where)
    hints = typing.get_type_hints(EngineManifest)
    values = {}
    for f in fields(EngineManifest):
        if f.name not in data and f.name in _OPTIONAL_FIELDS:
            continue
        if f.name not in data:
            raise EngineCorruptError(f"{broken}: field {f.name!r} is missing; {todo}")
        if not _has_type(data[f.name], hints[f.name]):
            raise EngineCorruptError(
                f"{broken}: field {f.name!r} should be {_type_name(hints[f.name])}, "
                f"got {data[f.name]!r}; {todo}"
            )
        values[f.name] = data[f.name]
    return EngineManifest(**values)


def file_digests(engine_dir: str | Path) -> dict[str, str]:
    """sha256 (hex) of every file under ``engine_dir``, by POSIX relative path, sorted.

    Skips ``manifest.json`` and the manifest's temp files. Reads in 1 MiB chunks, so memory stays
    flat for multi-GB engine files; about 1-2 s per GB.
    """
    root = Path(engine_dir)
    digests = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if relative == MANIFEST_NAME or relative.startswith(f".{MANIFEST_NAME}."):
            continue
        digests[relative] = sha256_file(path)
    return digests


def verify_files(m: EngineManifest, engine_dir: str | Path, hash_files: bool = True) -> None:
    """Check that ``engine_dir`` holds exactly the files ``m.files`` lists, each inside it and,
    with ``hash_files``, of its sha256 (``llmc.engine.files.verify_engine_files``). A recorded
    draft engine's folder (``m.draft["path"]``) is left to its own manifest, which is checked
    against the recorded digest when the draft is loaded; a LoRA engine's stored adapters
    (``lora/``) are checked when loaded (and by the registry, which signs them).

    Raises:
        EngineCorruptError: the manifest lists no files; a listed path leaves the directory; a
            file is missing, unlisted, or differs from its digest (the message names the file,
            both digests, and what to rebuild).
    """
    nested = ((m.draft["path"],) if m.draft else ()) + ((ADAPTERS_DIR,) if m.lora else ())
    verify_engine_files(m.files, engine_dir, damaged_hint(m), hash_files, nested)


def damaged_hint(m: EngineManifest) -> str:
    """What to do about a damaged engine: rebuild it (the command) or re-pull it."""
    return f"the engine is damaged; rebuild it with {rebuild_command(m, m.target)} or re-pull it"


def raise_format_mismatch(version: object, where: object) -> None:
    """Raise EngineMismatchError for a manifest (named by ``where``) of format ``version``."""
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise EngineMismatchError(
            f"{where}: engine format {version} is newer than this llmc {__version__} reads "
            f"(format {FORMAT_VERSION}); upgrade llmc, or rebuild the engine with this version"
        )
    raise EngineMismatchError(
        f"{where}: engine format {version!r} is not the format this llmc {__version__} reads "
        f"({FORMAT_VERSION}); rebuild the engine with `llmc build`"
    )


def rebuild_command(m: ManifestCore, arch: str) -> str:
    """The ``llmc build`` command (in backquotes) that rebuilds ``m``'s engine for ``arch``."""
    command = ["llmc", "build", m.source or m.model_id, "--arch", arch]
    if m.dtype != "float32":
        command += ["--dtype", m.dtype]
    if m.quant != "none":
        command += ["--quant", m.quant]
    return f"`{shlex.join(command)}`"


def _has_type(value: object, hint: object) -> bool:
    """Whether a JSON value fits a field's type hint (int, str, list[X], dict[K, V], X | None)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_has_type(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list) and all(_has_type(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _has_type(k, args[0]) and _has_type(v, args[1]) for k, v in value.items()
        )
    return isinstance(value, typing.cast(type, hint))


def _type_name(hint: object) -> str:
    return getattr(hint, "__name__", None) or str(hint)
