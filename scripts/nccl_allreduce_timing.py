# Reference timing: NCCL all_reduce through torch.distributed, 2 processes,
# float32 sum, 8 B .. 1 MB. Two figures per size: eager calls back to back
# (bound by PyTorch's per-call host cost) and a CUDA graph of 100 calls
# replayed (the GPU-side time per collective, as nccl-tests measures).
# Started by scripts/gpu-test.sh (NVLS off in its environment).
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
iters = 1000
if rank == 0:
    print(f"# NCCL {torch.cuda.nccl.version()} all_reduce float sum, 2 processes")
    print(f"# {'bytes':>10} {'us/call eager':>14} {'us/call graph':>14}")


def timed(fn, n):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / n


b = 8
while b <= 1 << 20:
    x = torch.ones(b // 4, dtype=torch.float32, device="cuda")
    for _ in range(50):
        dist.all_reduce(x)

    def eager():
        for _ in range(iters):
            dist.all_reduce(x)

    us_eager = timed(eager, iters)
    us_graph = float("nan")
    try:
        g = torch.cuda.CUDAGraph()
        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            with torch.cuda.graph(g, stream=st):
                for _ in range(100):
                    dist.all_reduce(x)
        torch.cuda.current_stream().wait_stream(st)
        g.replay()

        def replay():
            for _ in range(10):
                g.replay()

        us_graph = timed(replay, 1000)
    except Exception as ex:  # graph capture unsupported: eager only
        if rank == 0:
            print(f"# graph capture failed: {ex}")
    if rank == 0:
        print(f"  {b:>10} {us_eager:>14.2f} {us_graph:>14.2f}")
    b *= 2
torch.cuda.synchronize()
# destroy_process_group() after a captured graph hung for minutes on the
# 2xH200 machine (2026-11-30); the figures are printed, so leave at once.
os._exit(0)
