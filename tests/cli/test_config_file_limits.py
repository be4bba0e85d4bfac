"""``--config`` files and the errors about their values stay small: a YAML alias bomb, an
oversized file or a deeply nested one is refused before anything is built from it, and an error
that echoes a value shows a bounded piece of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmc.cli import main
from llmc.compiler.config.build_config import BuildConfig
from llmc.config_file import MAX_CONFIG_BYTES, read_config_file
from llmc.errors import BuildConfigError, EngineConfigError
from llmc.runtime.server.serve_config import ServeConfig


class ConfigError(Exception):
    pass


def _alias_bomb(key: str) -> str:
    """``key`` set to a list holding nine levels of nine aliases each: 9^9 strings once every
    alias is expanded, in nine lines."""
    lines = [f"{key}:", "  - &l0 [" + ", ".join(["lol"] * 9) + "]"]
    for level in range(1, 9):
        lines.append(f"  - &l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_alias_bomb_is_refused_naming_the_file_and_the_rule(tmp_path: Path) -> None:
    path = _write(tmp_path, _alias_bomb("port"))
    with pytest.raises(ConfigError, match="aliases") as e:
        read_config_file(path, "serve config", ConfigError)
    assert str(path) in str(e.value)
    assert len(str(e.value)) < 1000


def test_alias_bomb_is_refused_by_both_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_file = _write(tmp_path, _alias_bomb("int4_method"))
    with pytest.raises(BuildConfigError, match="aliases"):
        BuildConfig.from_sources(str(build_file), {})
    assert main(["build", "--config", str(build_file), "--print-config"]) == 2
    assert "aliases" in capsys.readouterr().err

    serve_file = _write(tmp_path, _alias_bomb("port"))
    with pytest.raises(EngineConfigError, match="aliases"):
        ServeConfig.from_sources(serve_file, {})
    assert main(["serve", "engine", "--config", str(serve_file), "--print-config"]) == 2
    assert "aliases" in capsys.readouterr().err


def test_an_alias_to_a_node_that_holds_it_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="recursive alias"):
        read_config_file(_write(tmp_path, "port: &a [*a]\n"), "serve config", ConfigError)


def test_a_small_anchor_still_loads(tmp_path: Path) -> None:
    text = (
        "allowed_origins: &origins [https://a.example, https://b.example]\n"
        "again: *origins\n"
        "limits: &limits {max_n: 4, max_logprobs: 5}\n"
        "merged: {<<: *limits, max_n: 2}\n"
    )
    assert read_config_file(_write(tmp_path, text), "serve config", ConfigError) == {
        "allowed_origins": ["https://a.example", "https://b.example"],
        "again": ["https://a.example", "https://b.example"],
        "limits": {"max_n": 4, "max_logprobs": 5},
        "merged": {"max_n": 2, "max_logprobs": 5},
    }
    config = ServeConfig.from_sources(
        _write(tmp_path, "allowed_origins: &o [https://a.example]\nport: 9001\n"), {}
    )
    assert (config.http.allowed_origins, config.http.port) == (["https://a.example"], 9001)


def test_an_oversized_file_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "model: " + "m" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes") as e:
        read_config_file(path, "build config", ConfigError)
    assert str(path) in str(e.value)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("port: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested deeper"),
        ("port: " + "1" * 5_000 + "\n", "digits"),  # Python refuses the int: a ValueError
        ("day: 2024-13-01\n", "month"),
    ],
    ids=["deep nesting", "huge integer", "impossible date"],
)
def test_values_yaml_cannot_build_are_errors_not_crashes(
    tmp_path: Path, text: str, rule: str
) -> None:
    with pytest.raises(ConfigError, match=rule):
        read_config_file(_write(tmp_path, text), "serve config", ConfigError)


def test_errors_echo_a_bounded_piece_of_a_huge_value() -> None:
    huge_list, huge_text = ["x" * 100] * 100_000, "y" * 1_000_000
    for values in ({"int4_method": huge_list}, {"int4_method": huge_text}):
        with pytest.raises(BuildConfigError, match="--int4-method") as e:
            BuildConfig.from_sources(None, values)
        assert len(str(e.value)) < 200
    with pytest.raises(BuildConfigError, match="--smoothquant-alpha-grid") as e:
        BuildConfig.from_sources(None, {"smoothquant_alpha_grid": huge_text})
    assert len(str(e.value)) < 200
    for values in ({"port": huge_list}, {"log_level": huge_text}):
        with pytest.raises(EngineConfigError) as e:
            ServeConfig.from_sources(None, values)
        assert len(str(e.value)) < 200
