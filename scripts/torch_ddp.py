"""A short DistributedDataParallel training run, one process per GPU, with
fixed seeds: rank 0 prints the loss of every step, so a run with NVIDIA's
NCCL and one with oxccl (LD_PRELOAD) can be compared line for line.

    torchrun --nproc_per_node 2 scripts/torch_ddp.py
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.GELU(),
        torch.nn.Linear(1024, 1024), torch.nn.GELU(),
        torch.nn.Linear(1024, 10),
    ).to(dev)
    # Small buckets: several all_reduce calls per step, of different sizes.
    ddp = DDP(model, device_ids=[local], bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator(device="cpu").manual_seed(100 + rank)
    for step in range(30):
        x = torch.randn(64, 512, generator=g).to(dev)
        y = torch.randint(0, 10, (64,), generator=g).to(dev)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        # The mean loss over ranks, exactly as each library computes it.
        t = loss.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"step {step:2d} loss {t.item():.9f}", flush=True)
    # Parameters must agree across ranks after training.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    other = flat.clone()
    dist.broadcast(other, src=0)
    same = bool(torch.equal(flat, other))
    print(f"rank {rank}: parameters equal to rank 0's: {same}", flush=True)
    dist.destroy_process_group()
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
