"""torch.distributed with the nccl backend on every GPU, one process per GPU.

Run under torchrun, once with NVIDIA's NCCL and once with oxccl preloaded
(libnccl.so.2 from `cargo xtask build`):

    torchrun --nproc_per_node 2 scripts/torch_check.py
    LD_PRELOAD=$PWD/target/release/libnccl.so.2 \
        torchrun --nproc_per_node 2 scripts/torch_check.py

Every collective PyTorch offers (all_reduce with each op, all_gather,
all_gather_into_tensor, reduce_scatter_tensor, broadcast, reduce, all_to_all,
all_to_all_single, send/recv, batch_isend_irecv, barrier, new_group)
over several dtypes and sizes, checked against values computed on the host;
then a digest of every output, printed by rank 0, so the two runs can be
compared line for line; then a short all_reduce timing (not a benchmark:
scripts/nccl-tests-compare.sh and oxccl perf make the speed claims).
Exit status 0 when every check passed.
"""

import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    # More processes than GPUs (a dry run of an 8-GPU job on fewer GPUs:
    # oxccl allows ranks to share a GPU, NCCL refuses) share them in turn.
    local = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    digest = hashlib.sha256()
    failures = []
    checks = 0

    def check(name, got, want):
        nonlocal checks
        checks += 1
        digest.update(name.encode())
        digest.update(got.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        if not torch.equal(got.cpu(), want.cpu()):
            bad = (got.cpu() != want.cpu()).nonzero()
            failures.append(f"{name}: {bad.numel()} wrong, first at {bad[0].tolist()}")

    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64,
              torch.uint8, torch.float64]
    sizes = [1, 7, 4099, 1 << 20, (1 << 22) + 3]
    ops = [("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX),
           ("min", dist.ReduceOp.MIN), ("prod", dist.ReduceOp.PRODUCT)]

    # 1..3: exact in every dtype, products stay small (3^4 = 81). Past 4
    # ranks 1..2: 3^8 = 6561 is not exact in float16 or bfloat16, 2^8 is.
    nvals = 3 if world <= 4 else 2

    def val(r, n, dt, salt=0):
        return ((torch.arange(n, device=dev) * 7 + r * 3 + salt) % nvals + 1).to(dt)

    for dt in dtypes:
        for n in sizes:
            for oname, op in ops:
                x = val(rank, n, dt, 1)
                dist.all_reduce(x, op=op)
                parts = [val(r, n, dt, 1) for r in range(world)]
                want = parts[0].clone()
                for p in parts[1:]:
                    if oname == "sum":
                        want = want + p
                    elif oname == "max":
                        want = torch.maximum(want, p)
                    elif oname == "min":
                        want = torch.minimum(want, p)
                    else:
                        want = want * p
                check(f"all_reduce {oname} {dt} {n}", x, want)
            if dt.is_floating_point:
                x = val(rank, n, dt, 2)
                dist.all_reduce(x, op=dist.ReduceOp.AVG)
                want = sum(val(r, n, torch.float64, 2) for r in range(world)) / world
                check(f"all_reduce avg {dt} {n}", x, want.to(dt))
            # all_gather_into_tensor / all_gather
            x = val(rank, n, dt, 3)
            out = torch.empty(world * n, dtype=dt, device=dev)
            dist.all_gather_into_tensor(out, x)
            check(f"all_gather_into_tensor {dt} {n}", out,
                  torch.cat([val(r, n, dt, 3) for r in range(world)]))
            outs = [torch.empty(n, dtype=dt, device=dev) for _ in range(world)]
            dist.all_gather(outs, x)
            for r in range(world):
                check(f"all_gather[{r}] {dt} {n}", outs[r], val(r, n, dt, 3))
            # reduce_scatter_tensor
            x = val(rank, world * n, dt, 4)
            out = torch.empty(n, dtype=dt, device=dev)
            dist.reduce_scatter_tensor(out, x)
            want = sum(val(r, world * n, dt, 4) for r in range(world))[rank * n:(rank + 1) * n]
            check(f"reduce_scatter_tensor {dt} {n}", out, want)
            # broadcast and reduce from/to the last rank
            root = world - 1
            x = val(rank, n, dt, 5)
            dist.broadcast(x, src=root)
            check(f"broadcast {dt} {n}", x, val(root, n, dt, 5))
            x = val(rank, n, dt, 6)
            dist.reduce(x, dst=root)
            if rank == root:
                check(f"reduce {dt} {n}", x, sum(val(r, n, dt, 6) for r in range(world)))
            # all_to_all_single / all_to_all
            x = val(rank, world * n, dt, 7)
            out = torch.empty(world * n, dtype=dt, device=dev)
            dist.all_to_all_single(out, x)
            want = torch.cat([val(r, world * n, dt, 7)[rank * n:(rank + 1) * n]
                              for r in range(world)])
            check(f"all_to_all_single {dt} {n}", out, want)
            ins = list(val(rank, world * n, dt, 8).chunk(world))
            outs = [torch.empty(n, dtype=dt, device=dev) for _ in range(world)]
            dist.all_to_all(outs, ins)
            for r in range(world):
                check(f"all_to_all[{r}] {dt} {n}", outs[r],
                      val(r, world * n, dt, 8)[rank * n:(rank + 1) * n])
            # send/recv around the ring, and the batched form (PyTorch
            # refuses a rank's sends to itself: none with one rank)
            if world == 1:
                continue
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            x = val(rank, n, dt, 9)
            y = torch.empty(n, dtype=dt, device=dev)
            if rank % 2 == 0:
                dist.send(x, nxt)
                dist.recv(y, prv)
            else:
                dist.recv(y, prv)
                dist.send(x, nxt)
            check(f"send/recv {dt} {n}", y, val(prv, n, dt, 9))
            y = torch.empty(n, dtype=dt, device=dev)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt),
                                           dist.P2POp(dist.irecv, y, prv)])
            for q in reqs:
                q.wait()
            check(f"batch_isend_irecv {dt} {n}", y, val(prv, n, dt, 9))
    dist.barrier()
    # Large calls: above the copy-engine bounds (64 MiB copies, 256 MiB
    # reductions), on views that start inside PyTorch's cached segments (so
    # the peer maps an allocation at an offset), then fresh tensors after
    # empty_cache() (the allocations the peer mapped are freed and replaced).
    # Ranks sharing a GPU share its memory: 8 ranks' 72 Mi-element calls
    # need ~24 GiB each, 190 GiB on one H200; sizes shrink by the sharing.
    share = max(1, world // torch.cuda.device_count())
    for dt in [torch.float32, torch.bfloat16]:
        for n in [(24 << 20) // share + 5, (72 << 20) // share + 3]:
            pad = 1 + (n % 7)
            buf = torch.empty(pad + world * n, dtype=dt, device=dev)
            x = buf[pad:pad + n]
            x.copy_(val(rank, n, dt, 11))
            dist.all_reduce(x)
            check(f"large all_reduce {dt} {n}", x, sum(val(r, n, dt, 11) for r in range(world)))
            out = buf[pad:pad + world * n]
            dist.all_gather_into_tensor(out, val(rank, n, dt, 12))
            check(f"large all_gather_into_tensor {dt} {n}", out,
                  torch.cat([val(r, n, dt, 12) for r in range(world)]))
            y = torch.empty(n, dtype=dt, device=dev)
            dist.reduce_scatter_tensor(y, val(rank, world * n, dt, 13))
            want = sum(val(r, world * n, dt, 13) for r in range(world))[rank * n:(rank + 1) * n]
            check(f"large reduce_scatter_tensor {dt} {n}", y, want)
            x = val(rank, n, dt, 14)
            dist.broadcast(x, src=0)
            check(f"large broadcast {dt} {n}", x, val(0, n, dt, 14))
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            y = torch.empty(n, dtype=dt, device=dev)
            if world > 1:
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, val(rank, n, dt, 15), nxt),
                                               dist.P2POp(dist.irecv, y, prv)])
                for q in reqs:
                    q.wait()
                check(f"large batch_isend_irecv {dt} {n}", y, val(prv, n, dt, 15))
            del buf, x, out, y
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    # A subgroup (ncclCommSplit or a new communicator) of every rank.
    g = dist.new_group(list(range(world)))
    x = val(rank, 1000, torch.float32, 10)
    dist.all_reduce(x, group=g)
    check("new_group all_reduce", x, sum(val(r, 1000, torch.float32, 10) for r in range(world)))
    torch.cuda.synchronize()

    # Timing: all_reduce float32, 30 calls after 5 warm-up (median of 3 runs).
    times = []
    for n in [2, 1 << 16, 1 << 24, 1 << 27]:
        x = torch.ones(n, dtype=torch.float32, device=dev)
        for _ in range(5):
            dist.all_reduce(x)
        best = []
        for _ in range(3):
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(30):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            best.append((time.perf_counter() - t0) / 30)
        best.sort()
        t = best[1]
        busbw = 2 * (world - 1) / world * n * 4 / t / 1e9
        times.append(f"{n * 4:>10} B  {t * 1e6:9.1f} us  busbw {busbw:7.2f} GB/s")

    lib = "oxccl" if "oxccl" in os.environ.get("LD_PRELOAD", "") else "NCCL"
    ver = torch.cuda.nccl.version()
    if rank == 0:
        print(f"library: {lib} (torch {torch.__version__}, nccl version reported {ver})")
        print(f"checks: {checks} on rank 0, failures on rank 0: {len(failures)}")
        for f in failures[:20]:
            print("  FAIL", f)
        print(f"digest: {digest.hexdigest()}")
        for t in times:
            print("  all_reduce", t)
    dist.barrier()
    ok = torch.tensor([len(failures)], device=dev)
    dist.all_reduce(ok)
    dist.destroy_process_group()
    if rank == 0:
        print("RESULT:", "PASS" if ok.item() == 0 else f"FAIL ({ok.item()} failures)")
    sys.exit(0 if ok.item() == 0 else 1)


if __name__ == "__main__":
    main()
