// What the host pays to issue one small collective without CUDA graphs
// (scripts/launch-probe.sh runs it on the GPU machine): the driver calls an
// eager all-reduce makes, each timed alone on one GPU.
//
// Launches: an empty kernel (griddepcontrol only, as every oxccl kernel
// begins) with one 144-byte struct parameter (oxccl's RingArgs), 1 block of
// 32 or 512 threads, through the runtime's cudaLaunchKernelEx and the
// driver's cuLaunchKernelEx, with programmatic stream serialization (PDL)
// or without. "burst": host microseconds per launch over bursts of 256
// launches (the stream's queue never fills, so this is the host's cost
// alone; best of 40 bursts); "sustained": 20,000 launches back to back
// then a synchronize, per launch (host or GPU, whichever is slower).
//
// Helper calls, 200,000 each, ns per call: cuPointerGetAttributes (the 4
// attributes oxccl asks per buffer), cuStreamIsCapturing,
// cuCtxGetCurrent, cuCtxSetCurrent (same context),
// cuStreamGetCtx.
//
// Two GPUs (or two streams of one when there is one): what one op of a one-process, two-GPU group
// costs the host, us per op, best of 40 bursts of 256 ops and sustained
// over 20,000 with the GPUs' completion: "two launches" (a kernel per GPU,
// as -g 2 eager runs today); "one launch + events" (rank 1's stream hands
// its order to GPU 0's through an event, one kernel there does both ranks'
// work over NVLink, an event hands completion back); "one launch + memops"
// (rank 1's stream writes a ready word and waits on a done word with
// stream memory operations instead of events).
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

typedef unsigned long long u64;

#define CK(x)                                                                      \
    do {                                                                           \
        cudaError_t e_ = (x);                                                      \
        if (e_ != cudaSuccess) {                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)
#define DK(x)                                                                      \
    do {                                                                           \
        CUresult r_ = (x);                                                         \
        if (r_ != CUDA_SUCCESS) {                                                  \
            fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #x, (int)r_); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

// RingArgs' size (crates/oxccl-cuda/src/ring.rs).
struct Args {
    u64 w[18];
};

__global__ void k_empty(Args a) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

typedef std::chrono::steady_clock Clock;
static double us_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

static cudaStream_t st;
static CUfunction fn;
static Args args;

static void launch_rt(int threads, bool pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(threads);
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, k_empty, args));
}

static void launch_drv(int threads, bool pdl) {
    CUlaunchConfig cfg = {};
    cfg.gridDimX = 1;
    cfg.gridDimY = 1;
    cfg.gridDimZ = 1;
    cfg.blockDimX = threads;
    cfg.blockDimY = 1;
    cfg.blockDimZ = 1;
    cfg.hStream = (CUstream)st;
    CUlaunchAttribute at[1];
    at[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    at[0].value.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    Args a = args;
    void* params[1] = {&a};
    DK(cuLaunchKernelEx(&cfg, fn, params, nullptr));
}

template <class F>
static void measure(const char* what, int threads, bool pdl, F f) {
    double burst = 1e30;
    for (int rep = 0; rep < 41; rep++) {
        auto t0 = Clock::now();
        for (int i = 0; i < 256; i++) f(threads, pdl);
        const double us = us_since(t0) / 256;
        CK(cudaStreamSynchronize(st));
        if (rep > 0 && us < burst) burst = us;
    }
    const int n = 20000;
    auto t0 = Clock::now();
    for (int i = 0; i < n; i++) f(threads, pdl);
    const double host = us_since(t0) / n;
    CK(cudaStreamSynchronize(st));
    const double total = us_since(t0) / n;
    printf("%-22s %7d %5s %9.2f %12.2f %10.2f\n", what, threads, pdl ? "on" : "off", burst, host, total);
    fflush(stdout);
}

template <class F>
static void helper(const char* what, F f) {
    const int n = 200000;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        auto t0 = Clock::now();
        for (int i = 0; i < n; i++) f();
        const double ns = us_since(t0) * 1000 / n;
        if (ns < best) best = ns;
    }
    printf("%-34s %8.1f ns\n", what, best);
    fflush(stdout);
}

static void two_gpus() {
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    // One GPU: both "ranks" on it, a stream each (the host's calls are the
    // same; the events then order two streams of one device).
    const int dev1 = n < 2 ? 0 : 1;
    cudaStream_t s[2];
    cudaEvent_t ev[2];
    CUdeviceptr word[2];
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d ? dev1 : 0));
        CK(cudaStreamCreateWithFlags(&s[d], cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&ev[d], cudaEventDisableTiming));
        CK(cudaMalloc((void**)&word[d], 64));
        CK(cudaMemset((void*)word[d], 0, 64));
    }
    auto launch_on = [&](int d) {
        CK(cudaSetDevice(d ? dev1 : 0));
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1);
        cfg.blockDim = dim3(32);
        cfg.stream = s[d];
        CK(cudaLaunchKernelEx(&cfg, k_empty, args));
    };
    auto two_launches = [&]() {
        launch_on(0);
        launch_on(1);
    };
    auto one_launch_events = [&]() {
        CK(cudaSetDevice(dev1));
        CK(cudaEventRecord(ev[1], s[1]));
        CK(cudaSetDevice(0));
        CK(cudaStreamWaitEvent(s[0], ev[1], 0));
        launch_on(0);
        CK(cudaEventRecord(ev[0], s[0]));
        CK(cudaSetDevice(dev1));
        CK(cudaStreamWaitEvent(s[1], ev[0], 0));
    };
    unsigned seq = 0;
    auto one_launch_memops = [&]() {
        // Host cost only: the empty kernel neither reads the ready word nor
        // writes the done word, so the wait is for a value already there.
        seq++;
        CK(cudaSetDevice(dev1));
        DK(cuStreamWriteValue32((CUstream)s[1], word[1], seq, 0));
        launch_on(0);
        CK(cudaSetDevice(dev1));
        DK(cuStreamWaitValue32((CUstream)s[1], word[1] + 4, 0, CU_STREAM_WAIT_VALUE_GEQ));
    };
    auto sync_both = [&]() {
        for (int d = 0; d < 2; d++) {
            CK(cudaSetDevice(d ? dev1 : 0));
            CK(cudaStreamSynchronize(s[d]));
        }
    };
    auto run = [&](const char* what, auto f) {
        double burst = 1e30;
        for (int rep = 0; rep < 41; rep++) {
            auto t0 = Clock::now();
            for (int i = 0; i < 256; i++) f();
            const double us = us_since(t0) / 256;
            sync_both();
            if (rep > 0 && us < burst) burst = us;
        }
        const int m = 20000;
        auto t0 = Clock::now();
        for (int i = 0; i < m; i++) f();
        const double host = us_since(t0) / m;
        sync_both();
        const double total = us_since(t0) / m;
        printf("%-26s %9.2f %12.2f %10.2f\n", what, burst, host, total);
        fflush(stdout);
    };
    printf("%s, one op of a 2-rank group (us per op, PDL off, 32 threads)\n",
           n < 2 ? "one GPU, two streams" : "two GPUs");
    printf("%-26s %9s %12s %10s\n", "way", "burst", "sustained:host", "total");
    for (int rep = 0; rep < 2; rep++) {
        run("two launches", two_launches);
        run("one launch + events", one_launch_events);
        run("one launch + memops", one_launch_memops);
    }
    CK(cudaSetDevice(0));
}

int main() {
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaGetFuncBySymbol((cudaFunction_t*)&fn, (const void*)k_empty));
    for (int i = 0; i < 18; i++) args.w[i] = i;
    printf("launch_probe: empty kernel, 144-byte parameter, 1 block (us per launch)\n");
    printf("%-22s %7s %5s %9s %12s %10s\n", "launch", "threads", "pdl", "burst", "sustained:host", "total");
    for (int threads : {32, 512})
        for (int pdl = 1; pdl >= 0; pdl--) {
            measure("cudaLaunchKernelEx", threads, pdl, launch_rt);
            measure("cuLaunchKernelEx", threads, pdl, launch_drv);
        }

    float* buf;
    CK(cudaMalloc(&buf, 1 << 20));
    CUcontext ctx;
    DK(cuCtxGetCurrent(&ctx));
    printf("helper calls (best of 3 x 200,000)\n");
    helper("cuPointerGetAttributes (4 attrs)", [&] {
        unsigned kind = 0;
        int ord = -1;
        CUdeviceptr base = 0;
        size_t size = 0;
        CUpointer_attribute at[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                     CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
        void* data[4] = {&kind, &ord, &base, &size};
        DK(cuPointerGetAttributes(4, at, data, (CUdeviceptr)(buf + 16)));
    });
    helper("cuStreamIsCapturing", [&] {
        CUstreamCaptureStatus s;
        DK(cuStreamIsCapturing((CUstream)st, &s));
    });
    helper("cuCtxGetCurrent", [&] {
        CUcontext c;
        DK(cuCtxGetCurrent(&c));
    });
    helper("cuCtxSetCurrent (same)", [&] { DK(cuCtxSetCurrent(ctx)); });
    helper("cuStreamGetCtx", [&] {
        CUcontext c;
        DK(cuStreamGetCtx((CUstream)st, &c));
    });
    two_gpus();
    return 0;
}
