"""Communicator start cost and memory, one process per GPU or all sharing GPU 0.

Run under torchrun with NVIDIA's NCCL or with oxccl (LD_PRELOAD); rank 0
prints one line: the time from init_process_group to the end of a first
8-byte all_reduce (eager init: the communicator is made inside
init_process_group), and the device memory the communicator took (free memory
before and after, with PyTorch's context and a warm-up allocation made
first, so only the library's memory and the 8-byte buffer remain).

SHARE_GPU=1 puts every rank on GPU 0 (oxccl allows ranks to share a GPU;
NCCL does not). Free memory is then the GPU's, moved by every rank at once,
so rank 0 prints a second line, MEM, with each process's own figures from
after the first all_reduce and a 1 MiB all_reduce and all_to_all less
before init_process_group: device memory (NVML's per-process use, through
nvidia-smi), resident host memory (VmRSS), threads and open descriptors.
"""
import os
import subprocess
import time

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    local = 0 if os.environ.get("SHARE_GPU") == "1" else int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    x = torch.ones(2, dtype=torch.float32, device=dev)
    torch.cuda.synchronize()
    free0, total = torch.cuda.mem_get_info(dev)
    before = process_figures()
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
    if os.environ.get("SHARE_GPU") == "1":
        n = dist.get_world_size()
        y = torch.ones(1 << 18, dtype=torch.float32, device=dev)
        dist.all_reduce(y)
        z = torch.empty_like(y)
        dist.all_to_all_single(z, y)
        torch.cuda.synchronize()
        after = process_figures()
        mine = torch.tensor([a - b for a, b in zip(after, before)], dtype=torch.float64, device=dev)
        every = [torch.zeros_like(mine) for _ in range(n)]
        dist.all_gather(every, mine)
        if rank == 0:
            cols = list(zip(*[e.tolist() for e in every]))
            med = lambda v: sorted(v)[len(v) // 2]
            print(
                f"MEM {lib} ranks={n} sharing GPU 0, per process (median, max over ranks): "
                f"device {med(cols[0]):.0f} / {max(cols[0]):.0f} MiB, "
                f"host RSS {med(cols[1]):.0f} / {max(cols[1]):.0f} MiB, "
                f"threads {med(cols[2]):.0f} / {max(cols[2]):.0f}, "
                f"descriptors {med(cols[3]):.0f} / {max(cols[3]):.0f}"
            )
    dist.destroy_process_group()


def process_figures():
    """This process's device memory (MiB, NVML's per-process figure), host
    resident memory (MiB), threads and open file descriptors."""
    pid = os.getpid()
    device = 0.0
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    ).stdout
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            device = float(parts[1])
    status = dict(
        line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line
    )
    rss = float(status["VmRSS"].split()[0]) / 1024
    threads = float(status["Threads"].strip())
    fds = float(len(os.listdir(f"/proc/{pid}/fd")))
    return [device, rss, threads, fds]


if __name__ == "__main__":
    main()
