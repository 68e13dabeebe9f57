"""Gloo all_reduce timing through torch.distributed (the reference for oxccl's
host collectives). Two or more local processes, float32, sizes 8 B to 128 MB.

Usage: python3 gloo_all_reduce.py [nranks] [min_bytes] [max_bytes]
Prints: bytes median_us algbw_GBps busbw_GBps (one line per size, rank 0).
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, n, lo, hi, port, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    size = lo
    rows = []
    while size <= hi:
        t = torch.ones(max(size // 4, 1), dtype=torch.float32)
        iters = 200 if size <= (1 << 20) else max(3, (256 << 20) // size)
        for _ in range(max(2, iters // 10)):
            dist.all_reduce(t)
        samples = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            samples.append(time.perf_counter() - t0)
        samples.sort()
        med = samples[len(samples) // 2] * 1e6
        algbw = size / med / 1e3
        rows.append((size, med, algbw, algbw * 2 * (n - 1) / n))
        size *= 2
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    lo = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    hi = int(sys.argv[3]) if len(sys.argv) > 3 else 128 << 20
    port = 29500 + os.getpid() % 1000
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, n, lo, hi, port, q)) for r in range(n)]
    for p in procs:
        p.start()
    rows = q.get()
    for p in procs:
        p.join()
    print(f"# gloo all_reduce float32, {n} processes, torch {torch.__version__}")
    print("#      bytes   median_us   algbw_GBps   busbw_GBps")
    for size, med, algbw, busbw in rows:
        print(f"{size:12d} {med:11.1f} {algbw:12.3f} {busbw:12.3f}")


if __name__ == "__main__":
    main()
