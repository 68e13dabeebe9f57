"""Gloo's side of the scale benchmark (scripts/bench-scale-mpi.sh): N rank
processes on this host, each imports torch, joins a gloo process group
(TCP store on 127.0.0.1), runs one all-reduce of its rank number + 1 and
checks the sum, then reads its own peak resident memory (VmHWM).

Usage: python bench/gloo_scale_probe.py N   (LAUNCH_T0: seconds since the
epoch when the script launched this, as for scale_probe.c)

Rank 0 prints one line in scale_probe.c's format, plus the part that is
torch's import rather than the communicator:

  ranks N launch_to_init_s A launch_to_first_s B peak_mb_total C peak_mb_per_rank D
      import_s E rss_after_import_mb F

launch_to_* are the slowest rank's; init_s covers the import too, as a
user's job pays it; rss_after_import_mb is the mean VmRSS before the
process group is made.
"""

import multiprocessing as mp
import os
import socket
import sys
import time


def status_mb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024.0
    return 0.0


def rank_main(rank, n, port, t0, out):
    import torch
    import torch.distributed as dist

    t_import = time.time() - t0
    rss_import = status_mb("VmRSS:")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=n,
    )
    t_init = time.time() - t0
    x = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(x)
    t_first = time.time() - t0
    ok = int(x.item() == n * (n + 1) // 2)
    hwm = status_mb("VmHWM:")
    stats = torch.tensor([t_import, t_init, t_first], dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    sums = torch.tensor([hwm, rss_import, float(ok)], dtype=torch.float64)
    dist.all_reduce(sums)
    if rank == 0:
        if int(sums[2].item()) != n:
            out.put("gloo_scale_probe: wrong all-reduce result")
        else:
            out.put(
                f"ranks {n} launch_to_init_s {stats[1]:.3f} launch_to_first_s {stats[2]:.3f} "
                f"peak_mb_total {sums[0]:.1f} peak_mb_per_rank {sums[0] / n:.2f} "
                f"import_s {stats[0]:.3f} rss_after_import_mb {sums[1] / n:.1f}"
            )
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    n = int(sys.argv[1])
    t0 = float(os.environ.get("LAUNCH_T0", time.time()))
    port = free_port()
    # spawn: each rank a fresh interpreter that imports torch itself, as
    # processes a launcher starts would.
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, n, port, t0, out)) for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        print(f"gloo_scale_probe: ranks {bad} failed", file=sys.stderr)
        sys.exit(1)
    print(out.get(timeout=5))


if __name__ == "__main__":
    main()
