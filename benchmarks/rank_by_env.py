"""Run one rank of ``agents.workloads.resnet_ddp`` with the spec file named by its ``RANK``.

For the ``launch`` benchmark's plain-torchrun baseline: torchrun passes every rank the same
arguments, so ``--spec-dir D`` picks ``D/rank-$RANK.spec.json`` (the files a gsched agent wrote).
"""

from __future__ import annotations

import os
import sys

from agents.workloads.resnet_ddp.main import leave, main

if __name__ == "__main__":
    spec_dir = sys.argv[sys.argv.index("--spec-dir") + 1]
    leave(main(["--spec", os.path.join(spec_dir, f"rank-{os.environ['RANK']}.spec.json")]))
