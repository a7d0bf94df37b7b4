"""The rank spec as the workload reads it: scheduler.protocol.rankspec.RankSpec, one set of train knobs
with job.toml's defaults, and errors that name the field.  No torch, no processes."""

from __future__ import annotations

import pytest

from agents.workloads.resnet_ddp.spec import SpecError, parse_spec
from scheduler.core.jobspec import JobSpecError, validate_spec
from scheduler.protocol.rankspec import RankSpec, TrainKnobs

GOOD = {
    "job_id": 3,
    "shards": ["/d/x/00000.shard"],
    "num_classes": 10,
    "checkpoint_dir": "/c",
    "metrics_path": "/c/m.jsonl",
    "train": {"epochs": 2, "batch_size": 16, "lr": 0.1},
}


def with_train(**knobs: object) -> dict[str, object]:
    return {**GOOD, "train": {**GOOD["train"], **knobs}}  # type: ignore[dict-item]


def test_the_rank_knobs_are_job_tomls_names_defaults_and_bounds():
    assert RankSpec.model_fields["train"].annotation is TrainKnobs  # one definition for both ends
    assert parse_spec(GOOD).train == TrainKnobs(**GOOD["train"])  # type: ignore[arg-type]


def test_knobs_a_spec_leaves_out_take_job_tomls_defaults():
    train = parse_spec(GOOD).train
    assert (train.lr_scaling, train.keep_checkpoints, train.loader_workers) == ("none", 3, 0)
    assert (train.channels_last, train.hflip, train.crop_padding, train.checkpoint) == ("auto", "auto", "auto", True)


@pytest.mark.parametrize("given, read", [(True, "on"), (False, "off"), ("on", "on"), ("off", "off"), ("auto", "auto")])
def test_channels_last_and_hflip_take_booleans_and_on_off(given, read):
    train = parse_spec(with_train(channels_last=given, hflip=given)).train
    assert (train.channels_last, train.hflip) == (read, read)


def test_warmup_may_be_fractional_in_a_rank_spec_and_in_a_job_file():
    assert parse_spec(with_train(warmup_epochs=0.5)).train.warmup_epochs == 0.5
    assert parse_spec(with_train(warmup_epochs=2)).train.warmup_epochs == 2
    job = validate_spec({"name": "j", "data": {"dataset": "d"}, "train": {"warmup_epochs": 0.5}})
    assert job.train.warmup_epochs == 0.5
    with pytest.raises(JobSpecError, match="train.warmup_epochs"):
        validate_spec({"name": "j", "data": {"dataset": "d"}, "train": {"warmup_epochs": -1}})


def test_a_spec_written_from_the_model_reads_back_the_same():
    spec = parse_spec(with_train(channels_last=True, warmup_epochs=0.5, seed=7))
    assert parse_spec(spec.model_dump()) == spec
    assert RankSpec.model_validate_json(spec.model_dump_json()) == spec


@pytest.mark.parametrize(
    "change, words",
    [
        ({"train": {"lr": 0.1, "batch_size": 4}}, "train.epochs is required"),
        ({"metrics_path": None}, "metrics_path"),
        ({"shards": "/d/x/00000.shard"}, "shards"),
        ({"job_id": 0}, "job_id"),
        ({"stop_after_epochs": 0}, "stop_after_epochs"),
        ({"train": {"epochs": 2, "batch_size": 16, "lr": 0.1, "hflip": "sometimes"}}, "train.hflip"),
        ({"train": {"epochs": 2, "batch_size": 16, "lr": 0.1, "crop_padding": "wide"}}, "train.crop_padding"),
        ({"train": {"epochs": 2, "batch_size": 16, "lr": 0.1, "keep_checkpoints": 1}}, "train.keep_checkpoints"),
        ({"train": {"epochs": 2, "batch_size": 16, "lr": 0.1, "loader_workers": "auto"}}, "train.loader_workers"),
        ({"train": 5}, "train"),
    ],
)
def test_every_refusal_names_the_field(change, words):
    with pytest.raises(SpecError, match=words):
        parse_spec({**GOOD, **change})


def test_a_missing_field_and_a_non_object_are_refused():
    spec = dict(GOOD)
    del spec["checkpoint_dir"]
    with pytest.raises(SpecError, match="rank spec is missing 'checkpoint_dir'"):
        parse_spec(spec)
    with pytest.raises(SpecError, match="rank spec must be a JSON object"):
        parse_spec([GOOD])
    without_train = {k: v for k, v in GOOD.items() if k != "train"}
    with pytest.raises(SpecError, match="rank spec is missing 'train'"):
        parse_spec(without_train)


def test_several_bad_fields_are_all_named():
    with pytest.raises(SpecError) as caught:
        parse_spec({**GOOD, "colour": 1, "num_classes": 1, "train": {"epochs": 0, "batch_size": 16, "lr": 0.1, "x": 2}})
    message = str(caught.value)
    for words in ("unknown rank spec field(s): colour", "unknown train field(s): x", "num_classes", "train.epochs"):
        assert words in message
