"""``BuildConfig``: options grouped by concern, set by flat name, from a flat or grouped YAML file,
the command line winning; what the manifest records and hashes."""

from __future__ import annotations

import pytest

from llmc.cli import build_parser
from llmc.compiler.config.build_config import GROUPS, BuildConfig, flatten_options
from llmc.errors import BuildConfigError


def test_of_sets_options_by_flat_name_in_their_groups():
    config = BuildConfig.of(quant="int8", block_size=4, arch="sm90", registry="r")
    assert (config.quantization.quant, config.export.block_size) == ("int8", 4)
    assert (config.target.arch, config.destination.registry) == ("sm90", "r")
    assert config.source.dtype == "bfloat16"  # the GPU default; float32 on cpu
    assert BuildConfig.of().source.dtype == "float32"
    with pytest.raises(BuildConfigError, match="unknown build option"):
        BuildConfig.of(block=4)


def test_yaml_takes_flat_and_grouped_keys_and_the_command_line_wins(tmp_path):
    yaml_file = tmp_path / "b.yaml"
    yaml_file.write_text(
        "max-seq-len: 512\nquantization:\n  quant: int8\n  smoothquant-alpha: 0.7\n"
        "target: {threads: 4}\n"
    )
    config = BuildConfig.from_sources(str(yaml_file), {"threads": 3})
    assert config.export.max_seq_len == 512
    assert (config.quantization.quant, config.quantization.smoothquant_alpha) == ("int8", 0.7)
    assert config.target.threads == 3


@pytest.mark.parametrize(
    "text, message",
    [
        ("quantization: {arch: sm90}\n", r"quantization\.arch \(a target option\)"),
        ("export: {blocks: 4}\nfoo: 1\n", r"unknown build option\(s\) export\.blocks, foo"),
        ("block_size: 4\nexport: {block-size: 8}\n", "sets --block-size twice"),
        ("target: sm90\n", "target must be a mapping"),
    ],
)
def test_yaml_refuses_unknown_misplaced_and_repeated_options(tmp_path, text, message):
    yaml_file = tmp_path / "b.yaml"
    yaml_file.write_text(text)
    with pytest.raises(BuildConfigError, match=message):
        BuildConfig.from_sources(str(yaml_file), {})


def test_to_dict_is_grouped_and_reads_back():
    config = BuildConfig.of(quant="int4", int4_block_size=32, output="e", timing_cache="t")
    d = config.to_dict()
    assert list(d) == list(GROUPS)
    assert d["quantization"]["int4_block_size"] == 32 and d["destination"]["output"] == "e"
    assert BuildConfig.of(**flatten_options(d)) == config


def test_hash_skips_where_the_engine_goes_and_what_does_not_shape_it():
    base = BuildConfig.of().hash()
    assert BuildConfig.of(output="o", registry="r", timing_cache="t").hash() == base
    assert BuildConfig.of(builder_opt_level=5).hash() == base  # TensorRT-only, on cpu
    assert (
        BuildConfig.of(arch="sm90").hash()
        != BuildConfig.of(arch="sm90", hardware_compat="ampere+").hash()
    )
    assert BuildConfig.of(block_size=8).hash() != base


def test_validate_checks_each_group_and_the_rules_across_groups():
    with pytest.raises(BuildConfigError, match="--int4-block-size 48 is not one of 32, 64, 128"):
        BuildConfig.of(int4_block_size=48).validate()
    with pytest.raises(BuildConfigError, match="--calib-seq-len must be >= 2"):
        BuildConfig.of(calib_seq_len=1).validate()
    with pytest.raises(BuildConfigError, match="--kv-cache-dtype fp8 needs FP8 tensor cores"):
        BuildConfig.of(kv_cache_dtype="fp8", arch="sm86").validate()
    with pytest.raises(BuildConfigError, match="--dtype float16 needs a GPU target"):
        BuildConfig.of(dtype="float16").validate()


def test_build_help_groups_the_flags_by_concern():
    build = build_parser()._subparsers._group_actions[0].choices["build"]
    groups = {g.title: [a.dest for a in g._group_actions] for g in build._action_groups}
    assert set(GROUPS) <= set(groups)
    assert groups["export"] == [
        "max_seq_len",
        "allow_long_max_seq_len",
        "max_num_tokens",
        "max_batch",
        "block_size",
        "enable_lora",
        "max_loras",
        "max_lora_rank",
        "lora_target_modules",
    ]
    assert "quant" in groups["quantization"] and "output" in groups["destination"]
