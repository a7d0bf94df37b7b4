"""``python -m agents.workloads.resnet_ddp``: runs :func:`agents.workloads.resnet_ddp.main.main` and leaves
with its status by :func:`agents.workloads.resnet_ddp.main.leave` (no interpreter shutdown)."""

from agents.workloads.resnet_ddp.main import leave, main

leave(main())
