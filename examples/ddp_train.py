"""A plain PyTorch DDP training script, as a team would bring it: no gsched import.

It runs under torchrun as it runs under gsched (``examples/ddp_job.toml``): the process group comes
from the default ``env://`` rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and from gsched
it reads only environment variables:

* ``GSCHED_SHARD_LIST``: a file naming this rank's shard files, one absolute local path per line;
* ``GSCHED_CHECKPOINT_DIR``: rank 0 saves ``ckpt-EPOCH.pt`` here after each epoch (gsched mirrors
  every file written here to another node);
* ``GSCHED_RESUME_FROM``: the newest mirrored checkpoint when the job was requeued ("" at first);
* ``GSCHED_METRICS_FILE``: rank 0 appends one JSON line per epoch (``gsched show`` lists them).

The shards are gsched's format (``gsched data make``): ``b"GSHARD1\\n"``, then records of
``<label:u32><h:u16><w:u16><c:u8>`` and ``h*w*c`` uint8 pixels.  The model is a small MLP: the
point is the plumbing, not the accuracy.

    python examples/ddp_train.py --epochs 3         # gsched starts one per rank
    torchrun --nproc-per-node 2 examples/ddp_train.py --shards a.shard,b.shard   # the same, by hand
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

MAGIC = b"GSHARD1\n"
HEADER = struct.Struct("<IHHB")


def read_shard(path: str) -> tuple[list[bytes], list[int], tuple[int, int, int]]:
    """The images (raw HWC bytes) and labels of one shard file, and the image shape."""
    images, labels, shape = [], [], (0, 0, 0)
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise SystemExit(f"{path}: not a shard file")
        while head := f.read(HEADER.size):
            label, h, w, c = HEADER.unpack(head)
            shape = (h, w, c)
            images.append(f.read(h * w * c))
            labels.append(label)
    return images, labels, shape


def my_shards(args: argparse.Namespace) -> list[str]:
    if args.shards:
        return args.shards.split(",")
    listing = os.environ.get("GSCHED_SHARD_LIST", "")
    if not listing:
        raise SystemExit("no shards: set GSCHED_SHARD_LIST (gsched does) or pass --shards")
    with open(listing) as f:
        return [line.strip() for line in f if line.strip()]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--shards", default="", help="comma-separated shard files (default: $GSCHED_SHARD_LIST)")
    p.add_argument("--epoch-sleep-s", type=float, default=0.0, help="pause after each epoch (demos, tests)")
    args = p.parse_args()

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")  # env:// rendezvous
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")

    paths = my_shards(args)
    images, labels, shape = [], [], (0, 0, 0)
    for path in paths:
        im, lb, shape = read_shard(path)
        images += im
        labels += lb
    print(f"rank {rank}/{world}: {len(labels)} samples from {len(paths)} shards: {', '.join(paths)}", flush=True)
    x = torch.frombuffer(bytearray(b"".join(images)), dtype=torch.uint8).reshape(len(labels), -1).float() / 255
    y = torch.tensor(labels, dtype=torch.long)
    # every rank must build the same model: agree on the input size and the number of classes
    sizes = torch.tensor([x.shape[1], int(y.max()) + 1 if len(y) else 0])
    dist.all_reduce(sizes, op=dist.ReduceOp.MAX)
    features, classes = int(sizes[0]), int(sizes[1])

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, classes)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    resume = os.environ.get("GSCHED_RESUME_FROM", "")
    if resume:
        state = torch.load(resume, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["epoch"])
        print(f"rank {rank}: resumed from {resume} after epoch {start}", flush=True)

    steps = torch.tensor([max(1, -(-len(y) // args.batch_size))])
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)  # the same number of steps on every rank
    for epoch in range(start + 1, args.epochs + 1):
        g = torch.Generator().manual_seed(epoch * 1000 + rank)
        order = torch.randperm(len(y), generator=g)
        total = 0.0
        for step in range(int(steps)):
            idx = order[step * args.batch_size:(step + 1) * args.batch_size]
            loss = nn.functional.cross_entropy(ddp(x[idx].to(device)), y[idx].to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss)
        mean = torch.tensor([total / int(steps)])
        dist.all_reduce(mean)
        if rank == 0:
            print(f"epoch {epoch}: loss {float(mean) / world:.4f}", flush=True)
            metrics = os.environ.get("GSCHED_METRICS_FILE", "")
            if metrics:
                with open(metrics, "a") as f:
                    f.write(json.dumps({"type": "epoch", "epoch": epoch, "loss": float(mean) / world}) + "\n")
            out = os.environ.get("GSCHED_CHECKPOINT_DIR", "")
            if out:
                tmp = os.path.join(out, f".ckpt-{epoch}.pt")
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, tmp)
                os.replace(tmp, os.path.join(out, f"ckpt-{epoch}.pt"))  # complete files only
        dist.barrier()
        if args.epoch_sleep_s:
            time.sleep(args.epoch_sleep_s)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's shutdown.  PyTorch's gloo worker threads drop their last
    # references to a finished collective's tensors (taking the GIL) just after the collective is
    # waited on; one that does so once the interpreter has begun to shut down aborts the process
    # (SIGABRT, "terminate called without an active exception") although training finished.  With
    # a plain sys.exit() that hit about one two-rank run in ten.  Every file here is closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
