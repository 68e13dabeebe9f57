"""Time from process start to the first finished all-reduce of each of five
(dtype, op) pairs: what a fresh container or a new node pays before training
starts. Run under torchrun with NVIDIA's NCCL or with oxccl (LD_PRELOAD or
`oxccl run`); every rank prints one line per pair:

  FIRST <lib> <tag> rank R: float32 sum 12.3 ms (since start 2345.6 ms)

where the first figure is that call alone (from just before it to the end of
a device synchronise) and the second counts from the process's start (read
from /proc, so interpreter start-up and `import torch` are in it). Each
result is checked against the value computed on the host.

Several ranks may share one GPU (LOCAL_RANK modulo the GPUs); NVIDIA's NCCL
refuses that, so run it with one rank per GPU.
"""
import os
import time

import torch
import torch.distributed as dist

PAIRS = [
    ("float32", torch.float32, "sum"),
    ("bfloat16", torch.bfloat16, "sum"),
    ("float32", torch.float32, "max"),
    ("int64", torch.int64, "sum"),
    ("float16", torch.float16, "avg"),
]
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def process_start_ms():
    """The process's start on the CLOCK_MONOTONIC-like scale of /proc/uptime, in ms."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    # Field 22 of stat is the start time; fields[0] here is field 3.
    return int(fields[19]) * 1000.0 / ticks


def uptime_ms():
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) * 1000.0


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    lib = "oxccl" if "libnccl" in os.environ.get("LD_PRELOAD", "") else "NCCL"
    tag = os.environ.get("FIRST_TAG", "")
    n = 1 << 16
    bad = 0
    for name, dt, op in PAIRS:
        # rank + 1 at every element: sums and averages exact in every dtype here.
        x = torch.full((n,), rank + 1, dtype=dt, device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(x, op=OPS[op])
        torch.cuda.synchronize()
        took = (time.perf_counter() - t0) * 1e3
        since = uptime_ms() - process_start_ms()
        want = {"sum": world * (world + 1) / 2, "max": world, "avg": (world + 1) / 2}[op]
        ok = bool((x.double() == want).all().item())
        bad += 0 if ok else 1
        print(
            f"FIRST {lib} {tag} rank {rank}: {name} {op} {took:.1f} ms "
            f"(since start {since:.0f} ms){'' if ok else ' WRONG'}",
            flush=True,
        )
    dist.destroy_process_group()
    if bad:
        raise SystemExit(f"rank {rank}: {bad} wrong result(s)")


if __name__ == "__main__":
    main()
