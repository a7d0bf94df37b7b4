"""Bad job.toml files are refused at submit, naming the field; nothing is stored."""

from __future__ import annotations

import pytest

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration

CASES = [
    # (what, file text, words the error must contain)
    ("unknown key", job_toml("x") + "\n[train2]\nfoo = 1\n", ["train2", "unknown key"]),
    ("unknown nested key", job_toml("x", extra="epochz = 3"), ["train.epochz", "unknown key"]),
    ("wrong type", job_toml("x").replace("ranks = 2", 'ranks = "two"'), ["resources.ranks"]),
    ("negative count", job_toml("x").replace("ranks = 2", "ranks = -1"), ["resources.ranks"]),
    ("missing data set", job_toml("x", dataset="nope"), ["data.dataset", "nope"]),
    ("more devices than exist", job_toml("x", ranks=3), ["resources", "needs 3 devices", "has 2"]),
    ("more devices per rank than a node has", job_toml("x", ranks=1, gpus=2), ["resources.gpus_per_rank"]),
    ("bad TOML", 'name = "x"\n[resources\n', ["not valid TOML"]),
    ("bad time limit", job_toml("x", limits='time = "forever"'), ["limits.time"]),
    ("missing data table", 'name = "x"\n', ["data", "required"]),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):  # type: ignore[no-untyped-def]
    from scheduler.cli.localcluster import LocalCluster

    c = LocalCluster(tmp_path_factory.mktemp("errors"), [NodeSpec("n1"), NodeSpec("n2")]).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "1")
    yield c
    c.close()


@pytest.mark.parametrize("what,text,words", CASES, ids=[c[0] for c in CASES])
def test_bad_spec_is_refused_naming_the_field(cluster, tmp_path, what, text, words):  # type: ignore[no-untyped-def]
    before = cluster.admin().get("/v1/jobs", all="true")["jobs"]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = cluster.cli("submit", str(path), check=False)
    assert out.returncode != 0, what
    for w in words:
        assert w in out.stderr, f"{what}: {w!r} not in {out.stderr!r}"
    assert "bad.toml" in out.stderr  # the file is named
    assert cluster.admin().get("/v1/jobs", all="true")["jobs"] == before


def test_missing_file_is_named(cluster, tmp_path):  # type: ignore[no-untyped-def]
    out = cluster.cli("submit", str(tmp_path / "nope.toml"), check=False)
    assert out.returncode != 0 and "nope.toml" in out.stderr
