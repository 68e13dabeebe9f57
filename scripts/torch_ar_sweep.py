"""all_reduce float32 sum through torch.distributed (nccl backend), one
process per GPU: time per call and bus bandwidth from 8 B to SIZE_MAX.

    torchrun --nproc_per_node 2 scripts/torch_ar_sweep.py [MAX_BYTES]
    LD_PRELOAD=.../libnccl.so.2 torchrun --nproc_per_node 2 scripts/torch_ar_sweep.py

Each size: 5 warm-up calls, then 3 rounds of ITERS calls timed with CUDA
events on the current stream; the median round is printed (rank 0). Sizes
grow by SWEEP_FACTOR (default 4; 2 gives every power of two). Run the
two libraries in the same device call to compare them (scripts/gpu-bench.sh).
"""

import os
import sys

import torch
import torch.distributed as dist


def main():
    max_bytes = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 30
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if os.environ.get("SWEEP_SPLIT_HOSTS"):
        # Each rank its own "host" for oxccl (NCCL_HOSTID): device buffers
        # then take oxccl's network path between the processes.
        os.environ["NCCL_HOSTID"] = f"sweep-host-{rank}"
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    lib = "oxccl" if "oxccl" in os.environ.get("LD_PRELOAD", "") else "NCCL"
    tag = os.environ.get("SWEEP_TAG", "")
    if rank == 0:
        print(f"# {lib} {tag} all_reduce float32 sum, {world} processes")
        print(f"# {'bytes':>12} {'us':>10} {'busbw GB/s':>11}")
    b = 8
    while b <= max_bytes:
        n = max(1, b // 4)
        x = torch.ones(n, dtype=torch.float32, device=dev)
        iters = 50 if b <= (1 << 20) else (20 if b <= (64 << 20) else 8)
        for _ in range(5):
            dist.all_reduce(x)
        rounds = []
        for _ in range(3):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            dist.barrier()
            torch.cuda.synchronize()
            s.record()
            for _ in range(iters):
                dist.all_reduce(x)
            e.record()
            torch.cuda.synchronize()
            rounds.append(s.elapsed_time(e) * 1e3 / iters)
        rounds.sort()
        t = rounds[1]
        busbw = 2 * (world - 1) / world * n * 4 / (t * 1e-6) / 1e9
        if rank == 0:
            print(f"  {n * 4:>12} {t:>10.1f} {busbw:>11.2f}", flush=True)
        b *= int(os.environ.get("SWEEP_FACTOR", "4"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
