// One-shot all-reduce for two GPUs with peer-mapped buffers.
//
// Each GPU runs the same grid (both sides compute it from count and type).
// Block b of GPU r and block b of the peer form a pair that owns the same
// slices of the buffer. A pair meets at a flag barrier (common.cuh), then each
// side reads both inputs (its own and the peer's, through the peer mapping),
// reduces them in rank order (x0 op x1, so both GPUs produce the same bits)
// and writes its own output.
//
// Each GPU's launch knows only its own buffers: the peer's input pointer
// travels through a mailbox next to the flags. At the entry barrier block b
// writes {its input pointer, its bits} into the peer's mailbox slot b, then
// releases the peer's flag b; after acquiring its own flag it reads the
// peer's slot. So the two launches are independent (no host matching, no
// host round trip): each GPU's n-th call meets the peer's n-th call.
// A mailbox slot is rewritten only by the peer's next call, whose entry comes
// after this call's last barrier, which this block signals only after it read
// the slot.
//
// Both sides must take the same protocol: the bits say "my pointers are not
// 16-byte aligned" (then both move single elements) and "I work in place"
// (then both use the in-place protocol, also safe out of place).
//
// Cost per GPU: reads 2S (S local + S over NVLink), writes S, 2 barriers
// (entry: the peer's input is ready; exit: the peer finished reading ours, so
// the caller may overwrite it once the kernel returns). Floor: one launch
// (~4 us) plus one NVLink round trip for small messages; S / (peer-read
// bandwidth, ~370 GB/s measured) for large ones.
//
// In place (out aliases the local input) a round loads its values into
// registers, meets the peer again (the peer has loaded them too), and only
// then stores, so nobody reads a value the owner already overwrote.
//
// Barrier values: the host passes `seq`, the first value of this call, and
// moves its counter past seq + rounds + 3, an upper bound on the barriers any
// block does here, so values on every flag word only grow (an epoch counter:
// a flag left by an earlier call can never satisfy a later call's wait).
#include "common.cuh"

// Flag words per GPU; the mailbox (2 words per block) follows them.
#define OXCCL_MAX_BLOCKS 128

struct ArArgs {
    const void* in;    // this GPU's input
    void* out;         // this GPU's output
    u64* my_flags;     // this GPU's flags + mailbox (written by the peer)
    u64* peer_flags;   // the peer's flags + mailbox (through the peer mapping)
    u64 count;         // elements
    u64 seq;           // first barrier value of this call
    double scale;      // float avg: the pre-multiplier (1 / nranks)
    u32 nranks;        // integer avg divides by this
    u32 rank;          // 0 or 1: which input is x0
};

enum { OP_SUM = 0, OP_PROD = 1, OP_MAX = 2, OP_MIN = 3, OP_AVG = 4 };

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

__device__ __forceinline__ float amax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double amax(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float amin(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double amin(double a, double b) { return fmin(a, b); }

// x0 op x1 with NCCL's semantics (see oxccl-core's reduce.rs): integers wrap,
// narrow floats compute in f32, float avg pre-multiplies each input by
// 1/nranks (rounded to the storage type), integer avg divides the wrapped sum.
template <typename E, int OP>
__device__ __forceinline__ typename E::S red2(typename E::S x0, typename E::S x1,
                                              typename E::A scale, u32 nranks) {
    typedef typename E::S S;
    if constexpr (E::is_float) {
        if constexpr (OP == OP_SUM) return E::store(E::load(x0) + E::load(x1));
        if constexpr (OP == OP_PROD) return E::store(E::load(x0) * E::load(x1));
        if constexpr (OP == OP_MAX) return E::store(amax(E::load(x0), E::load(x1)));
        if constexpr (OP == OP_MIN) return E::store(amin(E::load(x0), E::load(x1)));
        if constexpr (OP == OP_AVG) {
            S p0 = E::store(E::load(x0) * scale);
            S p1 = E::store(E::load(x1) * scale);
            return E::store(E::load(p0) + E::load(p1));
        }
    } else {
        typedef typename E::U U;
        if constexpr (OP == OP_SUM) return (S)((U)x0 + (U)x1);
        if constexpr (OP == OP_PROD) return (S)((U)x0 * (U)x1);
        if constexpr (OP == OP_MAX) return x0 > x1 ? x0 : x1;
        if constexpr (OP == OP_MIN) return x0 < x1 ? x0 : x1;
        if constexpr (OP == OP_AVG) {
            S s = (S)((U)x0 + (U)x1);
            return (S)(s / (S)nranks);
        }
    }
    return x0;  // unreachable
}

// Loads that bypass L1 (peer data must not come from a stale line).
__device__ __forceinline__ uint4 ldcg(const uint4* p) { return __ldcg(p); }
template <typename S>
__device__ __forceinline__ S ldcg(const S* p) {
    return *(const volatile S*)p;
}

// A unit is what one thread moves at once: a 16-byte pack, or one element.
template <typename E, int OP>
__device__ __forceinline__ uint4 red_unit(uint4 a, uint4 b, typename E::A scale, u32 nranks) {
    typedef typename E::S S;
    constexpr int N = 16 / sizeof(S);
    union P {
        uint4 v;
        S e[N];
    };
    P ua, ub, uo;
    ua.v = a;
    ub.v = b;
#pragma unroll
    for (int i = 0; i < N; i++) uo.e[i] = red2<E, OP>(ua.e[i], ub.e[i], scale, nranks);
    return uo.v;
}
template <typename E, int OP>
__device__ __forceinline__ typename E::S red_unit(typename E::S a, typename E::S b,
                                                  typename E::A scale, u32 nranks) {
    return red2<E, OP>(a, b, scale, nranks);
}

#define OXCCL_UNROLL 2

// Rounds over `n` units: each thread takes OXCCL_UNROLL units per round.
// Every block runs the same number of rounds (barriers must pair up).
template <typename E, int OP, typename Unit>
__device__ __forceinline__ void ar_rounds(const Unit* x0, const Unit* x1, Unit* o, u64 n,
                                          const ArArgs& a, bool inplace, u64& seq, u64* myf,
                                          u64* pf) {
    typedef typename E::A A;
    const A scale = (A)a.scale;
    const u64 per_block = (u64)blockDim.x * OXCCL_UNROLL;
    const u64 per_round = per_block * gridDim.x;
    const u64 rounds = (n + per_round - 1) / per_round;
    for (u64 k = 0; k < rounds; k++) {
        const u64 base = k * per_round + blockIdx.x * per_block + threadIdx.x;
        Unit v0[OXCCL_UNROLL], v1[OXCCL_UNROLL];
#pragma unroll
        for (int j = 0; j < OXCCL_UNROLL; j++) {
            const u64 i = base + (u64)j * blockDim.x;
            if (i < n) {
                v0[j] = ldcg(x0 + i);
                v1[j] = ldcg(x1 + i);
            }
        }
        if (inplace) pair_barrier(myf, pf, seq++);
#pragma unroll
        for (int j = 0; j < OXCCL_UNROLL; j++) {
            const u64 i = base + (u64)j * blockDim.x;
            if (i < n) o[i] = red_unit<E, OP>(v0[j], v1[j], scale, a.nranks);
        }
    }
}

template <typename E, int OP>
__device__ __forceinline__ void one_shot(const ArArgs& a) {
    typedef typename E::S S;
    __shared__ u64 peer_box[2];
    u64* myf = a.my_flags + blockIdx.x;
    u64* pf = a.peer_flags + blockIdx.x;
    u64 seq = a.seq;
    const u64 my_bits = ((((u64)a.in | (u64)a.out) & 15) != 0 ? 1ull : 0ull) |
                        (a.in == (const void*)a.out ? 2ull : 0ull);
    // Entry: post our input pointer in the peer's mailbox, then meet the peer
    // (its input is ready, and its pointer is in our mailbox).
    if (threadIdx.x == 0) {
        volatile u64* box = (volatile u64*)(a.peer_flags + OXCCL_MAX_BLOCKS + 2 * blockIdx.x);
        box[0] = (u64)a.in;
        box[1] = my_bits;
        __threadfence_system();
        st_release_sys(pf, seq);
        while (ld_acquire_sys(myf) < seq) {
        }
        const volatile u64* mine =
            (const volatile u64*)(a.my_flags + OXCCL_MAX_BLOCKS + 2 * blockIdx.x);
        peer_box[0] = mine[0];
        peer_box[1] = mine[1];
    }
    __syncthreads();
    seq++;
    const void* peer_in = (const void*)peer_box[0];
    const u64 bits = my_bits | peer_box[1];
    const bool vec = (bits & 1) == 0;
    const bool inplace = (bits & 2) != 0;
    const void* in0 = a.rank == 0 ? a.in : peer_in;
    const void* in1 = a.rank == 0 ? peer_in : a.in;
    if (vec) {
        constexpr u64 N = 16 / sizeof(S);
        const u64 nvec = a.count / N;
        ar_rounds<E, OP, uint4>((const uint4*)in0, (const uint4*)in1, (uint4*)a.out, nvec, a,
                                inplace, seq, myf, pf);
        const u64 tail = a.count - nvec * N;  // fewer than N elements, done by block 0
        if (tail != 0 && blockIdx.x == 0) {
            const S* x0 = (const S*)in0 + nvec * N;
            const S* x1 = (const S*)in1 + nvec * N;
            S* o = (S*)a.out + nvec * N;
            S v0 = S(), v1 = S();
            if (threadIdx.x < tail) {
                v0 = ldcg(x0 + threadIdx.x);
                v1 = ldcg(x1 + threadIdx.x);
            }
            if (inplace) pair_barrier(myf, pf, seq++);
            if (threadIdx.x < tail)
                o[threadIdx.x] = red2<E, OP>(v0, v1, (typename E::A)a.scale, a.nranks);
        }
    } else {
        ar_rounds<E, OP, S>((const S*)in0, (const S*)in1, (S*)a.out, a.count, a, inplace, seq,
                            myf, pf);
    }
    if (!inplace) pair_barrier(myf, pf, seq++);  // exit: the peer is done with our input
}

typedef IntE<signed char, unsigned int> I8E;
typedef IntE<unsigned char, unsigned int> U8E;
typedef IntE<int, unsigned int> I32E;
typedef IntE<unsigned int, unsigned int> U32E;
typedef IntE<long long, unsigned long long> I64E;
typedef IntE<unsigned long long, unsigned long long> U64E;

#define OXCCL_AR1(TN, E, ON, OP)                                                         \
    extern "C" __global__ void __launch_bounds__(512) oxccl_ar1_##TN##_##ON(ArArgs a) { \
        one_shot<E, OP>(a);                                                              \
    }
#define OXCCL_AR1_ALL_OPS(TN, E)      \
    OXCCL_AR1(TN, E, sum, OP_SUM)     \
    OXCCL_AR1(TN, E, prod, OP_PROD)   \
    OXCCL_AR1(TN, E, max, OP_MAX)     \
    OXCCL_AR1(TN, E, min, OP_MIN)     \
    OXCCL_AR1(TN, E, avg, OP_AVG)

OXCCL_AR1_ALL_OPS(i8, I8E)
OXCCL_AR1_ALL_OPS(u8, U8E)
OXCCL_AR1_ALL_OPS(i32, I32E)
OXCCL_AR1_ALL_OPS(u32, U32E)
OXCCL_AR1_ALL_OPS(i64, I64E)
OXCCL_AR1_ALL_OPS(u64, U64E)
OXCCL_AR1_ALL_OPS(f16, F16E)
OXCCL_AR1_ALL_OPS(f32, F32E)
OXCCL_AR1_ALL_OPS(f64, F64E)
OXCCL_AR1_ALL_OPS(bf16, BF16E)
OXCCL_AR1_ALL_OPS(e4m3, E4M3E)
OXCCL_AR1_ALL_OPS(e5m2, E5M2E)
