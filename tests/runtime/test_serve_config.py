"""``llmc serve``'s options: one `ServeConfig` field each, set by flags or a ``--config`` YAML
file (the command line wins), parsed by the real ``llmc`` parser."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from llmc.cli import build_parser, main
from llmc.errors import EngineConfigError
from llmc.runtime.server.limits import RequestLimits
from llmc.runtime.server.serve_config import EngineLimits, ServeConfig
from llmc.runtime.server.serve_flags import from_args

YAML = """\
port: 9001
max-num-seqs: 8
allowed_origins: [https://yaml.example]
enable_prefix_caching: false
kv_cache_memory: 1
max_n: 4
shutdown_timeout: 5
"""


def _config(tmp_path: Path, text: str, *flags: str) -> ServeConfig:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    return from_args(build_parser().parse_args(["serve", "engine", "--config", str(path), *flags]))


def test_yaml_sets_options_and_the_command_line_wins(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        YAML,
        *("--port", "9002", "--max-n", "2"),
        *("--allowed-origins", "https://a.example", "--allowed-origins", "https://b.example"),
    )
    assert (config.http.port, config.http.host) == (9002, "127.0.0.1")  # flag; default
    assert config.http.allowed_origins == ["https://a.example", "https://b.example"]
    assert config.engine == EngineLimits(
        max_num_seqs=8, kv_cache_memory=1.0, enable_prefix_caching=False
    )
    assert config.engine.kv_cache_bytes == 1 << 30
    assert config.limits == RequestLimits(max_n=2)
    assert config.lifecycle.shutdown_timeout == 5.0
    assert config.lifecycle.max_waiting == 64


def test_no_prefix_caching_flag_wins_over_the_file(tmp_path: Path) -> None:
    on = _config(tmp_path, "enable_prefix_caching: true\n")
    assert on.engine.enable_prefix_caching
    assert not _config(
        tmp_path, "enable_prefix_caching: true\n", "--no-prefix-caching"
    ).engine.enable_prefix_caching


def test_without_a_file_or_flags_the_defaults_apply() -> None:
    assert from_args(build_parser().parse_args(["serve", "engine"])) == ServeConfig()


def test_print_config_prints_what_config_reads_back(tmp_path: Path, capsys) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(YAML + "api_key: sesame\n")
    assert main(["serve", "engine", "--config", str(path), "--print-config", "--port", "1"]) == 0
    printed = capsys.readouterr().out
    assert "sesame" not in printed
    values = yaml.safe_load(printed)
    assert values["api_key"] == "<redacted>" and values["port"] == 1
    again = tmp_path / "printed.yaml"
    again.write_text(printed)
    expected = _config(tmp_path, YAML, "--port", "1", "--api-key", "<redacted>")
    assert ServeConfig.from_sources(again, {}) == expected


def test_an_unknown_key_is_refused_naming_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("max_num_seq: 8\ncolour: blue\nport: 9000\n")
    assert main(["serve", "engine", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown serve option(s) colour, max_num_seq" in err and "max_num_seqs" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port: '80'\n", "port must be an integer, got '80'"),
        ("max_n: 2.5\n", "max_n must be an integer, got 2.5"),
        ("allowed_origins: '*'\n", "allowed_origins must be a list of strings or null"),
        ("enable_prefix_caching: 0\n", "enable_prefix_caching must be true or false"),
        ("max_n: 0\n", "max_n must be an integer >= 1"),
        ("port: 70000\n", "port must be in 0..65535"),
        ("kv_cache_memory: 0\n", "kv_cache_memory must be a positive number of GiB"),
        ("max_decode_wait_steps: -1\n", "max_decode_wait_steps must be >= 0"),
        ("log_level: loud\n", "log_level must be one of"),
        ("- port\n", "must hold a mapping"),
        ("grpc_port: -1\n", "grpc_port must be in 0..65535, got -1"),
        ("num_replicas: 0\n", "replica counts must be >= 1, got num_replicas=0"),
        ("num_replicas: 2\nmax_replicas: 4\n", "give num_replicas, or min_replicas/max_replicas"),
        ("min_replicas: 3\nmax_replicas: 2\n", "min_replicas 3 is above max_replicas 2"),
        ("target_ongoing_requests: 0\n", "target_ongoing_requests must be > 0, got 0.0"),
        ("upscale_delay_s: -1\n", "must be >= 0: upscale_delay_s=-1.0"),
    ],
)
def test_bad_values_are_refused_naming_the_option(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    with pytest.raises(EngineConfigError, match=message.replace("(", r"\(").replace("*", r"\*")):
        ServeConfig.from_sources(path, {})


def test_every_option_is_one_documented_flag() -> None:
    groups = [getattr(ServeConfig(), g.name) for g in dataclasses.fields(ServeConfig)]
    options = [f for g in groups for f in dataclasses.fields(g)]
    names = [f.name for f in options]
    assert len(names) == len(set(names)), "option names must be unique across the groups"
    assert all(f.metadata["help"] for f in options)
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    dests = {a.dest for a in serve._actions}
    assert set(names) <= dests
    help_text = serve.format_help()
    for title in ("network and auth", "engine limits", "request limits", "admission and shutdown"):
        assert f"{title}:" in help_text
    assert "--no-prefix-caching" in help_text and "--kv-cache-memory GIB" in help_text
