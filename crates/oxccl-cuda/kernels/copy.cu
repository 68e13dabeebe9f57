// Device copy: dst[0..bytes) = src[0..bytes). Either side may be a peer
// pointer. 16-byte accesses when both are 16-byte aligned, else bytes.
// Bandwidth-bound: reads S, writes S; a grid-stride loop so any grid size works.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(512) oxccl_copy(void* dst, const void* src, u64 bytes) {
    kernel_entry();
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 done = 0;
    if ((((unsigned long long)dst | (unsigned long long)src) & 15) == 0) {
        const u64 nvec = bytes / 16;
        const uint4* s = (const uint4*)src;
        uint4* d = (uint4*)dst;
        for (u64 i = tid; i < nvec; i += stride) d[i] = __ldcg(s + i);
        done = nvec * 16;
    }
    const unsigned char* s = (const unsigned char*)src;
    unsigned char* d = (unsigned char*)dst;
    for (u64 i = done + tid; i < bytes; i += stride) d[i] = s[i];
}
