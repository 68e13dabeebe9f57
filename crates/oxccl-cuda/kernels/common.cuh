// oxccl kernels: shared device helpers. Compiled by NVRTC with no include
// paths: NVRTC 13.0 has no built-in cuda_fp16.h/cuda_bf16.h/cuda_fp8.h (checked:
// "could not open source file cuda_fp16.h"), so the narrow-float conversions
// below are single PTX `cvt` instructions (fp8 ones need sm_89 or newer).
#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;

// Flags live in device memory from cuMemAlloc. The peer writes our flag word
// through its peer mapping with a system-scope release; we poll it with a
// system-scope acquire, so everything the peer did before the release
// (finishing its reads of our buffers, or having its input ready) is visible
// to us after the acquire.
__device__ __forceinline__ void st_release_sys(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u64 ld_acquire_sys(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Programmatic dependent launch (sm_90+; host side: device.rs, launch_raw).
// Every oxccl kernel starts with kernel_entry(): it waits until the kernel
// before it in the stream has finished and its writes are visible (a no-op
// when this launch was not programmatic, or on older GPUs), and then lets
// the next programmatic launch start its blocks. So the next collective's
// launch (block scheduling, parameter fetch: ~1-2 us back to back) overlaps
// this one's work instead of following its end, and nothing of ours touches
// memory before the previous kernel is complete. A trigger this early is
// safe for any later kernel: a programmatic launch must itself wait
// (griddepcontrol.wait) before it reads what we write.
__device__ __forceinline__ void kernel_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// One check of a wait's bounds (every 1024 polls): the ring's control words
// `w` (host-mapped: [0] abort, [1] error, [2] peer, [3] block) and `limit`
// ns (0: none) since the first check, `t0`. Returns 0 to go on, else the
// code it recorded (1 timeout, 2 abort, as the ring's RERR_*) with the peer
// and block, unless another wait recorded an error first.
__device__ __forceinline__ u32 wait_check(u32* w, u64 limit, u64& t0, u32 peer) {
    u32 code = 0;
    if (((volatile u32*)w)[0] != 0 || ((volatile u32*)w)[1] != 0) {
        code = 2;
    } else {
        u64 now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (t0 == 0) {
            t0 = now;
        } else if (limit != 0 && now - t0 > limit) {
            code = 1;
        }
    }
    if (code != 0 && atomicCAS(w + 1, 0u, code) == 0u) {
        w[2] = peer;
        w[3] = blockIdx.x;
        __threadfence_system();
    }
    return code;
}

// Where a pair kernel's waits report: `ctl[0]` the ring's host-mapped
// control words (as a u64; ring.cu's RingCommon.ctrl: [0] abort, [1] error,
// [2] peer, [3] block), `ctl[1]` the timeout in ns. Both 0 (no ring set up):
// the waits have no bound, as before the ring existed.
// Thread 0: waits until *p >= v; false on the host's abort, an error already
// recorded, or the timeout (then recorded: code 1 timeout, 2 abort, as the
// ring's RERR_*). The control words are read every 1024 polls (a poll of
// local memory is ~0.5 us, so an abort is seen within about a millisecond).
__device__ __forceinline__ bool pair_wait(const u64* p, u64 v, const u64* ctl, u32 peer) {
    u64 spins = 0, t0 = 0;
    while (ld_acquire_sys(p) < v) {
        if ((++spins & 1023) != 0) continue;
        const u64 c = *(const volatile u64*)ctl;
        if (c == 0) continue;
        if (wait_check((u32*)c, ((const volatile u64*)ctl)[1], t0, peer) != 0) return false;
    }
    return true;
}

__device__ __forceinline__ u32 ld_acquire_sys32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Thread 0: waits until the 32-bit *p >= v within the bounds of wait_check
// (`w` never null); false when it gave up. The pushed reductions' counters
// are 32-bit halves, one per copy stream (allreduce.cu, CerArgs).
__device__ __forceinline__ bool ctl_wait(const u32* p, u32 v, u32* w, u64 limit, u32 peer) {
    u64 spins = 0, t0 = 0;
    while (ld_acquire_sys32(p) < v) {
        if ((++spins & 1023) != 0) continue;
        if (wait_check(w, limit, t0, peer) != 0) return false;
    }
    return true;
}

// A barrier between block b of this GPU and block b of the peer GPU.
// Values only grow (a 64-bit sequence), so a wait for `v` is `>= v` and a
// fast peer that already wrote v+1 does not stall us. False (for the whole
// block) when the wait gave up (pair_wait).
__device__ __forceinline__ bool pair_barrier(u64* my_flag, u64* peer_flag, u64 v, const u64* ctl,
                                             u32 peer) {
    __shared__ int ok;
    __syncthreads();  // the whole block's reads and writes come before the signal
    if (threadIdx.x == 0) {
        __threadfence_system();
        st_release_sys(peer_flag, v);
        ok = pair_wait(my_flag, v, ctl, peer);
    }
    __syncthreads();  // nobody touches peer data before thread 0 saw the peer's signal
    return ok != 0;
}

// float16 <-> float32 (round to nearest even).
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// bfloat16 <-> float32: decoding is exact (the top half of a float).
__device__ __forceinline__ float bf16_to_f32(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// fp8 (OCP e4m3 "fn" and e5m2) <-> float32, through f16 (exact for both).
// Encoding is round to nearest even with saturation to the largest finite
// value (NVIDIA's __NV_SATFINITE), NaN stays NaN.
__device__ __forceinline__ float e4m3_to_f32(unsigned char v) {
    unsigned int h2;
    unsigned short in = v;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
    return f16_to_f32((unsigned short)(h2 & 0xffff));
}
__device__ __forceinline__ float e5m2_to_f32(unsigned char v) {
    unsigned int h2;
    unsigned short in = v;
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(in));
    return f16_to_f32((unsigned short)(h2 & 0xffff));
}
__device__ __forceinline__ unsigned char f32_to_e4m3(float f) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f));
    return (unsigned char)(r & 0xff);
}
__device__ __forceinline__ unsigned char f32_to_e5m2(float f) {
    unsigned short r;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f));
    return (unsigned char)(r & 0xff);
}
