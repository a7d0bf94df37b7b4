"""WebDataset tars through the CLI and into a ``[run]`` job, on real agents over loopback.

``gsched data make NAME --source imagefolder:TREE --format wds`` writes WebDataset tars (``KEY.png`` with
``KEY.cls``) and uploads them as shards; files registered in place with ``gsched data add`` reach a
``[run]`` job's command as ``GSCHED_SHARDS``: the local paths of the very tar files (hard links), which a
plain ``tarfile`` reads.
"""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from agents.datasets import make_shards
from agents.shardfile import shard_path
from scheduler.cli.localcluster import LocalCluster, NodeSpec
from tests.conftest import TINY_SOURCE

pytestmark = pytest.mark.integration

SINGLE_TEAM = {"GSCHED_RUN_AS_AGENT_USER": "1"}


@pytest.fixture
def one_node(make_cluster: Any) -> LocalCluster:
    c: LocalCluster = make_cluster([NodeSpec("n1", "r1", gpus=1)], extra_env=SINGLE_TEAM).start()
    return c


def test_data_make_from_an_imagefolder_writes_webdataset_tars(one_node: LocalCluster, tmp_path: Path) -> None:
    from PIL import Image

    c = one_node
    for cls, colour in (("cat", (255, 0, 0)), ("ant", (0, 0, 255))):
        (tmp_path / "tree" / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (16, 16), colour).save(tmp_path / "tree" / cls / f"{i}.png")
    c.cli("data", "make", "pets", "--source", f"imagefolder:{tmp_path / 'tree'}?size=8", "--format", "wds",
          "--shards", "2", "--replicas", "1")
    (ds,) = c.admin().get("/v1/datasets")
    assert (ds["name"], ds["classes"], ds["samples"], len(ds["shards"])) == ("pets", 2, 6, 2)
    assert ds["replicas_healthy_min"] == 1
    labels = []
    for i in range(2):
        with tarfile.open(shard_path(c.data_dir("n1"), "pets", i)) as tar:
            names = tar.getnames()
            assert names and all(n.endswith((".png", ".cls")) for n in names)
            assert {n.rsplit(".", 1)[0] for n in names if n.endswith(".png")} == {
                n.rsplit(".", 1)[0] for n in names if n.endswith(".cls")}  # each image with its label
            labels += [int(tar.extractfile(n).read()) for n in names if n.endswith(".cls")]  # type: ignore[union-attr]
    assert sorted(labels) == [0, 0, 0, 1, 1, 1]  # ant 0, cat 1: sorted folder names


def test_a_run_job_gets_the_tar_files_of_an_in_place_data_set(one_node: LocalCluster, tmp_path: Path) -> None:
    c = one_node
    make_shards(TINY_SOURCE, tmp_path / "built", "x", 2, seed=3, fmt="wds")
    folder = c.data_dir("n1") / "team-files"
    folder.mkdir()
    for i in range(2):
        shutil.copyfile(shard_path(tmp_path / "built", "x", i), folder / f"train-{i:03d}.tar")
    c.cli("data", "add", "team", "--node", "n1", "--path", "team-files", "--glob", "*.tar", "--replicas", "1")
    work = tmp_path / "proj"
    work.mkdir()
    (work / "read.py").write_text(
        "import json, os, tarfile\n"
        "paths = os.environ['GSCHED_SHARDS'].split(os.pathsep)\n"
        "members = {p: len(tarfile.open(p).getnames()) for p in paths}\n"
        "json.dump({'paths': paths, 'members': members}, open('seen.json', 'w'))\n")
    (tmp_path / "job.toml").write_text(
        f'name = "tars"\n[resources]\nranks = 1\n[data]\ndataset = "team"\n'
        f'[run]\ncommand = ["{sys.executable}", "read.py"]\nworkdir = "{work}"\n[limits]\ntime = "5m"\n')
    job_id = int(c.cli("submit", str(tmp_path / "job.toml")).stdout.split()[-1])
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    seen = json.loads((work / "seen.json").read_text())
    assert seen["paths"] == [str(shard_path(c.data_dir("n1"), "team", i)) for i in range(2)]
    for i, p in enumerate(seen["paths"]):
        assert Path(p).samefile(folder / f"train-{i:03d}.tar")  # the team's own file, linked, not copied
        assert seen["members"][p] > 0 and seen["members"][p] % 2 == 0  # KEY.png + KEY.cls pairs
    assert doc["local_fraction"] == 1.0 and doc["transfer_bytes"] == 0
