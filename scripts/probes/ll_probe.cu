// The floor of a small all-reduce between two ranks' kernels, under CUDA
// graphs (scripts/ll-probe.sh runs it on the GPU machine). Each rank is a
// stream with its own graph of N kernel launches, launched side by side;
// time per launch = wall time of both graphs / N. With one GPU both ranks'
// streams share it (no link in the way: what the kernels and their
// launches cost); with two, rank 1 is on GPU 1 and the lines cross NVLink.
//
// Kernels (one thread does the work, as an 8-byte all-reduce needs):
//   empty  griddepcontrol only
//   copy   one float in -> out
//   xchg   reads its step counter, writes one 16-byte line {data, flag,
//          0, flag} into the peer's slot (step % 8), polls its own slot
//          for the peer's line of that step, adds, writes out, counts the
//          step: the one-shot LL protocol at its smallest
//   xchg+  as xchg, reaching its addresses through a table in device
//          memory (one more dependent load, as the ring's window table)
// each with PDL (programmatic stream serialization) or without, and with
// blocks of 32 or 512 threads.
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

typedef unsigned long long u64;
typedef unsigned int u32;

#define CK(x)                                                                      \
    do {                                                                           \
        cudaError_t e_ = (x);                                                      \
        if (e_ != cudaSuccess) {                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

struct Side {
    uint4* mine;    // my 8 slots: the peer writes here
    uint4* theirs;  // the peer's 8 slots: I write there
    u64* step;      // my step counter
    const float* in;
    float* out;
};

__device__ __forceinline__ void entry() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

__global__ void k_empty(Side s) { entry(); }

__global__ void k_copy(Side s) {
    entry();
    if (threadIdx.x == 0) s.out[0] = s.in[0];
}

__device__ __forceinline__ void xchg(const Side& s) {
    const u64 st = *(volatile u64*)s.step;
    const u32 fl = (u32)(st + 1);
    const float x = s.in[0];
    uint4* dst = s.theirs + (st % 8);
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst),
                 "r"(__float_as_uint(x)), "r"(fl), "r"(0u), "r"(fl)
                 : "memory");
    const uint4* src = s.mine + (st % 8);
    uint4 v;
    u64 spins = 0;
    do {
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(src)
                     : "memory");
        if (++spins > (1ull << 24)) return;  // ~10 s: never hang the machine
    } while (v.y != fl || v.w != fl);
    s.out[0] = x + __uint_as_float(v.x);
    *s.step = st + 1;
}

__global__ void k_xchg(Side s) {
    entry();
    if (threadIdx.x == 0) xchg(s);
}

__global__ void k_xchg_table(const Side* t) {
    entry();
    if (threadIdx.x == 0) {
        Side s = *t;
        xchg(s);
    }
}

enum Kind { EMPTY, COPY, XCHG, XCHG_TABLE };
static const char* names[] = {"empty", "copy", "xchg", "xchg+table"};

struct Rank {
    int dev;
    cudaStream_t st;
    Side side;
    Side* table;
    cudaGraphExec_t exec = nullptr;
};

static void launch(Rank& r, Kind k, int threads, bool pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(threads);
    cfg.stream = r.st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    switch (k) {
        case EMPTY: CK(cudaLaunchKernelEx(&cfg, k_empty, r.side)); break;
        case COPY: CK(cudaLaunchKernelEx(&cfg, k_copy, r.side)); break;
        case XCHG: CK(cudaLaunchKernelEx(&cfg, k_xchg, r.side)); break;
        case XCHG_TABLE: CK(cudaLaunchKernelEx(&cfg, k_xchg_table, (const Side*)r.table)); break;
    }
}

// Per-launch microseconds of `n` launches per rank, both ranks' graphs
// launched together (`both`), or rank 0's alone.
static double run(Rank* rk, Kind k, int threads, bool pdl, int n, bool both) {
    const int nr = both ? 2 : 1;
    for (int i = 0; i < nr; i++) {
        CK(cudaSetDevice(rk[i].dev));
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(rk[i].st, cudaStreamCaptureModeThreadLocal));
        for (int j = 0; j < n; j++) launch(rk[i], k, threads, pdl);
        CK(cudaStreamEndCapture(rk[i].st, &g));
        CK(cudaGraphInstantiate(&rk[i].exec, g, 0));
        CK(cudaGraphDestroy(g));
    }
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {  // the first replay warms up
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < nr; i++) {
            CK(cudaSetDevice(rk[i].dev));
            CK(cudaGraphLaunch(rk[i].exec, rk[i].st));
        }
        for (int i = 0; i < nr; i++) {
            CK(cudaSetDevice(rk[i].dev));
            CK(cudaStreamSynchronize(rk[i].st));
        }
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
        if (rep > 0 && us < best) best = us;
    }
    for (int i = 0; i < nr; i++) {
        CK(cudaSetDevice(rk[i].dev));
        CK(cudaGraphExecDestroy(rk[i].exec));
    }
    return best;
}

int main(int argc, char** argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 20000;
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    const bool two = ndev >= 2 && !(argc > 2 && strcmp(argv[2], "one") == 0);
    Rank rk[2];
    rk[0].dev = 0;
    rk[1].dev = two ? 1 : 0;
    uint4* slots[2];
    for (int i = 0; i < 2; i++) {
        CK(cudaSetDevice(rk[i].dev));
        if (two) cudaDeviceEnablePeerAccess(rk[1 - i].dev, 0);
        cudaGetLastError();
        CK(cudaStreamCreateWithFlags(&rk[i].st, cudaStreamNonBlocking));
        CK(cudaMalloc(&slots[i], 8 * sizeof(uint4)));
        CK(cudaMemset(slots[i], 0, 8 * sizeof(uint4)));
        CK(cudaMalloc(&rk[i].side.step, sizeof(u64)));
        CK(cudaMemset(rk[i].side.step, 0, sizeof(u64)));
        float* f;
        CK(cudaMalloc(&f, 2 * sizeof(float)));
        CK(cudaMemset(f, 0, 2 * sizeof(float)));
        rk[i].side.in = f;
        rk[i].side.out = f + 1;
        CK(cudaMalloc(&rk[i].table, sizeof(Side)));
    }
    for (int i = 0; i < 2; i++) {
        rk[i].side.mine = slots[i];
        rk[i].side.theirs = slots[1 - i];
        CK(cudaSetDevice(rk[i].dev));
        CK(cudaMemcpy(rk[i].table, &rk[i].side, sizeof(Side), cudaMemcpyHostToDevice));
    }
    printf("ll_probe: %s, %d launches per rank per graph, best of 3 replays (us per launch)\n",
           two ? "rank 1 on GPU 1 (NVLink)" : "both ranks on GPU 0", n);
    printf("%-12s %7s %5s %10s %10s\n", "kernel", "threads", "pdl", "one rank", "two ranks");
    const Kind ks[] = {EMPTY, COPY, XCHG, XCHG_TABLE};
    for (Kind k : ks)
        for (int threads : {32, 512})
            for (int pdl = 1; pdl >= 0; pdl--) {
                const double one = (k == XCHG || k == XCHG_TABLE) ? 0 : run(rk, k, threads, pdl, n, false);
                const double both = run(rk, k, threads, pdl, n, true);
                if (one > 0)
                    printf("%-12s %7d %5s %10.2f %10.2f\n", names[k], threads, pdl ? "on" : "off", one, both);
                else
                    printf("%-12s %7d %5s %10s %10.2f\n", names[k], threads, pdl ? "on" : "off", "-", both);
                fflush(stdout);
            }
    return 0;
}
