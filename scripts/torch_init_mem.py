"""Communicator start cost and device memory, one process per GPU.

Run under torchrun with NVIDIA's NCCL or with oxccl (LD_PRELOAD); rank 0
prints one line: the time from init_process_group to the end of a first
8-byte all_reduce (eager init: the communicator is made inside
init_process_group), and the device memory the communicator took (free memory
before and after, with PyTorch's context and a warm-up allocation made
first, so only the library's memory and the 8-byte buffer remain).
"""
import os
import time

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    x = torch.ones(2, dtype=torch.float32, device=dev)
    torch.cuda.synchronize()
    free0, total = torch.cuda.mem_get_info(dev)
    t0 = time.perf_counter()
    dist.init_process_group("nccl", device_id=dev)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    free1, _ = torch.cuda.mem_get_info(dev)
    lib = "oxccl" if "oxccl" in os.environ.get("LD_PRELOAD", "") else "NCCL"
    stats = torch.tensor([t1 - t0, (free0 - free1) / 2**20], dtype=torch.float64, device=dev)
    gathered = [torch.zeros_like(stats) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, stats)
    if rank == 0:
        per = ", ".join(f"rank {i}: {g[0].item()*1e3:.0f} ms {g[1].item():.0f} MiB" for i, g in enumerate(gathered))
        print(f"INIT {lib} {os.environ.get('INIT_TAG', '')}: init + first all_reduce, device memory taken: {per}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
