"""``DestinationOptions``: where the built engine is written and published."""

from __future__ import annotations

from dataclasses import dataclass

from llmc.compiler.config.option import option


@dataclass(frozen=True)
class DestinationOptions:
    """Where the engine goes: its directory, and the registry it is published into."""

    output: str | None = option(
        None,
        "engine directory (default: engines/<model>-<arch>-<dtype>-<quant>)",
        aliases=("-o",),
    )
    registry: str | None = option(
        None, "after the build, publish the engine into this registry root (e.g. engines)"
    )

    def validate(self) -> None:
        """Nothing to check: any path is a destination."""
