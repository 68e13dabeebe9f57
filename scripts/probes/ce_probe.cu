// What the copy engines and the SMs move between two GPUs, one way and both
// ways at once: the measurements behind the choice of copy-engine paths for
// large all-gathers, broadcasts and send/receives (docs/performance-gpu.md,
// "Floors"). Built and run ON the GPU machine by scripts/ce-probe.sh:
//   nvcc -O2 -arch=sm_90 -o ce_probe scripts/probes/ce_probe.cu -lcuda
// One process, GPUs 0 and 1, peer access on. Each figure: median of 7 timed
// runs after 2 untimed, host wall clock around both GPUs' work (so "both
// ways" is the slower GPU's finish). Prints one line per measurement:
//   <name> <bytes each way> <µs> <GB/s each way>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                   \
    do {                                                                        \
        cudaError_t e_ = (x);                                                   \
        if (e_ != cudaSuccess) {                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,           \
                    cudaGetErrorString(e_));                                    \
            exit(2);                                                            \
        }                                                                       \
    } while (0)
#define CU(x)                                                                   \
    do {                                                                        \
        CUresult r_ = (x);                                                      \
        if (r_ != CUDA_SUCCESS) {                                               \
            const char* s_ = "?";                                               \
            cuGetErrorString(r_, &s_);                                          \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);      \
            exit(2);                                                            \
        }                                                                       \
    } while (0)

// 16-byte copies, 4 in flight per thread before any store.
__global__ void __launch_bounds__(512) sm_copy(uint4* dst, const uint4* src, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        dst[i] = a;
        dst[i + stride] = b;
        dst[i + 2 * stride] = c;
        dst[i + 3 * stride] = d;
    }
    for (; i < n; i += stride) dst[i] = src[i];
}

// out = a + b over floats (a local reduction, to see what it costs the links).
__global__ void __launch_bounds__(512) sm_add(float4* out, const float4* a, const float4* b, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float4 x = a[i], y = b[i];
        out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}

static double now_us() {
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

static cudaStream_t st[2][4];

static void sync_all() {
    for (int g = 0; g < 2; g++) {
        CK(cudaSetDevice(g));
        for (int k = 0; k < 4; k++) CK(cudaStreamSynchronize(st[g][k]));
    }
}

static double timed(const std::function<void()>& f) {
    std::vector<double> v;
    for (int it = 0; it < 9; it++) {
        sync_all();
        double t0 = now_us();
        f();
        sync_all();
        if (it >= 2) v.push_back(now_us() - t0);
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static void report(const char* name, size_t bytes, double us) {
    printf("%-34s %12zu %10.1f %8.1f\n", name, bytes, us, bytes / us / 1e3);
    fflush(stdout);
}

int main(int argc, char** argv) {
    size_t big = (argc > 1 ? strtoull(argv[1], nullptr, 10) : 1024) << 20;
    int n;
    CK(cudaGetDeviceCount(&n));
    if (n < 2) {
        printf("SKIP: %d GPU(s), the probe needs 2\n", n);
        return 0;
    }
    char *src[2], *dst[2], *tmp[2];
    for (int g = 0; g < 2; g++) {
        CK(cudaSetDevice(g));
        CK(cudaDeviceEnablePeerAccess(1 - g, 0));
        CK(cudaMalloc(&src[g], big));
        CK(cudaMalloc(&dst[g], big));
        CK(cudaMalloc(&tmp[g], big));
        CK(cudaMemset(src[g], 1 + g, big));
        CK(cudaMemset(dst[g], 0, big));
        for (int k = 0; k < 4; k++) CK(cudaStreamCreateWithFlags(&st[g][k], cudaStreamNonBlocking));
    }
    printf("%-34s %12s %10s %8s\n", "what", "bytes", "us", "GB/s");

    for (size_t bytes : {big / 8, big}) {
        // Copy engine, one way: pushed by GPU 0's stream, pulled by GPU 1's.
        report("ce_push_one_way", bytes, timed([&] {
                   CK(cudaSetDevice(0));
                   CK(cudaMemcpyAsync(dst[1], src[0], bytes, cudaMemcpyDefault, st[0][0]));
               }));
        report("ce_pull_one_way", bytes, timed([&] {
                   CK(cudaSetDevice(1));
                   CK(cudaMemcpyAsync(dst[1], src[0], bytes, cudaMemcpyDefault, st[1][0]));
               }));
        // Both ways at once.
        report("ce_push_both_ways", bytes, timed([&] {
                   for (int g = 0; g < 2; g++) {
                       CK(cudaSetDevice(g));
                       CK(cudaMemcpyAsync(dst[1 - g], src[g], bytes, cudaMemcpyDefault, st[g][0]));
                   }
               }));
        report("ce_pull_both_ways", bytes, timed([&] {
                   for (int g = 0; g < 2; g++) {
                       CK(cudaSetDevice(g));
                       CK(cudaMemcpyAsync(dst[g], src[1 - g], bytes, cudaMemcpyDefault, st[g][0]));
                   }
               }));
        // Both ways, each split over 2 and 4 streams (more engines?).
        for (int ns : {2, 4}) {
            char name[64];
            snprintf(name, sizeof name, "ce_push_both_ways_%dstreams", ns);
            report(name, bytes, timed([&] {
                       for (int g = 0; g < 2; g++) {
                           CK(cudaSetDevice(g));
                           size_t part = bytes / ns;
                           for (int k = 0; k < ns; k++)
                               CK(cudaMemcpyAsync(dst[1 - g] + k * part, src[g] + k * part, part,
                                                  cudaMemcpyDefault, st[g][k]));
                       }
                   }));
        }
        // Both ways in 16 MiB and 4 MiB pieces on one stream (a pipeline's cost).
        for (size_t piece : {(size_t)16 << 20, (size_t)4 << 20}) {
            char name[64];
            snprintf(name, sizeof name, "ce_push_both_ways_%zuMiB_pieces", piece >> 20);
            report(name, bytes, timed([&] {
                       for (int g = 0; g < 2; g++) {
                           CK(cudaSetDevice(g));
                           for (size_t o = 0; o < bytes; o += piece)
                               CK(cudaMemcpyAsync(dst[1 - g] + o, src[g] + o, std::min(piece, bytes - o),
                                                  cudaMemcpyDefault, st[g][0]));
                       }
                   }));
        }
        // SMs writing to / reading from the peer, both ways, by grid size.
        for (int blocks : {16, 24, 32, 64, 132}) {
            char name[64];
            snprintf(name, sizeof name, "sm_write_both_ways_%dblocks", blocks);
            report(name, bytes, timed([&] {
                       for (int g = 0; g < 2; g++) {
                           CK(cudaSetDevice(g));
                           sm_copy<<<blocks, 512, 0, st[g][0]>>>((uint4*)dst[1 - g], (const uint4*)src[g],
                                                                 bytes / 16);
                       }
                   }));
            snprintf(name, sizeof name, "sm_read_both_ways_%dblocks", blocks);
            report(name, bytes, timed([&] {
                       for (int g = 0; g < 2; g++) {
                           CK(cudaSetDevice(g));
                           sm_copy<<<blocks, 512, 0, st[g][0]>>>((uint4*)dst[g], (const uint4*)src[1 - g],
                                                                 bytes / 16);
                       }
                   }));
        }
        // Copy engine both ways while 16 SMs add two local arrays of the same
        // size (the reduction a copy-engine reduce-scatter would need).
        report("ce_both_ways+local_add_16blocks", bytes, timed([&] {
                   for (int g = 0; g < 2; g++) {
                       CK(cudaSetDevice(g));
                       CK(cudaMemcpyAsync(dst[1 - g], src[g], bytes, cudaMemcpyDefault, st[g][0]));
                       sm_add<<<16, 512, 0, st[g][1]>>>((float4*)tmp[g], (const float4*)src[g],
                                                        (const float4*)tmp[g], bytes / 16);
                   }
               }));
        report("local_add_16blocks_alone", bytes, timed([&] {
                   for (int g = 0; g < 2; g++) {
                       CK(cudaSetDevice(g));
                       sm_add<<<16, 512, 0, st[g][1]>>>((float4*)tmp[g], (const float4*)src[g],
                                                        (const float4*)tmp[g], bytes / 16);
                   }
               }));
        report("local_add_32blocks_alone", bytes, timed([&] {
                   for (int g = 0; g < 2; g++) {
                       CK(cudaSetDevice(g));
                       sm_add<<<32, 512, 0, st[g][1]>>>((float4*)tmp[g], (const float4*)src[g],
                                                        (const float4*)tmp[g], bytes / 16);
                   }
               }));
        // Copy engine both ways while 32 SMs write the other way too.
        report("ce_both_ways+sm_write_32blocks", bytes, timed([&] {
                   size_t h = bytes / 2;
                   for (int g = 0; g < 2; g++) {
                       CK(cudaSetDevice(g));
                       CK(cudaMemcpyAsync(dst[1 - g], src[g], h, cudaMemcpyDefault, st[g][0]));
                       sm_copy<<<32, 512, 0, st[g][1]>>>((uint4*)(dst[1 - g] + h), (const uint4*)(src[g] + h),
                                                         h / 16);
                   }
               }));
        // A local copy by the copy engine.
        report("ce_local_copy", bytes, timed([&] {
                   CK(cudaSetDevice(0));
                   CK(cudaMemcpyAsync(dst[0], src[0], bytes, cudaMemcpyDefault, st[0][0]));
               }));
    }

    // Stream memory operations as a barrier: GPU 0 writes a value into GPU 1's
    // memory and waits for GPU 1's answer in its own, 1000 round trips.
    CUdeviceptr flag[2];
    for (int g = 0; g < 2; g++) {
        CK(cudaSetDevice(g));
        CK(cudaMalloc((void**)&flag[g], 64));
        CK(cudaMemset((void*)flag[g], 0, 64));
    }
    sync_all();
    int rounds = 1000;
    double t0 = now_us();
    for (int i = 1; i <= rounds; i++) {
        CK(cudaSetDevice(0));
        CU(cuStreamWriteValue64((CUstream)st[0][0], flag[1], i, CU_STREAM_WRITE_VALUE_DEFAULT));
        CU(cuStreamWaitValue64((CUstream)st[0][0], flag[0], i, CU_STREAM_WAIT_VALUE_GEQ));
        CK(cudaSetDevice(1));
        CU(cuStreamWaitValue64((CUstream)st[1][0], flag[1], i, CU_STREAM_WAIT_VALUE_GEQ));
        CU(cuStreamWriteValue64((CUstream)st[1][0], flag[0], i, CU_STREAM_WRITE_VALUE_DEFAULT));
    }
    sync_all();
    report("streamop_round_trip", 8, (now_us() - t0) / rounds);
    // The same barrier around a 1 MiB copy each way (a pipeline step's fixed cost).
    t0 = now_us();
    for (int i = rounds + 1; i <= 2 * rounds; i++) {
        for (int g = 0; g < 2; g++) {
            CK(cudaSetDevice(g));
            CU(cuStreamWriteValue64((CUstream)st[g][0], flag[1 - g], i, CU_STREAM_WRITE_VALUE_DEFAULT));
            CU(cuStreamWaitValue64((CUstream)st[g][0], flag[g], i, CU_STREAM_WAIT_VALUE_GEQ));
            CK(cudaMemcpyAsync(dst[1 - g], src[g], 1 << 20, cudaMemcpyDefault, st[g][0]));
        }
    }
    sync_all();
    report("streamop_barrier+1MiB_copy", 1 << 20, (now_us() - t0) / rounds);
    printf("done\n");
    return 0;
}
