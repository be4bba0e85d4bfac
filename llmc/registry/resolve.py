"""Resolve a model id to the one engine that fits this host, or say why none does.

Every engine of the model is a candidate. A candidate is refused when it fails an asked filter
(``--target``, ``--quant``, ``--dtype``), when its manifest does not run here (target, machine,
ISA features, backend and execution-provider versions: the same check the loader makes,
``engine_loader.check_runs_here``), when its manifest is damaged, or when ``--verify-key`` is
given and its signature (over the whole entry, ``signing.verify_entry``) does not verify, or
(with a verify key) when the registry was rolled back or the entry expired (rollback.py). Of
those left, the one built for the most ISA features wins (the most specific engine this host
runs: avx512 over avx2), then the highest release version (a re-signed engine over the one it
replaces), then the newest (``created_at`` compared as times, not as strings).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmc.engine.host import check_runs_here
from llmc.engine.isa import detect_host_isa
from llmc.engine.manifest import parse_manifest
from llmc.errors import EngineError, NoMatchingEngineError, RegistryError, SignatureError
from llmc.registry.index import IndexEntry
from llmc.registry.integrity import check_checkout
from llmc.registry.local import LocalRegistry
from llmc.registry.rollback import VersionCheck, check_versions, expiry_reason
from llmc.registry.signing import verify_entry
from llmc.registry.trusted_state import TrustedState


@dataclass(frozen=True)
class Selection:
    """Filters a user may add to a model id; None accepts any value."""

    target: str | None = None
    quant: str | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class Candidate:
    """An engine considered by ``resolve``; ``reason`` says why it was refused (None: fits)."""

    entry: IndexEntry
    reason: str | None


@dataclass(frozen=True)
class ResolvedEngine:
    """An engine directory to load, the model name to serve it as (None: the directory's), and
    the sha256 its ``manifest.json`` had when it was checked (None: a directory given by path,
    not checked). Pass that digest to the loader (``expected_manifest_sha256``) so a manifest
    swapped between resolving and loading is refused."""

    path: Path
    model_name: str | None
    manifest_sha256: str | None = None


def judge(
    entries: list[IndexEntry],
    manifest_bytes: Callable[[IndexEntry], bytes],
    selection: Selection | None = None,
    verify_key: str | Path | None = None,
    runs_here: Callable | None = None,
    versions: VersionCheck | None = None,
) -> list[Candidate]:
    """Judge each entry: best fitting first, then the refused ones with their reasons.

    ``manifest_bytes(entry)`` returns the entry's manifest checked against its digest and
    against the entry's fields (raising ``EngineError`` when it cannot), so a signature over
    the entry (``verify_entry``: every field and the manifest digest) covers that manifest;
    ``runs_here(manifest)`` raises ``EngineMismatchError`` for an engine this host cannot run
    (default: the loader's check). With ``verify_key``, an expired entry is refused, and with
    ``versions`` (``check_versions``) every entry of a rolled-back model.
    """
    runs_here = runs_here or check_runs_here
    judged = []
    for entry in entries:
        reason = _filter_reason(entry, selection or Selection())
        if reason is None:
            what = f"{entry.model_id}@{entry.short_id}"
            try:
                raw = manifest_bytes(entry)
                manifest = parse_manifest(raw, f"manifest of {what}")
                runs_here(manifest)
                if verify_key is not None:
                    verify_entry(entry, verify_key, what)
            except (EngineError, SignatureError) as error:
                reason = str(error)
        if reason is None and versions is not None:
            reason = versions.reason(entry)
        if reason is None and verify_key is not None:
            reason = expiry_reason(entry)
        judged.append(Candidate(entry, reason))
    fitting = [c for c in judged if c.reason is None]
    fitting.sort(
        key=lambda c: (len(c.entry.isa), c.entry.version or 0, c.entry.created), reverse=True
    )
    return fitting + [c for c in judged if c.reason is not None]


def choose(model: str, candidates: list[Candidate], where: str) -> IndexEntry:
    """The best fitting candidate.

    Raises:
        NoMatchingEngineError: none fits; the message lists every candidate and its reason.
    """
    if candidates and candidates[0].reason is None:
        return candidates[0].entry
    if not candidates:
        raise NoMatchingEngineError(
            f"no engine of {model!r} in {where}; build one with `llmc build {model} --registry "
            "PATH` or pull one with `llmc registry pull`"
        )
    lines = [f"no engine of {model!r} in {where} fits this host ({host_description()}):"]
    lines += [f"  {describe(c.entry)}: {c.reason}" for c in candidates]
    raise NoMatchingEngineError("\n".join(lines))


def resolve_local(
    registry,
    model: str,
    selection: Selection | None = None,
    verify_key: str | Path | None = None,
    trusted: TrustedState | None = None,
) -> IndexEntry:
    """The entry of a ``LocalRegistry`` that ``model`` resolves to on this host (see module);
    with ``verify_key`` and ``trusted``, a rolled-back registry is refused (``versions_seen``).

    Raises:
        NoMatchingEngineError: none fits; the message gives every candidate's reason.
        RegistryError: the trusted state is damaged (see ``TrustedState``).
    """
    found = registry.find(model)
    versions = versions_seen(registry, found, verify_key, trusted)
    candidates = judge(found, registry.manifest_bytes, selection, verify_key, versions=versions)
    return choose(model, candidates, str(registry.root))


def versions_seen(
    registry, found: list[IndexEntry], verify_key: str | Path | None, trusted: TrustedState | None
) -> VersionCheck | None:
    """``check_versions`` of every entry of the models in ``found`` at ``registry`` (a
    ``LocalRegistry`` or ``S3Registry``), or None without a verify key or a trusted state."""
    if verify_key is None or trusted is None or not found:
        return None
    models = {e.model_id for e in found}
    siblings = [e for e in registry.entries() if e.model_id in models]
    return check_versions(siblings, verify_key, trusted, registry.identity)


def engine_dir_for(
    model_or_dir: str,
    registry_root: str | Path,
    verify_key: str | Path | None = None,
    trusted: TrustedState | None = None,
) -> ResolvedEngine:
    """What ``llmc serve``/``generate`` load: ``model_or_dir`` itself when it is a path (it
    exists or holds a ``/``), else the checkout of the engine it resolves to in the registry,
    its manifest checked against the (signature-verified, with ``verify_key``) manifest blob;
    the loader checks every engine file against that manifest, and refuses a manifest that no
    longer hashes to ``manifest_sha256`` when given it. With ``verify_key`` and ``trusted``, a
    rolled-back registry is refused (rollback.py).

    Raises:
        EngineCorruptError: the checkout's manifest is not the registry's (``check_checkout``).
        NoMatchingEngineError: the model has no engine that fits this host (or, with
            ``verify_key``, none whose signature verifies, none unexpired, or, with ``trusted``
            too, the registry was rolled back).
        RegistryError: it is neither a path nor a model in the registry, or ``verify_key`` is
            given with a path.
    """

    path = Path(model_or_dir)
    if path.exists() or "/" in model_or_dir:  # a path: the loader says what is wrong with it
        if verify_key is not None:
            raise RegistryError(
                f"--verify-key checks engines resolved from the registry, and {model_or_dir} is "
                "a directory; publish it (`llmc registry push DIR --sign-key KEY`) and give its "
                "model id"
            )
        return ResolvedEngine(path, None)
    registry = LocalRegistry(Path(registry_root))
    if not registry.find(model_or_dir):
        raise RegistryError(
            f"{model_or_dir!r} is neither an engine directory nor a model in the registry "
            f"{registry.root}; `llmc registry ls` lists the models there"
        )
    entry = resolve_local(registry, model_or_dir, verify_key=verify_key, trusted=trusted)
    checkout = registry.checkout(entry)
    check_checkout(checkout, entry.manifest_digest, f"{entry.model_id}@{entry.short_id}")
    return ResolvedEngine(checkout, entry.model_id, entry.manifest_digest)


def describe(entry: IndexEntry) -> str:
    """One line naming an entry: ``model@id target/isa dtype quant backend version``."""
    isa = "+".join(entry.isa) or "-"
    return (
        f"{entry.model_id}@{entry.short_id} {entry.target}/{isa} {entry.dtype} {entry.quant} "
        f"{entry.backend} {entry.backend_version}"
    )


def host_description() -> str:
    """This host as the resolver sees it, e.g. ``cpu-avx512 x86_64, onnxruntime 1.31.1``."""
    import onnxruntime as ort

    host = detect_host_isa()
    return f"{host.name} {host.arch}, onnxruntime {ort.__version__}"


def _filter_reason(entry: IndexEntry, selection: Selection) -> str | None:
    for name in ("target", "quant", "dtype"):
        wanted = getattr(selection, name)
        if wanted is not None and getattr(entry, name) != wanted:
            return f"{name} is {getattr(entry, name)}, asked for --{name} {wanted}"
    return None
