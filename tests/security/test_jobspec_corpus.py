"""A corpus of hostile job.toml files: each is refused by ``gsched submit``, naming the file and what
is wrong in it, and nothing is stored.

The files live in ``jobspecs/``; ``EXPECT`` holds the words each error must contain (the field, or for
files that are not TOML at all, why).  The CLI runs in-process (``scheduler.cli.main.main``) against a real
server: the same code path as the command, without a Python start per file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.cli.main import main
from tests.security.conftest import World

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent / "jobspecs"
NOT_TOML = ["not valid TOML"]
EXPECT: dict[str, list[str]] = {
    "01_bad_toml_unclosed_table": NOT_TOML + ["line 2"],
    "02_bad_toml_duplicate_key": NOT_TOML,
    "03_bad_toml_unterminated_string": NOT_TOML,
    "04_bad_toml_dotted_key_redefines_value": NOT_TOML,
    "05_nul_byte_in_string": NOT_TOML,
    "06_not_utf8": ["not UTF-8"],
    "07_empty": ["name", "data", "required"],
    "08_ranks_string": ["resources.ranks", "integer"],
    "09_ranks_negative": ["resources.ranks", "greater than or equal to 1"],
    "10_ranks_zero": ["resources.ranks"],
    "11_ranks_beyond_64_bits": ["resources.ranks", "less than or equal to 512"],
    "12_gpus_per_rank_huge": ["resources.gpus_per_rank"],
    "13_ranks_float": ["resources.ranks", "integer"],
    "14_ranks_boolean": ["resources.ranks", "integer"],
    "15_epochs_boolean": ["train.epochs"],
    "16_batch_size_array": ["train.batch_size"],
    "17_resources_not_a_table": ["resources"],
    "18_data_array_of_tables": ["data"],
    "19_unknown_key_command": ["command", "unknown key"],
    "20_unknown_table_env": ["env", "unknown key"],
    "21_unknown_nested_script": ["train.script", "unknown key"],
    "22_name_traversal": ["name", "pattern"],
    "23_dataset_traversal": ["data.dataset"],
    "24_dataset_absolute_path": ["data.dataset"],
    "25_dataset_dotdot_inside": ["data.dataset", ".."],
    "26_name_unicode": ["name", "pattern"],
    "27_name_rtl_override": ["name", "pattern"],
    "28_name_emoji": ["name", "pattern"],
    "29_name_newline": ["name", "pattern"],
    "30_name_empty": ["name", "pattern"],
    "31_name_shell": ["name", "pattern"],
    "32_name_very_long": ["name", "pattern"],
    "33_dataset_very_long": ["data.dataset"],
    "34_dataset_integer": ["data.dataset", "string"],
    "35_deep_nesting_inline_tables": ["train.opts", "unknown key"],
    "36_deep_nesting_arrays": ["train.opts", "unknown key"],
    "37_lr_nan": ["train.lr"],
    "38_lr_infinite": ["train.lr"],
    "39_seed_beyond_64_bits": ["train.seed"],
    "40_crop_padding_negative": ["train.crop_padding"],
    "41_backend_injection": ["train.backend"],
    "42_time_negative": ["limits.time"],
    "43_time_huge_duration": ["limits.time"],
    "44_time_boolean": ["limits.time"],
    "45_max_restarts_float": ["limits.max_restarts"],
    "46_spec_is_an_array_table": ["name"],
    "47_deep_nesting_beyond_recursion": NOT_TOML + ["nested too deeply"],
    # Values TOML has and JSON lacks, or that Python's parser cannot convert: refused on the client.
    "48_deep_nesting_dotted_key_1500": ["train.k0.k1", "nested more than 500 deep"],
    "49_integer_5000_digits": NOT_TOML + ["too long"],
    "50_seed_datetime": ["train.seed", "date or time"],
    "51_time_99_99": ["limits.time", "seconds must be below 60"],
    "52_time_sixty_minutes": ["limits.time", "minutes and seconds must be below 60"],
    "53_epochs_local_date": ["train.epochs", "date or time"],
    # [run]: the user's own command (scheduler/protocol/runspec.py).
    "54_run_empty_command": ["run.command", "must not be empty"],
    "55_run_blank_string_command": ["run.command", "must not be empty"],
    "56_run_relative_workdir": ["run.workdir", "absolute path"],
    "57_run_reserved_env_rank": ["run.env", "RANK is set by gsched"],
    "58_run_reserved_env_gsched": ["run.env", "GSCHED_SHARD_LIST is set by gsched"],
    "59_run_beside_train": ["train", "[run]", "never both"],
    "60_run_command_not_strings": ["run.command", "list of strings"],
    "61_run_unknown_key": ["run.cmd", "unknown key"],
    "62_run_env_value_integer": ["run.env.THREADS", "string"],
    "63_run_grace_negative": ["run.grace_s", "greater than or equal to 0"],
    "64_run_env_bad_name": ["run.env", "not a variable name"],
    "65_run_not_a_table": ["run"],
    "66_run_empty_first_item": ["run.command", "must not be empty"],
    "67_run_workdir_integer": ["run.workdir", "string"],
}


def test_the_corpus_is_all_here() -> None:
    assert sorted(p.stem for p in HERE.glob("*.toml")) == sorted(EXPECT) and len(EXPECT) >= 30


@pytest.mark.parametrize("stem", sorted(EXPECT))
def test_hostile_spec_is_refused_naming_file_and_field(world: World, stem: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = HERE / f"{stem}.toml"
    before = stored(world)
    code = main(["--server", world.url, "--token", world.tokens["owner"], "submit", str(path)])
    err = capsys.readouterr().err
    assert code != 0, stem
    assert err.startswith(f"gsched submit: {path}: "), err[:300]
    for word in EXPECT[stem]:
        assert word in err, f"{stem}: {word!r} not in {err[:500]!r}"
    assert "Traceback" not in err and len(err) < 4000, "the message stays readable"
    assert stored(world) == before


def stored(world: World) -> list[tuple[object, ...]]:
    """The jobs as stored (priorities move with age; what was submitted does not)."""
    return [(j["id"], j["name"], j["user"], j["state"], j["submitted_at"]) for j in world.jobs()]
