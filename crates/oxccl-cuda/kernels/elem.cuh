// oxccl kernels: element types and reduction operators shared by the
// two-GPU kernels (allreduce.cu) and the ring kernels (ring.cu).
#pragma once
#include "common.cuh"

enum { OP_SUM = 0, OP_PROD = 1, OP_MAX = 2, OP_MIN = 3, OP_AVG = 4, OP_PREMULSUM = 5 };

// Element traits: S is the storage type, A the arithmetic (accumulation) type.
template <typename S_, typename U_>
struct IntE {
    typedef S_ S;
    typedef S_ A;
    typedef U_ U;  // wrapping arithmetic is done in this unsigned type
    static constexpr bool is_float = false;
};
struct F32E {
    typedef float S;
    typedef float A;
    static constexpr bool is_float = true;
    static __device__ __forceinline__ A load(S s) { return s; }
    static __device__ __forceinline__ S store(A a) { return a; }
};
struct F64E {
    typedef double S;
    typedef double A;
    static constexpr bool is_float = true;
    static __device__ __forceinline__ A load(S s) { return s; }
    static __device__ __forceinline__ S store(A a) { return a; }
};
struct F16E {
    typedef unsigned short S;
    typedef float A;
    static constexpr bool is_float = true;
    static __device__ __forceinline__ A load(S s) { return f16_to_f32(s); }
    static __device__ __forceinline__ S store(A a) { return f32_to_f16(a); }
};
struct BF16E {
    typedef unsigned short S;
    typedef float A;
    static constexpr bool is_float = true;
    static __device__ __forceinline__ A load(S s) { return bf16_to_f32(s); }
    static __device__ __forceinline__ S store(A a) { return f32_to_bf16(a); }
};
struct E4M3E {
    typedef unsigned char S;
    typedef float A;
    static constexpr bool is_float = true;
    static __device__ __forceinline__ A load(S s) { return e4m3_to_f32(s); }
    static __device__ __forceinline__ S store(A a) { return f32_to_e4m3(a); }
};
struct E5M2E {
    typedef unsigned char S;
    typedef float A;
    static constexpr bool is_float = true;
    static __device__ __forceinline__ A load(S s) { return e5m2_to_f32(s); }
    static __device__ __forceinline__ S store(A a) { return f32_to_e5m2(a); }
};

// Products that are never contracted into an FMA with a following add
// (NVRTC contracts by default): the pre-multiplied inputs of avg/PreMulSum
// must round like the host reference's separate multiply and add.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float amax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double amax(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float amin(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double amin(double a, double b) { return fmin(a, b); }

// Units (16-byte packs or elements) a thread moves per round of a copy loop.
#define OXCCL_UNROLL 4

// Loads that bypass L1 (peer data must not come from a stale line).
__device__ __forceinline__ uint4 ldcg(const uint4* p) { return __ldcg(p); }
template <typename S>
__device__ __forceinline__ S ldcg(const S* p) {
    return *(const volatile S*)p;
}

typedef IntE<signed char, unsigned int> I8E;
typedef IntE<unsigned char, unsigned int> U8E;
typedef IntE<int, unsigned int> I32E;
typedef IntE<unsigned int, unsigned int> U32E;
typedef IntE<long long, unsigned long long> I64E;
typedef IntE<unsigned long long, unsigned long long> U64E;

// dst[0..n) = src[0..n) by `blocks` blocks, this one being number `block`
// of them: 16-byte packs when src and dst have the same offset modulo 16
// (bytes before the first pack by block 0), else bytes.
__device__ __forceinline__ void copy_bytes_by(char* dst, const char* src, u64 n, u32 block,
                                              u32 blocks) {
    if (n == 0 || dst == src) return;
    const u64 stride = (u64)blockDim.x * blocks;
    const u64 tid = (u64)block * blockDim.x + threadIdx.x;
    if ((((u64)dst ^ (u64)src) & 15) != 0) {
        for (u64 i = tid; i < n; i += stride) dst[i] = *(const volatile char*)(src + i);
        return;
    }
    u64 head = (16 - ((u64)dst & 15)) & 15;
    if (head > n) head = n;
    const u64 packs = (n - head) / 16;
    const uint4* s4 = (const uint4*)(src + head);
    uint4* d4 = (uint4*)(dst + head);
    for (u64 base = tid; base < packs; base += stride * OXCCL_UNROLL) {
        uint4 v[OXCCL_UNROLL];
#pragma unroll
        for (int j = 0; j < OXCCL_UNROLL; j++) {
            const u64 i = base + (u64)j * stride;
            if (i < packs) v[j] = ldcg(s4 + i);
        }
#pragma unroll
        for (int j = 0; j < OXCCL_UNROLL; j++) {
            const u64 i = base + (u64)j * stride;
            if (i < packs) d4[i] = v[j];
        }
    }
    if (block == 0) {
        for (u64 i = threadIdx.x; i < head; i += blockDim.x)
            dst[i] = *(const volatile char*)(src + i);
        for (u64 i = head + packs * 16 + threadIdx.x; i < n; i += blockDim.x)
            dst[i] = *(const volatile char*)(src + i);
    }
}

// dst[0..n) = src[0..n) over the whole grid (copy_bytes_by).
__device__ __forceinline__ void copy_bytes(char* dst, const char* src, u64 n) {
    copy_bytes_by(dst, src, n, blockIdx.x, gridDim.x);
}
