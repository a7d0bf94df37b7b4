"""The built-in workload: one rank of data-parallel ResNet-18 training over gsched shards.

Who calls: the node agent launches one process per rank as
``python -m agents.workloads.resnet_ddp --spec RANKSPEC.json`` with the torch.distributed environment
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, and
``CUDA_VISIBLE_DEVICES`` on GPU nodes).  Exit status: 0 when training finished (or stopped at
``stop_after_epochs``), 143 after SIGTERM (ranks stop together at the next step boundary; the last
per-epoch checkpoint is the resume point), 2 for a bad rank spec, 1 for any other error (traceback on
stderr).  :func:`agents.workloads.resnet_ddp.train.train` runs in-process too, inside a process group
its caller initialised.  ``python -m agents.workloads.resnet_ddp --bench`` measures one rank's images/s on
random data instead (on CUDA: with and without bf16 and channels-last), for the device check.

One concept a module; each module's docstring states its contract:

* ``spec``: the rank spec file, read and validated (``SpecError`` names the field).
* ``runtime``: where and how a rank computes: device, precision, memory format, loader workers,
  CPU threads, seeding.
* ``data``: a rank's shards streamed, split into training and held-out samples, shuffled, augmented,
  batched, and moved to the device.
* ``model``: ResNet-18 with its stem fitted to the images, DDP, one accumulated forward and backward.
* ``train``: the train loop: the learning rate, one optimizer step, one epoch, :func:`train`.
* ``checkpoint``: the checkpoint format, its atomic save and pruning, and resuming from it.
* ``metrics``: the JSON lines rank 0 writes for the agent.
* ``bench``: the ``--bench`` mode.
* ``main``: the entry point (``__main__`` runs it).

Importing the package itself imports nothing; torch comes with the modules that use it.
"""
