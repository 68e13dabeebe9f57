"""torch.distributed's shrink_group (ncclCommShrink) on the nccl backend.

The last rank is excluded: it makes no call after the first all_reduce (as
if it had failed; it stays alive so that the store lives on) while the
others shrink the default group without it and check an all_reduce, an
all_gather and a broadcast on the new group, whose ranks keep the parent
order. Exit status 0 when every check passed; "SKIPPED" when this torch has
no shrink_group.

    LD_PRELOAD=$PWD/target/release/libnccl.so.2 \
        torchrun --nproc_per_node 4 scripts/torch_shrink.py

More processes than GPUs share them (oxccl allows it, NCCL refuses), so on
one GPU this runs on oxccl only (scripts/gpu-bench.sh shrink).
"""

import inspect
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    x = torch.full((4099,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    assert x.eq(world * (world + 1) / 2).all(), f"rank {rank}: first all_reduce"
    torch.cuda.synchronize()
    shrink = getattr(c10d, "shrink_group", None)
    if shrink is None:
        print(f"SKIPPED: torch {torch.__version__} has no shrink_group")
        return 0
    if rank == 0:
        print(f"torch {torch.__version__}: shrink_group{inspect.signature(shrink)}")
    store = c10d._get_default_store()
    gone = world - 1
    if rank == gone:
        # Excluded: wait (no NCCL call) until the others are done.
        store.wait([f"shrink_done_{r}" for r in range(gone)], timedelta(seconds=240))
        print(f"rank {rank}: excluded, stayed out")
        os._exit(0)
    g = shrink([gone])
    grp = g if isinstance(g, dist.ProcessGroup) else None
    n = dist.get_world_size(grp)
    r = dist.get_rank(grp)
    assert (n, r) == (world - 1, rank), f"rank {rank}: new group rank {r} of {n}"
    fails = 0
    for count in (1, 4099, 1 << 20):
        y = torch.full((count,), float(rank + 1), device=dev)
        dist.all_reduce(y, group=grp)
        fails += int(not y.eq(sum(range(1, world))).all())
    parts = [torch.empty(5, device=dev) for _ in range(n)]
    dist.all_gather(parts, torch.full((5,), float(rank), device=dev), group=grp)
    fails += sum(int(not p.eq(float(i)).all()) for i, p in enumerate(parts))
    b = torch.full((1000,), float(rank), device=dev)
    src = 1 if n > 1 else 0  # a global rank of the new group
    dist.broadcast(b, src=src, group=grp)
    fails += int(not b.eq(float(src)).all())
    torch.cuda.synchronize()
    print(f"rank {rank}: shrink_group returned {type(g).__name__}; rank {r} of {n}; {fails} failed checks")
    store.set(f"shrink_done_{rank}", "1")
    os._exit(1 if fails else 0)


if __name__ == "__main__":
    sys.exit(main())
