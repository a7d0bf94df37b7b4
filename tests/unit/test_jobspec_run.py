"""job.toml's [run] table: the user's own command, stored with the job and read back the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.cli.jobfile import read_job_file
from scheduler.core.jobspec import JobSpecError, stored, validate_spec
from scheduler.protocol.rankspec import TrainKnobs

RUN = {"name": "mine", "resources": {"ranks": 2}, "run": {"command": ["python", "train.py", "--epochs", "1"],
                                                          "workdir": "/srv/proj", "env": {"HF_HOME": "/data/hf"},
                                                          "grace_s": 5}}


def test_a_run_job_needs_no_data_and_has_no_train_table() -> None:
    spec = validate_spec(RUN)
    assert spec.run is not None and spec.train is None and spec.dataset is None
    assert spec.run.argv() == ["python", "train.py", "--epochs", "1"]
    assert spec.run.grace_s == 5.0 and spec.run.env == {"HF_HOME": "/data/hf"}
    assert spec.knobs == TrainKnobs()  # what readers of [train] knobs get for a [run] job: the defaults


def test_a_string_command_runs_through_the_shell() -> None:
    spec = validate_spec({**RUN, "run": {"command": "echo $RANK > out"}})
    assert spec.run is not None and spec.run.argv() == ["/bin/sh", "-c", "echo $RANK > out"]
    assert spec.run.workdir == "" and spec.run.grace_s == 30.0


def test_the_stored_spec_reads_back_the_same() -> None:
    spec = validate_spec({**RUN, "data": {"dataset": "digits"}})
    again = stored(spec.model_dump())
    assert again == spec and again.dataset == "digits"


def test_a_built_in_job_is_as_before() -> None:
    spec = validate_spec({"name": "b", "data": {"dataset": "digits"}})
    assert spec.run is None and spec.train == TrainKnobs()
    old = {"name": "b", "data": {"dataset": "digits"}, "train": {"epochs": 2}}  # stored before [run] existed
    assert stored(old).train == TrainKnobs(epochs=2)


@pytest.mark.parametrize(("doc", "words"), [
    ({"name": "b"}, ["data: required key is missing", "[run]"]),
    ({**RUN, "train": {"epochs": 1}}, ["train:", "never both"]),
    ({**RUN, "run": {"command": []}}, ["run.command: must not be empty"]),
    ({**RUN, "run": {"command": ["true"], "workdir": "rel/dir"}}, ["run.workdir: must be an absolute path"]),
    ({**RUN, "run": {"command": ["true"], "env": {"MASTER_PORT": "1"}}}, ["run.env: MASTER_PORT is set by gsched"]),
    ({**RUN, "run": {"command": ["true"], "env": {"GSCHED_JOB_ID": "1"}}}, ["run.env: GSCHED_JOB_ID is set by gsched"]),
    ({**RUN, "run": {"command": ["true"], "grace_s": 7200}}, ["run.grace_s"]),
])
def test_bad_run_tables_name_the_field(doc: dict[str, object], words: list[str]) -> None:
    with pytest.raises(JobSpecError) as e:
        validate_spec(doc)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


def test_there_are_example_job_files() -> None:
    assert {p.name for p in EXAMPLES} >= {"job.toml", "ddp_job.toml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_job_file_is_a_valid_job(path: Path) -> None:
    # Read as `gsched submit` reads it (scheduler/cli/jobfile.py), validated as the server validates it.
    spec = validate_spec(read_job_file(str(path)))
    assert spec.name and (spec.run is not None) != (spec.train is not None)
