"""``python -m agents.workloads.resnet_ddp``: runs :func:`agents.workloads.resnet_ddp.main.main`."""

import sys

from agents.workloads.resnet_ddp.main import main

sys.exit(main())
