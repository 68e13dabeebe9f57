// Ring collectives and point-to-point transfers over FIFO connections: any
// number of ranks, in one process or one process per GPU, through peer
// device memory (CUDA IPC or a peer mapping) or through host memory
// (NCCL_P2P_DISABLE=1, or no peer-to-peer path).
//
// Memory. Each rank owns a *window* (device memory from cuMemAlloc, shared
// with the other processes by an IPC handle; or pinned host memory shared
// through /dev/shm). The window holds one region per (other rank, channel):
//
//   +0    tail: how many slots the other rank has filled (written by it)
//   +128  head: how many of *our* slots the other rank has drained (written by it)
//   +256  LL head: the same for our low-latency slots
//   +288  barrier (channel 0 only): how many barriers the other rank entered
//   +296  pushed reduction (channel 0 only, xp.rs): pieces the other rank's copy
//         stream landed (u64), then the reducing kernel's block counter (u32)
//   +308  in-place reduce-scatter pushed into the other rank's scratch ring
//         (channel 0 only): pieces the other rank's kernel reduced (u32)
//   +312  in-place pushed reduction (channel 0 only): pieces the other rank's
//         copy stream pushed (u64; ce_reduce.rs plan_pushed_in_place)
//   +320  the byte count of each slot (read by the network proxy)
//   +384  nslots slots of `slot` bytes: data the other rank sends us
//   then  ll_nslots low-latency slots of `ll_bytes` (see "LL" below)
//
// So a sender writes data and its tail into the receiver's window, and the
// receiver writes its head into the sender's window: every flag is polled in
// the poller's own window and written remotely (a remote write is posted, a
// remote read is a round trip). The counts live on the GPU between calls
// (RingArgs.state, device-local), so a launch needs no host bookkeeping and
// replays under CUDA graphs: they only grow, and the two ends of a connection
// advance them by the same number of steps per call (both compute the same
// chunking from the same count, type and channel count).
//
// Blocks. Block c of a collective is channel c: it runs the whole ring
// algorithm on its contiguous part of the buffer, one slot per step. A step
// waits (thread 0) for the incoming slot and for a free outgoing slot, the
// block moves the data (reducing on the way), then thread 0 publishes the
// outgoing tail (after a system fence) and the incoming head.
//
// Waits observe the host's abort word and a timeout (host-mapped control
// words, RingArgs.ctrl): a peer that never comes ends the kernel with an
// error the host reports through ncclCommGetAsyncError, never a hang.
#include "elem.cuh"

enum {
    KERNEL_ALLREDUCE_RING_SIMPLE = 0,
    KERNEL_REDUCE_SCATTER_RING_SIMPLE = 1,
    KERNEL_ALLGATHER_RING_SIMPLE = 2,
    KERNEL_BROADCAST_RING_SIMPLE = 3,
    KERNEL_REDUCE_RING_SIMPLE = 4,
    KERNEL_ALLREDUCE_RING_LL = 5,
    KERNEL_ALLREDUCE_ONESHOT_LL = 6,
    KERNEL_ALLREDUCE_ONESHOT_SIMPLE = 7,
    KERNEL_ALLGATHER_ONESHOT_LL = 8,
    KERNEL_REDUCE_SCATTER_ONESHOT_LL = 9,
    KERNEL_BROADCAST_ONESHOT_LL = 10,
    KERNEL_REDUCE_ONESHOT_LL = 11,
    KERNEL_ALLREDUCE_TWOSHOT_LL = 12,
    KERNEL_ALLGATHER_ONESHOT_SIMPLE = 13,
    KERNEL_REDUCE_SCATTER_ONESHOT_SIMPLE = 14,
    KERNEL_ALLREDUCE_TWOSHOT_SIMPLE = 15
};
// Most ranks of the one-shot and two-shot kernels (a channel per peer in shared memory).
#define DIRECT_MAX_RANKS 8
enum { RERR_TIMEOUT = 1, RERR_ABORT = 2 };
#define RING_HDR 384
#define RING_HEAD 128
#define RING_LL_HEAD 256
#define RING_BAR 288
// u32 per Simple slot: its byte count, written before the tail (the network
// proxy sends only those bytes; see netproxy.rs).
#define RING_SIZES 320
#define RING_P2P_MAX_OPS 64
#define RING_P2P_MAX_ITEMS 16
// Units in flight per thread in a step's copy loop: 8 x 16 B x 512 threads =
// 64 KiB per block. With 4 (32 KiB) one block moved ~12 GB/s over NVLink
// (189 GB/s busbw with 16 channels against NCCL's 312): the loop is bound
// by load latency, so more loads in flight per thread is more bandwidth.
#define RING_UNROLL 8

struct RingCommon {
    const u64* peers;  // [2 x nranks] window addresses (see region_of)
    u64* state;        // [2][nranks][nch]: slots sent to / received from each rank
    u32* ctrl;         // host-mapped: [0] abort (host), [1] error, [2] peer, [3] channel
    const u32* order;  // [nranks] the rank at each ring position (topology's choice)
    u64 region;        // bytes per (rank, channel) region: RING_HDR + nslots * slot
    u64 slot;          // bytes per slot (a multiple of 16)
    u64 timeout_ns;    // a wait longer than this is an error (0: never)
    u32 nranks;
    u32 rank;
    u32 nch;           // channels of the window layout (launches use <= nch blocks)
    u32 nslots;
    u64 ll_bytes;      // bytes per low-latency slot (16-byte lines, half of them flags)
    u32 ll_nslots;
    u32 pos;           // this rank's ring position: order[pos] == rank
    const u64* data;   // [2 x nranks] Simple slots kept apart (see slots_of), or null
};

// The rank at ring position p (positions are what the ring's chunk
// arithmetic counts in; ranks name windows, counters and outputs).
__device__ __forceinline__ u32 ring_at(const RingCommon& c, u32 p) { return c.order[p]; }

// Counters in RingArgs.state: [kind][rank][channel], kind 0 Simple sent,
// 1 Simple received, 2 LL sent, 3 LL received, 4 barriers with the rank
// (channel 0 only).
__device__ __forceinline__ u64* counter(const RingCommon& c, u32 kind, u32 rank, u32 ch) {
    return c.state + ((u64)kind * c.nranks + rank) * c.nch + ch;
}

struct RingArgs {
    RingCommon c;
    const void* in;
    void* out;
    u64 count;         // all-reduce, reduce, broadcast: elements; RS/AG: per rank
    double scale;      // float avg / PreMulSum multiplier
    u64 iscale;        // integer PreMulSum multiplier
    u64 scalar_ptr;    // PreMulSum scalar in device memory, else 0
    u32 mode;          // KERNEL_* (oxccl_core::gpu::kernel::RingKernel::mode)
    u32 root;          // broadcast, reduce: the root's ring position
};

// Where (rank, channel) lives in `owner`'s window. `peers` holds 2 x nranks
// addresses: [0, n) each rank's window as this rank reaches it (mapped, or a
// network shadow), [n, 2n) where this rank's own regions for each other rank
// are (its device window for ranks of its host, its host window for ranks
// the network proxies serve, when both kinds are in one communicator).
// Only (owner = me, other) and (owner, other = me) are ever asked for.
__device__ __forceinline__ char* region_of(const RingCommon& c, u32 owner, u32 other, u32 ch) {
    const u32 idx = other < owner ? other : other - 1;
    const u64 base = owner == c.rank ? c.peers[c.nranks + other] : c.peers[owner];
    return (char*)base + ((u64)idx * c.nch + ch) * c.region;
}

// Where (owner, other, ch)'s Simple slots are: after the region's header,
// or, for a peer the network path serves with GPUDirect RDMA, in GPU memory
// of their own (`data`, indexed as `peers`; 0 where the slots follow the
// header; nch x nslots x slot bytes each) while the header stays in the
// host-mapped window the proxies watch.
__device__ __forceinline__ char* slots_of(const RingCommon& c, u32 owner, u32 other, u32 ch) {
    if (c.data) {
        const u64 d = owner == c.rank ? c.data[c.nranks + other] : c.data[owner];
        if (d) return (char*)d + (u64)ch * c.nslots * c.slot;
    }
    return region_of(c, owner, other, ch) + RING_HDR;
}

__device__ __forceinline__ u64 gtimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Records the first error (code, peer, channel) in the host-mapped words.
__device__ __forceinline__ void ring_fail(const RingCommon& c, u32 code, u32 peer) {
    if (atomicCAS(c.ctrl + 1, 0u, code) == 0u) {
        c.ctrl[2] = peer;
        c.ctrl[3] = blockIdx.x;
        __threadfence_system();
    }
}

__device__ __forceinline__ bool ring_stopped(const RingCommon& c) {
    const volatile u32* w = c.ctrl;
    return w[0] != 0 || w[1] != 0;
}

// Polls with relaxed loads and acquires once, after the value is there: an
// acquire per poll is a system-scope fence per poll, and 32 spinning blocks
// of those made a 2 MB all-reduce take 96 us where 8 blocks took 38
// (cost growing ~2.3 us per channel).
__device__ __forceinline__ u64 ld_relaxed_sys(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void st_relaxed_sys(u64* p, u64 v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Thread 0: waits until *p >= v; false on abort, another block's error or timeout.
// With `acquire`, one system-scope acquire load of *p once the relaxed polls
// see the value (it reads that store or a later one of the same peer), so
// the peer's writes before its release are visible to this block after the
// barrier that follows; a fence.acq_rel.sys there cost more: it also waits
// for this thread's own outstanding stores (the Simple ring's steps, 4 and 8
// ranks sharing one H200, 2026-12-01: ~1.5 us a step more). `acquire` false
// skips it: a wait for room in the peer's slots only orders our later
// stores after the peer's finished reads (a store does not pass the load it
// depends on; NCCL polls its heads the same way). `seen` gets the value.
__device__ __forceinline__ bool wait_ge(const RingCommon& c, const u64* p, u64 v, u32 peer,
                                        bool acquire = true, u64* seen = nullptr) {
    u64 spins = 0, t0 = 0, x = ld_relaxed_sys(p);
    if (x >= v) {
        if (acquire) (void)ld_acquire_sys(p);
        if (seen) *seen = x;
        return true;
    }
    while ((x = ld_relaxed_sys(p)) < v) {
        // One check of the host words every 1024 polls: a poll of local
        // memory is ~0.5 us, so an abort is seen within about a millisecond
        // without putting a PCIe read on every poll.
        if ((++spins & 1023) == 0) {
            if (ring_stopped(c)) {
                // The host's abort (ncclCommAbort, or its watchdog saw a
                // peer die): recorded so the host can say this wait ended.
                ring_fail(c, RERR_ABORT, peer);
                return false;
            }
            const u64 now = gtimer();
            if (t0 == 0) {
                t0 = now;
            } else if (c.timeout_ns != 0 && now - t0 > c.timeout_ns) {
                ring_fail(c, RERR_TIMEOUT, peer);
                return false;
            }
        }
    }
    if (acquire) (void)ld_acquire_sys(p);
    if (seen) *seen = x;
    return true;
}

// ---- Elementwise: v = recv (op) pre(in); out = post(v) ----

template <typename E, int OP>
__device__ __forceinline__ typename E::S rpre(typename E::S x, typename E::A s) {
    typedef typename E::S S;
    if constexpr (OP == OP_AVG || OP == OP_PREMULSUM) {
        if constexpr (E::is_float) {
            return E::store(mul_rn(E::load(x), s));
        } else if constexpr (OP == OP_PREMULSUM) {
            typedef typename E::U U;
            return (S)((U)x * (U)s);
        }
    }
    return x;
}

template <typename E, int OP>
__device__ __forceinline__ typename E::S rcomb(typename E::S a, typename E::S b) {
    typedef typename E::S S;
    if constexpr (E::is_float) {
        if constexpr (OP == OP_PROD) return E::store(E::load(a) * E::load(b));
        if constexpr (OP == OP_MAX) return E::store(amax(E::load(a), E::load(b)));
        if constexpr (OP == OP_MIN) return E::store(amin(E::load(a), E::load(b)));
        return E::store(E::load(a) + E::load(b));
    } else {
        typedef typename E::U U;
        if constexpr (OP == OP_PROD) return (S)((U)a * (U)b);
        if constexpr (OP == OP_MAX) return a > b ? a : b;
        if constexpr (OP == OP_MIN) return a < b ? a : b;
        return (S)((U)a + (U)b);
    }
}

template <typename E, int OP>
__device__ __forceinline__ typename E::S rpost(typename E::S x, u32 nranks) {
    typedef typename E::S S;
    if constexpr (!E::is_float && OP == OP_AVG) return (S)(x / (S)nranks);
    return x;
}

// What a step does with its operands.
enum { F_RECV = 1, F_IN = 2, F_PRE = 4, F_POST = 8 };

template <typename E, int OP>
__device__ __forceinline__ typename E::S relem(u32 f, typename E::S r, typename E::S b,
                                               typename E::A s, u32 nranks) {
    typename E::S v;
    if ((f & F_RECV) && (f & F_IN)) {
        v = rcomb<E, OP>(r, (f & F_PRE) ? rpre<E, OP>(b, s) : b);
    } else if (f & F_RECV) {
        v = r;
    } else {
        v = (f & F_PRE) ? rpre<E, OP>(b, s) : b;
    }
    return (f & F_POST) ? rpost<E, OP>(v, nranks) : v;
}

// f applied to each element of a pack (16 bytes, or an LL line's 8; of
// b's too: f(a_i, b_i)).
template <typename S, typename Pack, typename F>
__device__ __forceinline__ Pack per_elem(Pack a, Pack b, F f) {
    constexpr int N = sizeof(Pack) / sizeof(S);
    union P {
        Pack v;
        S e[N];
    };
    P x, y;
    x.v = a;
    y.v = b;
#pragma unroll
    for (int i = 0; i < N; i++) x.e[i] = f(x.e[i], y.e[i]);
    return x.v;
}

template <typename E, int OP>
__device__ __forceinline__ uint4 relem(u32 f, uint4 r, uint4 b, typename E::A s, u32 nranks) {
    typedef typename E::S S;
    return per_elem<S>(r, b, [&](S x, S y) { return relem<E, OP>(f, x, y, s, nranks); });
}

// o1[i] (if o1) and o2[i] (if o2) = relem(r[i], b[i]) for i in [0, n) units,
// by the whole block. Every load of an unrolled group comes before its stores.
template <typename E, int OP, typename Unit>
__device__ __forceinline__ void rmove(u32 f, const Unit* r, const Unit* b, Unit* o1, Unit* o2,
                                      u64 n, typename E::A s, u32 nranks) {
    const u64 stride = blockDim.x;
    for (u64 base = threadIdx.x; base < n; base += stride * RING_UNROLL) {
        Unit vr[RING_UNROLL], vb[RING_UNROLL];
#pragma unroll
        for (int j = 0; j < RING_UNROLL; j++) {
            const u64 i = base + (u64)j * stride;
            if (i < n) {
                if (f & F_RECV) vr[j] = ldcg(r + i);
                if (f & F_IN) vb[j] = ldcg(b + i);
            }
        }
#pragma unroll
        for (int j = 0; j < RING_UNROLL; j++) {
            const u64 i = base + (u64)j * stride;
            if (i < n) {
                const Unit v = relem<E, OP>(f, vr[j], vb[j], s, nranks);
                if (o1) o1[i] = v;
                if (o2) o2[i] = v;
            }
        }
    }
}

// n elements: 16-byte packs when every pointer is 16-byte aligned, the rest
// (or everything, when one is not) element by element.
template <typename E, int OP>
__device__ __forceinline__ void rmove_elems(u32 f, const void* r, const void* b, void* o1, void* o2,
                                            u64 n, typename E::A s, u32 nranks) {
    typedef typename E::S S;
    constexpr u64 N = 16 / sizeof(S);
    const u64 mis = ((f & F_RECV) ? (u64)r : 0) | ((f & F_IN) ? (u64)b : 0) | (u64)o1 | (u64)o2;
    u64 done = 0;
    if ((mis & 15) == 0) {
        const u64 packs = n / N;
        rmove<E, OP, uint4>(f, (const uint4*)r, (const uint4*)b, (uint4*)o1, (uint4*)o2, packs, s,
                            nranks);
        done = packs * N;
    }
    if (done < n) {
        rmove<E, OP, S>(f, (const S*)r + done, (const S*)b + done, o1 ? (S*)o1 + done : nullptr,
                        o2 ? (S*)o2 + done : nullptr, n - done, s, nranks);
    }
}

// A channel's two connections: from `prev` and to `next`.
struct Chan {
    const u64* rtail;  // mine: prev's tail
    const char* rdata; // mine: prev's slots
    u64* rhead;        // prev's window: my head for prev
    u64* stail;        // next's window: my tail
    char* sdata;       // next's window: my slots
    const u64* shead;  // mine: next's head
    u64 rstep, sstep;
    u32 prev, next;
    int fail;
};

__device__ __forceinline__ void chan_open(Chan& k, const RingCommon& c, u32 prev, u32 next) {
    const u32 me = c.rank, ch = blockIdx.x;
    char* rr = region_of(c, me, prev, ch);
    k.rtail = (const u64*)rr;
    k.rdata = slots_of(c, me, prev, ch);
    k.rhead = (u64*)(region_of(c, prev, me, ch) + RING_HEAD);
    char* sr = region_of(c, next, me, ch);
    k.stail = (u64*)sr;
    k.sdata = slots_of(c, next, me, ch);
    k.shead = (const u64*)(region_of(c, me, next, ch) + RING_HEAD);
    k.rstep = *counter(c, 1, prev, ch);
    k.sstep = *counter(c, 0, next, ch);
    k.prev = prev;
    k.next = next;
    k.fail = 0;
}

__device__ __forceinline__ void chan_close(const Chan& k, const RingCommon& c) {
    const u32 ch = blockIdx.x;
    *counter(c, 1, k.prev, ch) = k.rstep;
    *counter(c, 0, k.next, ch) = k.sstep;
}

// One ring step of n elements by the whole block: optionally receive a slot
// from prev, combine with `in`, write `out`, and send a slot to next.
// Returns false (for every thread) when the channel failed. Not inlined: a
// kernel has ~15 call sites of it, and inlining them all made ring.cu an
// 11 MB CUBIN that NVRTC took 147 s to build (2 cores); one copy per kernel
// costs a call per slot, nothing next to a slot's 128 KiB.
template <typename E, int OP>
__device__ __noinline__ bool rstep(Chan& k, const RingCommon& c, u32 f, bool send,
                                      const void* in, void* out, u64 n, typename E::A s) {
    if (n == 0) return true;
    if (threadIdx.x == 0) {
        bool ok = true;
        if (f & F_RECV) ok = wait_ge(c, k.rtail, k.rstep + 1, k.prev);
        // A free outgoing slot: next has drained all but nslots - 1 of ours
        // (no acquire: see wait_ge).
        if (ok && send && k.sstep + 1 > c.nslots)
            ok = wait_ge(c, k.shead, k.sstep + 1 - c.nslots, k.next, false);
        k.fail = ok ? 0 : 1;
    }
    __syncthreads();
    if (k.fail) return false;
    const void* r = k.rdata + (k.rstep % c.nslots) * c.slot;
    void* o2 = send ? (void*)(k.sdata + (k.sstep % c.nslots) * c.slot) : nullptr;
    rmove_elems<E, OP>(f, r, in, out, o2, n, s, c.nranks);
    __syncthreads();
    if (threadIdx.x == 0) {
        // The block's writes reach thread 0 through the barrier above; the
        // release store (cumulative, system scope) publishes them with the tail.
        if (send) {
            ((volatile u32*)((char*)k.stail + RING_SIZES))[k.sstep % c.nslots] =
                (u32)(n * sizeof(typename E::S));
            st_release_sys(k.stail, ++k.sstep);
        }
        // The slot's reads are done (their values were stored before the
        // barrier), so the head needs no release: a second one waited for
        // the tail store just made to reach the peer. One system-scope
        // ordering per step (the tail's release), as NCCL's Simple has.
        // With the acquire of wait_ge and the head wait without one: 4 ranks
        // sharing one H200, 1 MiB all-reduces 34 us against 63-66, 8 ranks
        // 69-71 against 138-142 (Simple ring, CUDA graphs, 2026-12-01,
        // three jobs of two rounds each); 2 ranks 64 KiB 11.1 against 14.5, 64 MiB
        // 174.5 against 182.5; 4-rank reduce-scatters 1 MiB 19 against 33-34.
        if (f & F_RECV) st_relaxed_sys(k.rhead, ++k.rstep);
    }
    // Thread 0's counters are the ones that matter (the others never read them).
    return true;
}

// A rank's pre-multiplier: the PreMulSum scalar at `scalar_ptr` when it
// is in device memory, else the float avg / PreMulSum multiplier `scale`
// or an integer PreMulSum scalar's bits `iscale`.
template <typename E>
__device__ __forceinline__ typename E::A scale_of(u64 scalar_ptr, double scale, u64 iscale) {
    typedef typename E::S S;
    typedef typename E::A A;
    if constexpr (E::is_float) {
        if (scalar_ptr != 0) return E::load(*(const volatile S*)scalar_ptr);
        return (A)scale;
    } else {
        if (scalar_ptr != 0) return (A) * (const volatile S*)scalar_ptr;
        return (A)iscale;
    }
}

template <typename E>
__device__ __forceinline__ typename E::A ring_scale(const RingArgs& a) {
    return scale_of<E>(a.scalar_ptr, a.scale, a.iscale);
}

__device__ __forceinline__ u64 umin(u64 a, u64 b) { return a < b ? a : b; }
__device__ __forceinline__ u32 mod(long long x, u32 n) { return (u32)(((x % (long long)n) + n) % n); }

// ---- LL: the low-latency protocol (all-reduce of small messages) ----
//
// A 16-byte line carries 8 bytes of data with a 32-bit flag beside each
// 4-byte half ({data1, flag1, data2, flag2}, one 16-byte store), so the data
// and the signal that it arrived travel together: a receiver polls the line
// itself until both flags equal the step's flag, and nobody waits for a
// separate tail word or pays for a system fence before it. Half of every
// line is flags, so LL is for messages where latency, not bandwidth, rules.
// The flag of step s is (u32)(s + 1): slots start zeroed and a stale line
// holds an older step's flag. The receiver still returns its slots (the LL
// head) so the sender never overwrites a line that was not read.

__device__ __forceinline__ void st_line(uint4* p, u64 v, u32 fl) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"((u32)v),
                 "r"(fl), "r"((u32)(v >> 32)), "r"(fl)
                 : "memory");
}

__device__ __forceinline__ uint4 ld_line(const uint4* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// One thread: waits for the line at p to carry flag fl; its 8 data bytes.
__device__ __forceinline__ bool ll_wait(const RingCommon& c, const uint4* p, u32 fl, u64* out,
                                        u32 peer) {
    u64 spins = 0, t0 = 0;
    for (;;) {
        const uint4 v = ld_line(p);
        if (v.y == fl && v.w == fl) {
            *out = (u64)v.x | ((u64)v.z << 32);
            return true;
        }
        if ((++spins & 1023) == 0) {
            const u64 now = gtimer();
            if (t0 == 0) {
                t0 = now;
            } else if (c.timeout_ns != 0 && now - t0 > c.timeout_ns) {
                ring_fail(c, RERR_TIMEOUT, peer);
                return false;
            } else if (now - t0 > 1000000 && ring_stopped(c)) {
                // Host memory is looked at only after a millisecond of waiting.
                ring_fail(c, RERR_ABORT, peer);
                return false;
            }
        }
    }
}

// A wait's bounds for the small kernel and the two-shot's rounds
// (common.cuh's wait_check), out of line so its poll loops stay a few
// instructions, with the words it needs by value (a reference to the
// arguments made every thread copy them to its stack: 152 bytes): every
// 1024 polls, with the wait's start `t0` (0 at the first check); returns
// the start, or 0 when the wait must give up (timeout, the host's abort,
// another block's error), recorded.
__device__ __noinline__ u64 ll_wait_bounds(u32* ctrl, u64 timeout_ns, u64 t0, u32 peer) {
    return wait_check(ctrl, timeout_ns, t0, peer) == 0 ? t0 : 0;
}

// One thread: waits for the line at `l` to carry flag `fl` (from `peer`)
// and takes its 8 data bytes; false when the wait gave up (ll_wait_bounds).
__device__ __forceinline__ bool ll_take(const RingCommon& c, const uint4* l, u32 fl, u32 peer,
                                         u64& v) {
    u64 spins = 0, t0 = 0;
    uint4 x = ld_line(l);
    while (x.y != fl || x.w != fl) {
        if ((++spins & 1023) == 0 && (t0 = ll_wait_bounds(c.ctrl, c.timeout_ns, t0, peer)) == 0)
            return false;
        x = ld_line(l);
    }
    v = (u64)x.x | ((u64)x.z << 32);
    return true;
}

// 8 bytes of elements from p (only `avail` of them exist; the rest are 0).
template <typename E>
__device__ __forceinline__ u64 ll_pack(const typename E::S* p, u64 avail) {
    typedef typename E::S S;
    constexpr int N = 8 / sizeof(S);
    union {
        u64 u;
        S e[N];
    } x;
    x.u = 0;
#pragma unroll
    for (int i = 0; i < N; i++)
        if ((u64)i < avail) x.e[i] = p[i];
    return x.u;
}

template <typename E>
__device__ __forceinline__ void ll_unpack(typename E::S* p, u64 v, u64 avail) {
    typedef typename E::S S;
    constexpr int N = 8 / sizeof(S);
    union {
        u64 u;
        S e[N];
    } x;
    x.u = v;
#pragma unroll
    for (int i = 0; i < N; i++)
        if ((u64)i < avail) p[i] = x.e[i];
}

template <typename E, int OP>
__device__ __forceinline__ u64 ll_elem(u32 f, u64 r, u64 b, typename E::A s, u32 nranks) {
    typedef typename E::S S;
    return per_elem<S>(r, b, [&](S x, S y) { return relem<E, OP>(f, x, y, s, nranks); });
}

struct LLChan {
    const char* rll;   // mine: prev's LL slots
    u64* rhead;        // prev's window: my LL head for prev
    char* sll;         // next's window: my LL slots
    const u64* shead;  // mine: next's LL head
    u64 rstep, sstep;
    u64 hseen;         // the last LL head value read from shead (0: none yet)
    u32 prev, next;
    int fail;
};

__device__ __forceinline__ void ll_open_ch(LLChan& k, const RingCommon& c, u32 prev, u32 next,
                                           u32 ch) {
    const u32 me = c.rank;
    const u64 simple = RING_HDR + (u64)c.nslots * c.slot;
    k.rll = region_of(c, me, prev, ch) + simple;
    k.rhead = (u64*)(region_of(c, prev, me, ch) + RING_LL_HEAD);
    k.sll = region_of(c, next, me, ch) + simple;
    k.shead = (const u64*)(region_of(c, me, next, ch) + RING_LL_HEAD);
    k.rstep = *counter(c, 3, prev, ch);
    k.sstep = *counter(c, 2, next, ch);
    // The head as it is now (a lower bound, it only grows), read alongside
    // the counters rather than after them: the first ll_room then rarely
    // waits for a second load.
    k.hseen = ld_relaxed_sys(k.shead);
    k.prev = prev;
    k.next = next;
    k.fail = 0;
}

// The LL connections of this block's channel.
__device__ __forceinline__ void ll_open(LLChan& k, const RingCommon& c, u32 prev, u32 next) {
    ll_open_ch(k, c, prev, next, blockIdx.x);
}

// The LL connections of this block with every other rank, for the one-
// and two-shot kernels: thread p opens rank p's ...
__device__ __forceinline__ void ll_open_peers(LLChan* k, const RingCommon& c) {
    if (threadIdx.x < c.nranks && threadIdx.x != c.rank) ll_open(k[threadIdx.x], c, threadIdx.x, threadIdx.x);
}

// ... and keeps its step counters for the next launch.
__device__ __forceinline__ void ll_close_peers(const LLChan* k, const RingCommon& c) {
    const u32 p = threadIdx.x;
    if (p < c.nranks && p != c.rank) {
        *counter(c, 3, p, blockIdx.x) = k[p].rstep;
        *counter(c, 2, p, blockIdx.x) = k[p].sstep;
    }
}

// Thread 0: room for `steps` more LL slots towards k.next (its head past
// sstep + steps - nslots). The head read last time is kept, so most steps
// read nothing: with 8 slots a new read is needed once per 8 steps at most.
__device__ __forceinline__ bool ll_room(LLChan& k, const RingCommon& c, u32 steps = 1) {
    if (k.sstep + steps <= k.hseen + c.ll_nslots) return true;
    return wait_ge(c, k.shead, k.sstep + steps - c.ll_nslots, k.next, false, &k.hseen);
}

// Slot `step` of the LL slots at `base` (ll_nslots is a power of two:
// ring.rs asserts it of LL_NSLOTS, so a mask, not a 64-bit division).
__device__ __forceinline__ uint4* ll_slot(const RingCommon& c, const char* base, u64 step) {
    return (uint4*)(base + (u64)((u32)step & (c.ll_nslots - 1)) * c.ll_bytes);
}

// One LL step of n elements by the whole block (as rstep, without tails).
template <typename E, int OP>
__device__ __noinline__ bool ll_step(LLChan& k, const RingCommon& c, u32 f, bool send,
                                     const typename E::S* in, typename E::S* out, u64 n,
                                     typename E::A s) {
    typedef typename E::S S;
    constexpr u64 N = 8 / sizeof(S);
    if (n == 0) return true;
    if (threadIdx.x == 0) {
        k.fail = (send && !ll_room(k, c)) ? 1 : 0;
    }
    __syncthreads();
    if (k.fail) return false;
    const u32 rfl = (u32)(k.rstep + 1), sfl = (u32)(k.sstep + 1);
    const uint4* rl = ll_slot(c, k.rll, k.rstep);
    uint4* sl = ll_slot(c, k.sll, k.sstep);
    const u64 units = (n + N - 1) / N;
    for (u64 u = threadIdx.x; u < units; u += blockDim.x) {
        const u64 e0 = u * N, avail = n - e0;
        u64 r = 0, b = 0;
        if ((f & F_RECV) && !ll_wait(c, rl + u, rfl, &r, k.prev)) {
            k.fail = 1;
            break;
        }
        if (f & F_IN) b = ll_pack<E>(in + e0, avail);
        const u64 v = ll_elem<E, OP>(f, r, b, s, c.nranks);
        if (out) ll_unpack<E>(out + e0, v, avail);
        if (send) st_line(sl + u, v, sfl);
    }
    __syncthreads();
    if (k.fail) return false;
    if (threadIdx.x == 0) {
        if (send) k.sstep++;
        if (f & F_RECV) {
            // Every line of the slot was read (their values are used above,
            // before the barrier): the sender may reuse it.
            k.rstep++;
            st_relaxed_sys(k.rhead, k.rstep);
        }
    }
    return true;
}

// ---- Protocols: how a ring algorithm moves a slot ----
// A ring algorithm is written once (ring_allreduce below) over a protocol's
// channel type and four operations: open and close a block's channel (its
// step counters live in the window between launches), the elements one step
// carries, and one step. Simple moves 16-byte packs through c.slot-byte
// slots, a tail per step published with one system-scope release (rstep);
// LL moves 8-byte values with a flag in each 16-byte line (half of each
// ll_bytes slot is data) and needs no fence (ll_step). A third protocol
// (LL128's 120 data bytes per 128-byte line, say) supplies the same four.
struct ProtoSimple {
    typedef Chan Channel;
    template <typename S>
    static __device__ __forceinline__ u64 pack() { return 16 / sizeof(S); }
    template <typename S>
    static __device__ __forceinline__ u64 slot_elems(const RingCommon& c) {
        return (c.slot / sizeof(S)) / pack<S>() * pack<S>();
    }
    static __device__ __forceinline__ void open(Chan& k, const RingCommon& c, u32 prev, u32 next) {
        chan_open(k, c, prev, next);
    }
    static __device__ __forceinline__ void close(const Chan& k, const RingCommon& c) { chan_close(k, c); }
    template <typename E, int OP>
    static __device__ __forceinline__ bool step(Chan& k, const RingCommon& c, u32 f, bool send,
                                                const typename E::S* in, typename E::S* out, u64 n,
                                                typename E::A s) {
        return rstep<E, OP>(k, c, f, send, in, out, n, s);
    }
};

struct ProtoLL {
    typedef LLChan Channel;
    template <typename S>
    static __device__ __forceinline__ u64 pack() { return 8 / sizeof(S); }
    template <typename S>
    static __device__ __forceinline__ u64 slot_elems(const RingCommon& c) {
        return (c.ll_bytes / 2 / sizeof(S)) / pack<S>() * pack<S>();
    }
    static __device__ __forceinline__ void open(LLChan& k, const RingCommon& c, u32 prev, u32 next) {
        ll_open(k, c, prev, next);
    }
    static __device__ __forceinline__ void close(const LLChan& k, const RingCommon& c) {
        *counter(c, 3, k.prev, blockIdx.x) = k.rstep;
        *counter(c, 2, k.next, blockIdx.x) = k.sstep;
    }
    template <typename E, int OP>
    static __device__ __forceinline__ bool step(LLChan& k, const RingCommon& c, u32 f, bool send,
                                                const typename E::S* in, typename E::S* out, u64 n,
                                                typename E::A s) {
        return ll_step<E, OP>(k, c, f, send, in, out, n, s);
    }
};

// This block's part [lo, hi) of [0, count), in whole packs of protocol P.
template <typename P, typename S>
__device__ __forceinline__ void channel_part(u64 count, u64& lo, u64& hi) {
    const u64 pack = P::template pack<S>();
    const u64 per = ((count + gridDim.x - 1) / gridDim.x + pack - 1) / pack * pack;
    lo = umin((u64)blockIdx.x * per, count);
    hi = umin(lo + per, count);
}

// The ring all-reduce of elements [lo, hi) over this block's channel k of
// protocol P: per round, n chunks (the last round's shrunk to fit, in whole
// packs); n - 1 reduce-and-send steps, the step that finishes this rank's
// chunk, n - 2 forwarding steps, and a last receive. Returns false when the
// channel failed (every thread).
template <typename P, typename E, int OP>
__device__ bool ring_allreduce(typename P::Channel& k, const RingCommon& c, const typename E::S* in,
                               typename E::S* out, u64 lo, u64 hi, typename E::A s) {
    typedef typename E::S S;
    const u32 n = c.nranks, q = c.pos;
    const u64 pack = P::template pack<S>();
    const u64 E_ = P::template slot_elems<S>(c);
    bool ok = true;
    for (u64 base = lo; ok && base < hi; base += (u64)n * E_) {
        const u64 rem = hi - base;
        const u64 cs = rem >= (u64)n * E_ ? E_ : ((rem + n - 1) / n + pack - 1) / pack * pack;
#define CH(kk) (base + (u64)(kk) * cs)
#define CL(kk) (CH(kk) >= hi ? 0 : umin(cs, hi - CH(kk)))
        u32 kk = mod((long long)q - 1, n);
        ok = P::template step<E, OP>(k, c, F_IN | F_PRE, true, in + CH(kk), nullptr, CL(kk), s);
        for (u32 st = 1; ok && st + 1 < n; st++) {
            kk = mod((long long)q - 1 - st, n);
            ok = P::template step<E, OP>(k, c, F_RECV | F_IN | F_PRE, true, in + CH(kk), nullptr, CL(kk), s);
        }
        if (!ok) break;
        kk = q;
        ok = P::template step<E, OP>(k, c, F_RECV | F_IN | F_PRE | F_POST, true, in + CH(kk),
                                     out + CH(kk), CL(kk), s);
        for (u32 j = 1; ok && j + 1 < n; j++) {
            kk = mod((long long)q - j, n);
            ok = P::template step<E, OP>(k, c, F_RECV, true, nullptr, out + CH(kk), CL(kk), s);
        }
        if (!ok) break;
        kk = (q + 1) % n;
        ok = P::template step<E, OP>(k, c, F_RECV, false, nullptr, out + CH(kk), CL(kk), s);
#undef CH
#undef CL
    }
    return ok;
}

// The ring all-reduce over LL slots (ring_run's KERNEL_ALLREDUCE_RING_LL).
template <typename E, int OP>
__device__ void ring_run_ll(const RingArgs& a) {
    typedef typename E::S S;
    const RingCommon& c = a.c;
    __shared__ LLChan k;
    const u32 n = c.nranks, q = c.pos;
    if (threadIdx.x == 0) ProtoLL::open(k, c, ring_at(c, (q + n - 1) % n), ring_at(c, (q + 1) % n));
    __syncthreads();
    u64 lo, hi;
    channel_part<ProtoLL, S>(a.count, lo, hi);
    const bool ok = ring_allreduce<ProtoLL, E, OP>(k, c, (const S*)a.in, (S*)a.out, lo, hi, ring_scale<E>(a));
    __syncthreads();
    if (ok && threadIdx.x == 0) ProtoLL::close(k, c);
}

// One-shot all-reduce over LL slots (small messages, at most
// DIRECT_MAX_RANKS ranks): each rank writes its part of the input, as LL
// lines, straight into every other rank's slots, then reduces the n
// contributions in rank order (0, 1, ..., n-1: the same order, so the same
// bits, on every rank). One NVLink crossing instead of the ring's 2(n-1)
// dependent ones; each rank sends (n-1) x its input, which is why this is for
// small messages only (RingConfig::oneshot_max). The LL counters per (peer,
// channel) advance by the same number of steps at both ends, as in the ring.
// The same kernel serves small all-gathers (KERNEL_ALLGATHER_ONESHOT_LL: every rank's
// block goes to every rank, no reduction; count is the per-rank block) and
// reduce-scatters (KERNEL_REDUCE_SCATTER_ONESHOT_LL: rank p gets this rank's block p,
// and reduces the n blocks it receives in rank order; count is the per-rank
// output): one crossing instead of the ring's n - 1 dependent ones.
// Small broadcasts (KERNEL_BROADCAST_ONESHOT_LL: only the root sends, to every rank)
// and reduces (KERNEL_REDUCE_ONESHOT_LL: every rank but the root sends to the root,
// which reduces in rank order as the all-reduce does) take it too: one
// crossing instead of the ring's n - 1 dependent Simple steps, each with
// its system fences.
__device__ __forceinline__ bool direct_sends(u32 mode, u32 q, u32 p, u32 root) {
    if (p == q) return false;
    if (mode == KERNEL_BROADCAST_ONESHOT_LL) return q == root;
    if (mode == KERNEL_REDUCE_ONESHOT_LL) return p == root;
    return true;
}
__device__ __forceinline__ bool direct_recvs(u32 mode, u32 q, u32 p, u32 root) {
    return direct_sends(mode, p, q, root);
}

// Rank p's line `v` of a one-shot receive, taken in rank order (both
// one-shot kernels): an all-gather puts it at `at` in its output; the
// reductions fold it into `acc` (F_POST with the last rank's) and return it.
template <typename E, int OP>
__device__ __forceinline__ u64 direct_fold(bool ag, typename E::S* out, u64 at, u64 avail, u32 p, u32 n,
                                        u64 acc, u64 v, typename E::A s) {
    if (ag) {
        ll_unpack<E>(out + at, v, avail);
        return acc;
    }
    const u32 f = (p == 0 ? F_IN : F_RECV | F_IN) | (p + 1 == n ? F_POST : 0);
    return ll_elem<E, OP>(f, acc, v, s, n);
}

template <typename E, int OP>
__device__ void run_oneshot_ll(const RingArgs& a) {
    typedef typename E::S S;
    typedef typename E::A A;
    const RingCommon& c = a.c;
    __shared__ LLChan k[DIRECT_MAX_RANKS];
    __shared__ int fail;
    const u32 n = c.nranks, q = c.rank;
    ll_open_peers(k, c);
    if (threadIdx.x == 0) fail = 0;
    const A s = ring_scale<E>(a);
    constexpr u64 pack = 8 / sizeof(S);
    const u64 E_ = (c.ll_bytes / 2 / sizeof(S)) / pack * pack;  // elements per LL slot
    const u64 per = ((a.count + gridDim.x - 1) / gridDim.x + pack - 1) / pack * pack;
    const u64 lo = umin((u64)blockIdx.x * per, a.count), hi = umin(lo + per, a.count);
    const S* in = (const S*)a.in;
    S* out = (S*)a.out;
    const u32 md = a.mode;
    const bool ag = md == KERNEL_ALLGATHER_ONESHOT_LL, rs = md == KERNEL_REDUCE_SCATTER_ONESHOT_LL;
    const bool bc = md == KERNEL_BROADCAST_ONESHOT_LL, rd = md == KERNEL_REDUCE_ONESHOT_LL;
    // The host passes a broadcast's or reduce's root as its ring position.
    const u32 root = (bc || rd) ? ring_at(c, a.root) : 0;
    const u64 M = a.count;  // all-gather, reduce-scatter: elements per rank
    // This thread's first line of input, loaded while the channels open
    // (their counters and heads): independent loads in flight together
    // instead of three dependent waits before the first line leaves. Not
    // for a reduce-scatter (a line per peer) or a broadcast's non-root
    // (whose input may be no buffer at all).
    const bool pre = !rs && !(bc && q != root) && lo + threadIdx.x * pack < hi;
    const u64 first =
        pre ? ll_elem<E, OP>(F_IN | F_PRE, 0, ll_pack<E>(in + lo + threadIdx.x * pack, hi - lo - threadIdx.x * pack), s, n)
            : 0;
    __syncthreads();
    for (u64 base = lo; base < hi; base += E_) {
        const u64 nn = umin(E_, hi - base);
        if (threadIdx.x == 0) {
            for (u32 p = 0; p < n; p++)
                if (direct_sends(md, q, p, root) && !ll_room(k[p], c)) {
                    fail = 1;
                    break;
                }
        }
        __syncthreads();
        if (fail) break;
        const u64 units = (nn + pack - 1) / pack;
        // Two passes: every line of this thread leaves before it waits for
        // any (a thread with two lines waited for its first before sending
        // its second: 8 KiB took 6.4 us in a graph against 4.8 for 2 KiB).
        // Each rank pre-scales its own contribution with its own PreMulSum
        // scalar (ranks may pass different ones), as the ring's first step.
        // A broadcast's non-roots and a reduce's root send nothing (and a
        // non-root's broadcast input may be no buffer at all).
        const bool sender = !(bc && q != root) && !(rd && q == root);
        for (u64 u = threadIdx.x; sender && u < units; u += blockDim.x) {
            const u64 e0 = base + u * pack;
            // (An all-gather runs as uint8 Sum: F_PRE changes nothing.)
            const u64 mine = rs                                ? 0
                             : (pre && base == lo && u == threadIdx.x) ? first
                                                                       : ll_elem<E, OP>(F_IN | F_PRE, 0, ll_pack<E>(in + e0, hi - e0), s, n);
            for (u32 p = 0; p < n; p++) {
                if (!direct_sends(md, q, p, root)) continue;
                uint4* sl = ll_slot(c, k[p].sll, k[p].sstep);
                const u64 v =
                    rs ? ll_elem<E, OP>(F_IN | F_PRE, 0, ll_pack<E>(in + p * M + e0, hi - e0), s, n) : mine;
                st_line(sl + u, v, (u32)(k[p].sstep + 1));
            }
        }
        for (u64 u = threadIdx.x; u < units && !(rd && q != root); u += blockDim.x) {
            const u64 e0 = base + u * pack, avail = hi - e0;
            if (bc) {
                // The root copies its own input (out of place); the others
                // take the root's lines.
                u64 v = 0;
                if (q == root) {
                    if (in == out) continue;
                    v = ll_pack<E>(in + e0, avail);
                } else if (!ll_wait(c, ll_slot(c, k[root].rll, k[root].rstep) + u, (u32)(k[root].rstep + 1), &v,
                                    root)) {
                    fail = 1;
                    break;
                }
                ll_unpack<E>(out + e0, v, avail);
                continue;
            }
            const u64 mine =
                (pre && base == lo && u == threadIdx.x)
                    ? first
                    : ll_elem<E, OP>(F_IN | F_PRE, 0, ll_pack<E>(in + (rs ? q * M : 0) + e0, avail), s, n);
            u64 acc = 0;
            for (u32 p = 0; p < n; p++) {
                u64 v = mine;
                if (p != q) {
                    const uint4* rl = ll_slot(c, k[p].rll, k[p].rstep);
                    if (!ll_wait(c, rl + u, (u32)(k[p].rstep + 1), &v, p)) {
                        fail = 1;
                        break;
                    }
                }
                acc = direct_fold<E, OP>(ag, out, p * M + e0, avail, p, n, acc, v, s);
            }
            if (fail) break;
            if (!ag) ll_unpack<E>(out + e0, acc, avail);
        }
        __syncthreads();
        if (fail) break;
        if (threadIdx.x < n && threadIdx.x != q) {
            // Every line from this peer was read (used above, before the
            // barrier): it may reuse the slot.
            LLChan& kp = k[threadIdx.x];
            if (direct_sends(md, q, threadIdx.x, root)) kp.sstep++;
            if (direct_recvs(md, q, threadIdx.x, root)) {
                kp.rstep++;
                st_relaxed_sys(kp.rhead, kp.rstep);
            }
        }
        __syncthreads();
    }
    if (!fail) ll_close_peers(k, c);
}

// Two-shot all-reduce over LL slots (3..DIRECT_MAX_RANKS ranks of one
// host): the count is cut into n rank blocks of B elements (the last ones
// shorter or empty); rank q sends block p of its input, pre-scaled, to
// rank p (a one-shot reduce-scatter), reduces the n lines of block q it
// receives in rank order, and sends the result to every rank (a one-shot
// all-gather). Two crossings instead of the LL ring's 2(n-1) dependent
// ones, and the ring's bytes: each rank sends 2(n-1)/n of the message, where
// the one-shot sends n - 1 times it. Only block q's owner reduces it, so
// every rank's bits are equal. Every (peer, channel) connection advances
// two LL steps per slot round: the reduce-scatter's, then the all-gather's;
// a thread sends its all-gather line as soon as it has reduced it, so a
// round has one barrier. Lines past a block's end are neither sent nor
// waited for (both ends know the block's length).
__device__ __forceinline__ u64 twoshot_len(u64 count, u64 B, u32 p) {
    const u64 b = (u64)p * B;
    return b >= count ? 0 : umin(B, count - b);
}

// One round's slots and flags towards every peer (shared memory; thread p
// fills entry p): s[p][i] is peer p's slot for my step i of the round (0:
// reduce-scatter, 1: all-gather), r[p][i] mine for p's; flags of step 0
// (step 1's are one more).
struct TwoShotLLRound {
    uint4* s[DIRECT_MAX_RANKS][2];
    const uint4* r[DIRECT_MAX_RANKS][2];
    u32 sfl[DIRECT_MAX_RANKS], rfl[DIRECT_MAX_RANKS];
};

// Thread p's entry of R for its peer p: its send and receive steps now.
__device__ __forceinline__ void twoshot_ll_slots(TwoShotLLRound& R, const RingCommon& c, u32 p, char* sbase,
                                          const char* rbase, u64 ss, u64 rs) {
    R.s[p][0] = ll_slot(c, sbase, ss);
    R.s[p][1] = ll_slot(c, sbase, ss + 1);
    R.r[p][0] = ll_slot(c, rbase, rs);
    R.r[p][1] = ll_slot(c, rbase, rs + 1);
    R.sfl[p] = (u32)(ss + 1);
    R.rfl[p] = (u32)(rs + 1);
}

// One round of the two-shot by the whole block: `units` lines from element
// `base` of every rank block of B elements (the last blocks shorter or
// empty; at most 2 lines per thread: a round is at most one LL slot of
// 1,024 lines, the kernels have 512 threads). Block p's lines to rank p,
// block q reduced in rank order, written, and sent to every rank as soon
// as each line is reduced, then the other blocks taken. False when a wait
// gave up (recorded).
template <typename E, int OP>
__device__ __forceinline__ bool twoshot_ll_round(const RingArgs& a, const TwoShotLLRound& R, u64 B, u64 base,
                                          u64 units, typename E::A s) {
    typedef typename E::S S;
    const RingCommon& c = a.c;
    const u32 n = c.nranks, q = c.rank, t = threadIdx.x;
    constexpr u64 pack = 8 / sizeof(S);
    const S* in = (const S*)a.in;
    S* out = (S*)a.out;
    const u64 lq = twoshot_len(a.count, B, q);
    // The reduce-scatter's lines: block p's to rank p.
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const u64 u = t + (u64)j * blockDim.x;
        if (u >= units) break;
        const u64 e0 = base + u * pack;
        for (u32 p = 0; p < n; p++) {
            const u64 lp = twoshot_len(a.count, B, p);
            if (p == q || e0 >= lp) continue;
            const u64 v = ll_elem<E, OP>(F_IN | F_PRE, 0, ll_pack<E>(in + (u64)p * B + e0, lp - e0), s, n);
            st_line(R.s[p][0] + u, v, R.sfl[p]);
        }
    }
    // Block q reduced in rank order, written and sent to every rank.
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const u64 u = t + (u64)j * blockDim.x;
        const u64 e0 = base + u * pack;
        if (u >= units || e0 >= lq) break;
        const u64 mine = ll_elem<E, OP>(F_IN | F_PRE, 0, ll_pack<E>(in + (u64)q * B + e0, lq - e0), s, n);
        u64 acc = 0;
        for (u32 p = 0; p < n; p++) {
            u64 v = mine;
            if (p != q && !ll_take(c, R.r[p][0] + u, R.rfl[p], p, v)) return false;
            acc = direct_fold<E, OP>(false, nullptr, 0, 0, p, n, acc, v, s);
        }
        ll_unpack<E>(out + (u64)q * B + e0, acc, lq - e0);
        for (u32 p = 0; p < n; p++)
            if (p != q) st_line(R.s[p][1] + u, acc, R.sfl[p] + 1);
    }
    // The all-gather's lines: block p from rank p.
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const u64 u = t + (u64)j * blockDim.x;
        if (u >= units) break;
        const u64 e0 = base + u * pack;
        for (u32 p = 0; p < n; p++) {
            const u64 lp = twoshot_len(a.count, B, p);
            if (p == q || e0 >= lp) continue;
            u64 v;
            if (!ll_take(c, R.r[p][1] + u, R.rfl[p] + 1, p, v)) return false;
            ll_unpack<E>(out + (u64)p * B + e0, v, lp - e0);
        }
    }
    return true;
}

// The two-shot in the ring kernel, for parts of more than one LL slot per
// block (fewer channels than fits_small_two_shot wants): a round per slot.
template <typename E, int OP>
__device__ void run_twoshot_ll(const RingArgs& a) {
    typedef typename E::S S;
    const RingCommon& c = a.c;
    __shared__ LLChan k[DIRECT_MAX_RANKS];
    __shared__ TwoShotLLRound R;
    __shared__ int fail;
    const u32 n = c.nranks, q = c.rank, t = threadIdx.x;
    const bool pt = t < n && t != q;
    ll_open_peers(k, c);
    if (t == 0) fail = 0;
    const typename E::A s = ring_scale<E>(a);
    constexpr u64 pack = 8 / sizeof(S);
    const u64 E_ = (c.ll_bytes / 2 / sizeof(S)) / pack * pack;  // elements per LL slot
    // Rank blocks in whole lines, so no line straddles two of them.
    const u64 B = ((a.count + n - 1) / n + pack - 1) / pack * pack;
    const u64 per = ((B + gridDim.x - 1) / gridDim.x + pack - 1) / pack * pack;
    const u64 lo = umin((u64)blockIdx.x * per, B), hi = umin(lo + per, B);
    __syncthreads();
    for (u64 base = lo; base < hi; base += E_) {
        if (pt) {
            // Room for both of the round's steps in t's slots.
            if (!ll_room(k[t], c, 2)) fail = 1;
            twoshot_ll_slots(R, c, t, k[t].sll, k[t].rll, k[t].sstep, k[t].rstep);
        }
        __syncthreads();
        if (fail) break;
        if (!twoshot_ll_round<E, OP>(a, R, B, base, (umin(E_, hi - base) + pack - 1) / pack, s)) fail = 1;
        __syncthreads();
        if (fail) break;
        if (pt) {
            // Both of this round's slots from t were read (above the
            // barrier): it may reuse them.
            k[t].sstep += 2;
            k[t].rstep += 2;
            st_relaxed_sys(k[t].rhead, k[t].rstep);
        }
        // Every thread has read `fail` before anyone sets it again.
        __syncthreads();
    }
    if (!fail) ll_close_peers(k, c);
}

// The one-shot LL collectives (all-reduce, all-gather, reduce-scatter,
// broadcast, reduce) when every block's part fits one LL slot (the host
// checks the same arithmetic: oxccl_core::gpu::ring, fits_small_one_shot), as their own small
// kernel: run_oneshot_ll without its slot loop or 64-bit divisions after
// the wait, and a two-rank all-reduce without loops over peers. Why: two ranks sharing one H200 (no link in
// the way), 8-byte all-reduces under CUDA graphs took 3.5 us per call in
// the ring kernel (120 KB of code) and 3.2 in run_oneshot_ll alone (27 KB),
// where a probe kernel doing the same exchange of one 16-byte line took
// 1.0 (scripts/probes/ll_probe.cu); clock64 stamps put 500-1,400 cycles
// on each phase of run_oneshot_ll however little it did (opening the
// channels, the room check, the send), as instruction fetches and
// dependent loads would. So this kernel keeps its path short and
// contiguous, and does its loads of fixed or only-growing words (the
// window table, the peers' LL heads) and its arithmetic before
// griddepcontrol.wait: after it come only the step counters and the
// input, in parallel. Same setting: 1.74-1.87 us at 8 B-4 KB, 2.2 at
// 32 KB, 3.1 at 256 KB (against 3.4-3.6, 3.8, 5.3); the waits' bounds out
// of line took 0.1 us off the small sizes (1.86-2.02 inline) and added
// 0.05-0.1 at 256 KB (three rounds alternated). The other modes here too
// (one H200, 2026-12-01, same setting, two rounds against OXCCL_CUDA_LL1_FAST=0):
// broadcasts 8 B-4 KB 1.74-1.90 us against 3.03-3.20, reduces 1.88-2.17
// against 3.29-3.44, all-gathers 2.19-2.28 against 3.64-3.77,
// reduce-scatters 2.32-2.52 against 3.76-3.91; 4 ranks sharing the GPU
// 2.3-4.2 against 4.3-6.8.
// Semantics as run_oneshot_ll's: the same slots, steps, flags and heads
// (only the directions that carry lines advance), contributions combined
// in rank order (every rank's bits equal).

template <typename E, int OP>
__device__ __forceinline__ void small_oneshot_ll_run(const RingArgs& a) {
    typedef typename E::S S;
    typedef typename E::A A;
    const RingCommon& c = a.c;
    const u32 n = c.nranks, q = c.rank, t = threadIdx.x, ch = blockIdx.x;
    __shared__ uint4* sl[DIRECT_MAX_RANKS];        // peer p's slot for my lines
    __shared__ const uint4* rl[DIRECT_MAX_RANKS];  // my slot for p's lines
    __shared__ u32 sfl[DIRECT_MAX_RANKS], rfl[DIRECT_MAX_RANKS];
    __shared__ int fail;
    // Before the previous kernel is done: the tables never change after
    // setup, a head only grows (so what we read is a lower bound), the
    // rest is arithmetic on the arguments (64-bit divisions included).
    const u32 md = a.mode;
    const bool ar = md == KERNEL_ALLREDUCE_ONESHOT_LL, ag = md == KERNEL_ALLGATHER_ONESHOT_LL;
    const bool rsc = md == KERNEL_REDUCE_SCATTER_ONESHOT_LL, bc = md == KERNEL_BROADCAST_ONESHOT_LL;
    const bool rd = md == KERNEL_REDUCE_ONESHOT_LL;
    // The host passes a broadcast's or reduce's root as its ring position.
    const u32 root = (bc || rd) ? ring_at(c, a.root) : 0;
    const bool pt = t < n && t != q;
    const bool snd = pt && direct_sends(md, q, t, root), rcv = pt && direct_recvs(md, q, t, root);
    if (t == 0) fail = 0;
    constexpr u64 pack = 8 / sizeof(S);
    // All-gather, reduce-scatter: count is one rank's block.
    const u64 M = a.count;
    const u64 per = ((a.count + gridDim.x - 1) / gridDim.x + pack - 1) / pack * pack;
    const u64 lo = umin((u64)ch * per, a.count), hi = umin(lo + per, a.count);
    const u64 units = (hi - lo + pack - 1) / pack;
    const S* in = (const S*)a.in;
    S* out = (S*)a.out;
    // This rank's own contribution (a reduce-scatter's is its block q; a
    // broadcast's non-roots have none, and maybe no input buffer at all).
    const bool own = !(bc && q != root);
    const S* oin = rsc ? in + (u64)q * M : in;
    const u64 simple = RING_HDR + (u64)c.nslots * c.slot;
    char* sbase = nullptr;
    const char* rbase = nullptr;
    u64* rhead = nullptr;
    const u64* shead = nullptr;
    u64 hseen = 0;
    if (pt) {
        char* theirs = region_of(c, t, q, ch);  // t's window, my region
        char* mine = region_of(c, q, t, ch);    // my window, t's region
        sbase = theirs + simple;
        rhead = (u64*)(theirs + RING_LL_HEAD);
        rbase = mine + simple;
        shead = (const u64*)(mine + RING_LL_HEAD);
        if (snd) hseen = ld_relaxed_sys(shead);
    }
    kernel_entry();
    u64 rs = 0, ss = 0;
    if (pt) {
        rs = *counter(c, 3, t, ch);
        ss = *counter(c, 2, t, ch);
    }
    const A s = ring_scale<E>(a);
    // This thread's lines (at most 2: a part is at most one slot, 1,024
    // lines, over 512 threads), loaded while the counters arrive.
    u64 mine[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const u64 u = t + (u64)j * blockDim.x;
        if (own && u < units) {
            const u64 e0 = lo + u * pack;
            mine[j] = ll_elem<E, OP>(F_IN | F_PRE, 0, ll_pack<E>(oin + e0, hi - e0), s, n);
        }
    }
    if (snd) {
        // Room in t's slots (the LL room check of ll_room).
        if (ss + 1 > hseen + c.ll_nslots) {
            u64 spins = 0, t0 = 0;
            while (ld_relaxed_sys(shead) + c.ll_nslots < ss + 1)
                if ((++spins & 1023) == 0 && (t0 = ll_wait_bounds(c.ctrl, c.timeout_ns, t0, t)) == 0) {
                    fail = 1;
                    break;
                }
        }
    }
    if (pt) {
        sl[t] = ll_slot(c, sbase, ss);
        rl[t] = ll_slot(c, rbase, rs);
        sfl[t] = (u32)(ss + 1);
        rfl[t] = (u32)(rs + 1);
    }
    __syncthreads();
    if (fail) return;
    if (ar && n == 2) {
        // Two ranks (the common case) without the loops over peers: one
        // line out and one in per unit, combined in rank order. 8-512 B
        // all-reduces 1.58-1.62 us against 1.73-1.85 through the loops, 4
        // KB 1.74-1.79 against 1.85-1.91 (2 ranks sharing one H200,
        // graphs, three rounds alternated; 256 KB even).
        const u32 p = 1 - q;
        uint4* sp = sl[p];
        const uint4* rp = rl[p];
        const u32 sf = sfl[p], rf = rfl[p];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const u64 u = t + (u64)j * blockDim.x;
            if (u < units) st_line(sp + u, mine[j], sf);
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const u64 u = t + (u64)j * blockDim.x;
            if (u >= units) break;
            u64 v;
            if (!ll_take(c, rp + u, rf, p, v)) {
                fail = 1;
                break;
            }
            const u64 acc = ll_elem<E, OP>(F_RECV | F_IN | F_POST, q == 0 ? mine[j] : v,
                                           q == 0 ? v : mine[j], s, n);
            const u64 e0 = lo + u * pack;
            ll_unpack<E>(out + e0, acc, hi - e0);
        }
    } else {
        // Every line leaves before any is waited for. A reduce-scatter
        // sends block p of its input to rank p (pre-scaled, as the ring's
        // first step); the others send their own lines. A broadcast's
        // non-roots and a reduce's root send nothing.
        if (own && !(rd && q == root)) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const u64 u = t + (u64)j * blockDim.x;
                if (u >= units) break;
                const u64 e0 = lo + u * pack;
                for (u32 p = 0; p < n; p++) {
                    if (!direct_sends(md, q, p, root)) continue;
                    const u64 v =
                        rsc ? ll_elem<E, OP>(F_IN | F_PRE, 0, ll_pack<E>(in + p * M + e0, hi - e0), s, n)
                            : mine[j];
                    st_line(sl[p] + u, v, sfl[p]);
                }
            }
        }
        // A reduce's non-roots receive nothing.
        if (!(rd && q != root)) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const u64 u = t + (u64)j * blockDim.x;
                if (u >= units) break;
                const u64 e0 = lo + u * pack, avail = hi - e0;
                if (bc) {
                    // The root copies its own input (out of place); the
                    // others take the root's lines.
                    u64 v = mine[j];
                    if (q == root) {
                        if (in == out) continue;
                    } else if (!ll_take(c, rl[root] + u, rfl[root], root, v)) {
                        fail = 1;
                        break;
                    }
                    ll_unpack<E>(out + e0, v, avail);
                    continue;
                }
                u64 acc = 0;
                bool ok = true;
                for (u32 p = 0; p < n; p++) {
                    u64 v = mine[j];
                    if (p != q && !ll_take(c, rl[p] + u, rfl[p], p, v)) {
                        ok = false;
                        break;
                    }
                    acc = direct_fold<E, OP>(ag, out, p * M + e0, avail, p, n, acc, v, s);
                }
                if (!ok) {
                    fail = 1;
                    break;
                }
                if (!ag) ll_unpack<E>(out + e0, acc, avail);
            }
        }
    }
    __syncthreads();
    if (fail || !pt) return;
    // Every line from t was read (above the barrier): t may reuse the slot.
    // Only the directions that carried lines advance (a broadcast's and a
    // reduce's other pairs keep their steps, as in run_oneshot_ll).
    if (rcv) st_relaxed_sys(rhead, rs + 1);
    *counter(c, 3, t, ch) = rs + (rcv ? 1 : 0);
    *counter(c, 2, t, ch) = ss + (snd ? 1 : 0);
}

// The two-shot LL all-reduce (run_twoshot_ll) when every block's part of a
// rank block fits one LL slot (oxccl_core::gpu::ring, fits_small_two_shot), in the small kernel's
// way: pointers and the peers' heads before griddepcontrol.wait, one round
// of two steps, no slot loop. Out of line, so the one-shot kernel it
// shares a launch entry with keeps its short path. Same semantics as
// run_twoshot_ll: the same slots, steps, flags and heads. Ranks sharing one
// H200, CUDA graphs, three rounds against OXCCL_CUDA_LL1_FAST=0
// (2026-12-01): 4 ranks 64-256 KiB 6.0-6.8 us against 8.5-8.9 in the ring
// kernel, 8 ranks 32-128 KiB 10.7-11.4 against 14.8-15.8; 512 KiB within 5%.
template <typename E, int OP>
__device__ __noinline__ void small_twoshot_ll_run(const RingArgs& a) {
    typedef typename E::S S;
    const RingCommon& c = a.c;
    const u32 n = c.nranks, q = c.rank, t = threadIdx.x, ch = blockIdx.x;
    __shared__ TwoShotLLRound R;
    __shared__ int fail;
    const bool pt = t < n && t != q;
    if (t == 0) fail = 0;
    constexpr u64 pack = 8 / sizeof(S);
    const u64 B = ((a.count + n - 1) / n + pack - 1) / pack * pack;
    const u64 per = ((B + gridDim.x - 1) / gridDim.x + pack - 1) / pack * pack;
    const u64 lo = umin((u64)ch * per, B), hi = umin(lo + per, B);
    const u64 simple = RING_HDR + (u64)c.nslots * c.slot;
    char* sbase = nullptr;
    const char* rbase = nullptr;
    u64* rhead = nullptr;
    const u64* shead = nullptr;
    u64 hseen = 0;
    if (pt) {
        char* theirs = region_of(c, t, q, ch);
        char* mine = region_of(c, q, t, ch);
        sbase = theirs + simple;
        rhead = (u64*)(theirs + RING_LL_HEAD);
        rbase = mine + simple;
        shead = (const u64*)(mine + RING_LL_HEAD);
        hseen = ld_relaxed_sys(shead);
    }
    kernel_entry();
    u64 rs = 0, ss = 0;
    if (pt) {
        rs = *counter(c, 3, t, ch);
        ss = *counter(c, 2, t, ch);
        // Room for both steps in t's slots.
        if (ss + 2 > hseen + c.ll_nslots) {
            u64 spins = 0, t0 = 0;
            while (ld_relaxed_sys(shead) + c.ll_nslots < ss + 2)
                if ((++spins & 1023) == 0 && (t0 = ll_wait_bounds(c.ctrl, c.timeout_ns, t0, t)) == 0) {
                    fail = 1;
                    break;
                }
        }
        twoshot_ll_slots(R, c, t, sbase, rbase, ss, rs);
    }
    const typename E::A s = ring_scale<E>(a);
    __syncthreads();
    if (fail) return;
    if (!twoshot_ll_round<E, OP>(a, R, B, lo, (hi - lo + pack - 1) / pack, s)) fail = 1;
    __syncthreads();
    if (fail || !pt) return;
    // Both of this round's slots from t were read (above the barrier).
    st_relaxed_sys(rhead, rs + 2);
    *counter(c, 3, t, ch) = rs + 2;
    *counter(c, 2, t, ch) = ss + 2;
}

// One-shot all-reduce over Simple slots (at most DIRECT_MAX_RANKS ranks):
// as run_oneshot_ll, with tails, heads and sizes instead of flags in the
// lines, so slots can cross the network proxies (which move whole slots).
// Across hosts this is one network crossing instead of the ring's 2(n-1)
// dependent ones; with 2 ranks it also sends no more than the ring (S each
// way either way).
template <typename E, int OP>
__device__ void ring_run_1s(const RingArgs& a) {
    typedef typename E::S S;
    typedef typename E::A A;
    const RingCommon& c = a.c;
    __shared__ Chan k[DIRECT_MAX_RANKS];
    __shared__ int fail;
    const u32 n = c.nranks, q = c.rank;
    if (threadIdx.x < n && threadIdx.x != q) chan_open(k[threadIdx.x], c, threadIdx.x, threadIdx.x);
    if (threadIdx.x == 0) fail = 0;
    __syncthreads();
    const A s = ring_scale<E>(a);
    const u64 pack = 16 / sizeof(S);
    const u64 E_ = (c.slot / sizeof(S)) / pack * pack;  // elements per slot
    const u64 per = ((a.count + gridDim.x - 1) / gridDim.x + pack - 1) / pack * pack;
    const u64 lo = umin((u64)blockIdx.x * per, a.count), hi = umin(lo + per, a.count);
    const S* in = (const S*)a.in;
    S* out = (S*)a.out;
    for (u64 base = lo; base < hi; base += E_) {
        const u64 nn = umin(E_, hi - base);
        if (threadIdx.x == 0) {
            for (u32 p = 0; p < n && !fail; p++)
                if (p != q && k[p].sstep + 1 > c.nslots &&
                    !wait_ge(c, k[p].shead, k[p].sstep + 1 - c.nslots, p))
                    fail = 1;
        }
        __syncthreads();
        if (fail) break;
        // Each rank's contribution, pre-scaled by its own scalar, into every
        // peer's slot, 16 bytes at a time: across hosts the slots are host
        // memory, where element-sized accesses over PCIe cost a round trip
        // each (a 512 KB all-reduce took 298 us, NCCL's sockets 277).
        const u64 groups = (nn + pack - 1) / pack;
        for (u64 g = threadIdx.x; g < groups; g += blockDim.x) {
            const u64 i0 = g * pack, m = umin(pack, nn - i0);
            union {
                uint4 u;
                S e[16 / sizeof(S)];
            } x;
            x.u = uint4{0, 0, 0, 0};
            for (u64 j = 0; j < m; j++)
                x.e[j] = relem<E, OP>(F_IN | F_PRE, S(), in[base + i0 + j], s, n);
            for (u32 p = 0; p < n; p++)
                if (p != q)
                    ((uint4*)(k[p].sdata + (k[p].sstep % c.nslots) * c.slot))[g] = x.u;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // The block's writes reach thread 0 through the barrier; the
            // release stores (system scope, cumulative) publish them.
            for (u32 p = 0; p < n; p++) {
                if (p == q) continue;
                ((volatile u32*)((char*)k[p].stail + RING_SIZES))[k[p].sstep % c.nslots] =
                    (u32)(nn * sizeof(S));
                st_release_sys(k[p].stail, ++k[p].sstep);
            }
            for (u32 p = 0; p < n && !fail; p++)
                if (p != q && !wait_ge(c, k[p].rtail, k[p].rstep + 1, p)) fail = 1;
        }
        __syncthreads();
        if (fail) break;
        for (u64 g = threadIdx.x; g < groups; g += blockDim.x) {
            const u64 i0 = g * pack, m = umin(pack, nn - i0);
            union U {
                uint4 u;
                S e[16 / sizeof(S)];
            };
            U acc, v;
            for (u32 p = 0; p < n; p++) {
                if (p == q) {
                    for (u64 j = 0; j < m; j++)
                        v.e[j] = relem<E, OP>(F_IN | F_PRE, S(), in[base + i0 + j], s, n);
                } else {
                    v.u = ldcg((const uint4*)(k[p].rdata + (k[p].rstep % c.nslots) * c.slot) + g);
                }
                for (u64 j = 0; j < m; j++)
                    acc.e[j] = p == 0 ? v.e[j] : relem<E, OP>(F_RECV | F_IN, acc.e[j], v.e[j], s, n);
            }
            for (u64 j = 0; j < m; j++) out[base + i0 + j] = rpost<E, OP>(acc.e[j], n);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (u32 p = 0; p < n; p++)
                if (p != q) st_release_sys(k[p].rhead, ++k[p].rstep);
        }
    }
    __syncthreads();
    if (!fail && threadIdx.x < n && threadIdx.x != q) chan_close(k[threadIdx.x], c);
}

// dst[0..n) = src[0..n) by the whole block (16-byte packs when both allow).
__device__ __forceinline__ void block_copy(char* dst, const char* src, u64 n) {
    if ((((u64)dst | (u64)src) & 15) == 0) {
        const u64 packs = n / 16;
        const uint4* s4 = (const uint4*)src;
        uint4* d4 = (uint4*)dst;
        for (u64 base = threadIdx.x; base < packs; base += (u64)blockDim.x * RING_UNROLL) {
            uint4 v[RING_UNROLL];
#pragma unroll
            for (int j = 0; j < RING_UNROLL; j++) {
                const u64 i = base + (u64)j * blockDim.x;
                if (i < packs) v[j] = ldcg(s4 + i);
            }
#pragma unroll
            for (int j = 0; j < RING_UNROLL; j++) {
                const u64 i = base + (u64)j * blockDim.x;
                if (i < packs) d4[i] = v[j];
            }
        }
        for (u64 i = packs * 16 + threadIdx.x; i < n; i += blockDim.x)
            dst[i] = *(const volatile char*)(src + i);
    } else {
        for (u64 i = threadIdx.x; i < n; i += blockDim.x) dst[i] = *(const volatile char*)(src + i);
    }
}

// ---- Direct collectives over Simple slots (3 to DIRECT_MAX_RANKS ranks of one host) ----
//
// All-gathers and reduce-scatters in one crossing (each rank writes its
// piece for rank p straight into p's slots, every peer at once) and
// all-reduces in two (that reduce-scatter, then that all-gather of the
// reduced blocks), where the Simple ring makes n - 1 and 2(n - 1)
// dependent steps, each a tail wait on the previous rank. Every rank sends
// what the ring sends ((n - 1)/n of the data per crossing), so the bytes do
// not grow; on NVSwitch machines (8 H200) every pair is one hop. Why: the
// Simple ring's steps cost ~5 us each with 4 and 8 ranks sharing one H200
// (2026-12-01: a 1 MiB all-reduce of 8 ranks 69-71 us, 14 steps), and its
// n - 1 steps are what NCCL's ring pays too. Semantics as the ring's: the
// same slots, tails, heads and sizes per (peer, channel), so calls of
// either kind may follow each other; contributions folded in rank order;
// an all-reduce's block p reduced only by rank p (every rank's bits equal).

// out[i] (if out) and dst[p][i] for every p with dst[p] = the rank-order fold
// of src[0..n)[i], src[q] (this rank's input) pre-scaled, post applied; i in
// [0, units) 16-byte packs, by the whole block. All of a pack's loads come
// before its combines (n loads in flight per thread).
template <typename E, int OP>
__device__ __forceinline__ void dfold(const uint4* const* src, uint4* const* dst, uint4* out, u32 n, u32 q,
                                      u64 units, typename E::A s) {
    for (u64 i = threadIdx.x; i < units; i += blockDim.x) {
        uint4 v[DIRECT_MAX_RANKS];
#pragma unroll
        for (u32 p = 0; p < DIRECT_MAX_RANKS; p++)
            if (p < n) v[p] = ldcg(src[p] + i);
        // This rank's own, pre-scaled once here, not in each unrolled step
        // (the e5m2 premulsum module: 576 KB that way, 558 this way).
        const uint4 mine = relem<E, OP>(F_IN | F_PRE, v[0], ldcg(src[q] + i), s, n);
        uint4 acc = mine;
#pragma unroll
        for (u32 p = 0; p < DIRECT_MAX_RANKS; p++) {
            if (p >= n) break;
            const uint4 x = p == q ? mine : v[p];
            acc = p == 0 ? x : relem<E, OP>(F_RECV | F_IN, acc, x, s, n);
        }
        acc = relem<E, OP>(F_RECV | F_POST, acc, acc, s, n);
        if (out) out[i] = acc;
#pragma unroll
        for (u32 p = 0; p < DIRECT_MAX_RANKS; p++)
            if (p < n && dst[p]) dst[p][i] = acc;
    }
}

// The same element by element, without unrolling (the few elements past the
// last pack, or buffers off 16-byte alignment: the rare case kept small).
template <typename E, int OP>
__device__ __forceinline__ void dfold1(const char* const* src, char* const* dst, char* out, u32 n, u32 q,
                                       u64 from, u64 m, typename E::A s) {
    typedef typename E::S S;
    for (u64 i = from + threadIdx.x; i < m; i += blockDim.x) {
        S acc = S();
#pragma unroll 1
        for (u32 p = 0; p < n; p++) {
            const S v = ldcg((const S*)src[p] + i);
            const S x = p == q ? rpre<E, OP>(v, s) : v;
            acc = p == 0 ? x : rcomb<E, OP>(acc, x);
        }
        acc = rpost<E, OP>(acc, n);
        if (out) ((S*)out)[i] = acc;
#pragma unroll 1
        for (u32 p = 0; p < n; p++)
            if (dst[p]) ((S*)dst[p])[i] = acc;
    }
}

// dfold over m elements: 16-byte packs while every pointer allows, the rest
// element by element. src and dst are this block's shared arrays (n each).
// Code size: every ring module (the CI builds all 123) carries this. With
// its element path unrolled as the pack path, the e5m2 premulsum module was
// 582 KB (without the direct kernels: 479 KB); out of line (__noinline__)
// 643 KB; as here, with dcopy and dsend below, 558 KB.
template <typename E, int OP>
__device__ __forceinline__ void dfold_elems(const char* const* src, char* const* dst, char* out, u32 n,
                                            u32 q, u64 m, typename E::A s) {
    typedef typename E::S S;
    constexpr u64 N = 16 / sizeof(S);
    u64 mis = (u64)out;
    for (u32 p = 0; p < n; p++) mis |= (u64)src[p] | (u64)dst[p];
    u64 done = 0;
    if ((mis & 15) == 0) {
        done = m / N * N;
        dfold<E, OP>((const uint4* const*)src, (uint4* const*)dst, (uint4*)out, n, q, m / N, s);
    }
    if (done < m) dfold1<E, OP>(src, dst, out, n, q, done, m, s);
}

// A copy by the whole block, out of line: the direct kernels' sends and
// receives that neither scale nor reduce (one copy of the loop per module,
// not one per call site: see dfold_elems on code size). A peer at a time:
// one out-of-line loop copying every peer's piece at once (each thread's
// loads of all of them before its stores) took twice as long at every size
// (4 ranks sharing one H200, graphs: all-gathers of 1 MiB 27 us against 13,
// 64 MiB 355 against 253; all-reduces of 1 MiB 43.5 against 20.6;
// 2026-12-01).
__device__ __noinline__ void dcopy(void* dst, const void* src, u64 n) {
    block_copy((char*)dst, (const char*)src, n);
}

// A send of this rank's m elements at `in`, pre-scaled where the op says so
// (avg, PreMulSum), into a peer's slot.
template <typename E, int OP>
__device__ __forceinline__ void dsend(void* slot, const typename E::S* in, u64 m, typename E::A s, u32 n) {
    if constexpr (OP == OP_AVG || OP == OP_PREMULSUM) {
        rmove_elems<E, OP>(F_IN | F_PRE, nullptr, in, slot, nullptr, m, s, n);
    } else {
        dcopy(slot, in, m * sizeof(typename E::S));
    }
}

// This block's connections with every peer and the slots of the current
// step (thread p keeps entry p): ss[p] mine in p's window, rs[p] p's in mine.
struct Direct {
    Chan k[DIRECT_MAX_RANKS];
    char* ss[DIRECT_MAX_RANKS];
    const char* rs[DIRECT_MAX_RANKS];
    int fail;
};

// Thread p (a peer): waits for room in p's slots for the next send and
// points ss[p] at it (no acquire: see wait_ge).
__device__ __forceinline__ void direct_room(Direct& D, const RingCommon& c, u32 p) {
    Chan& k = D.k[p];
    if (k.sstep + 1 > c.nslots && !wait_ge(c, k.shead, k.sstep + 1 - c.nslots, p, false)) D.fail = 1;
    D.ss[p] = k.sdata + (k.sstep % c.nslots) * c.slot;
}

// Thread p (a peer), after a barrier behind the block's writes of ss[p]:
// publishes `bytes` there (the release is cumulative, system scope), then
// waits for p's next slot (acquire) and points rs[p] at it.
__device__ __forceinline__ void direct_post_take(Direct& D, const RingCommon& c, u32 p, u64 bytes) {
    Chan& k = D.k[p];
    ((volatile u32*)((char*)k.stail + RING_SIZES))[k.sstep % c.nslots] = (u32)bytes;
    st_release_sys(k.stail, ++k.sstep);
    if (!wait_ge(c, k.rtail, k.rstep + 1, p)) D.fail = 1;
    D.rs[p] = k.rdata + (k.rstep % c.nslots) * c.slot;
}

// Modes KERNEL_ALLGATHER_ONESHOT_SIMPLE, KERNEL_REDUCE_SCATTER_ONESHOT_SIMPLE (count: elements per rank)
// and KERNEL_ALLREDUCE_TWOSHOT_SIMPLE (count: elements; rank p's block [p B, (p + 1) B),
// B = count / n in whole packs, the last ones shorter or empty). Each block
// takes its part of [0, B) a slot at a time; both ends step every
// connection once per slot and crossing, empty pieces included.
template <typename E, int OP>
__device__ void ring_run_direct(const RingArgs& a) {
    typedef typename E::S S;
    const RingCommon& c = a.c;
    __shared__ Direct D;
    __shared__ const char* src[DIRECT_MAX_RANKS];
    __shared__ char* dst[DIRECT_MAX_RANKS];
    const u32 n = c.nranks, q = c.rank, t = threadIdx.x;
    const bool pt = t < n && t != q;
    if (pt) chan_open(D.k[t], c, t, t);
    if (t == 0) D.fail = 0;
    const typename E::A s = ring_scale<E>(a);
    constexpr u64 pack = 16 / sizeof(S);
    const u64 E_ = (c.slot / sizeof(S)) / pack * pack;  // elements per slot
    const bool ar = a.mode == KERNEL_ALLREDUCE_TWOSHOT_SIMPLE, ag = a.mode == KERNEL_ALLGATHER_ONESHOT_SIMPLE;
    const u64 B = ar ? ((a.count + n - 1) / n + pack - 1) / pack * pack : a.count;
    const u64 per = ((B + gridDim.x - 1) / gridDim.x + pack - 1) / pack * pack;
    const u64 lo = umin((u64)blockIdx.x * per, B), hi = umin(lo + per, B);
    const S* in = (const S*)a.in;
    S* out = (S*)a.out;
    // Elements of rank p's block in the piece [base, base + nn) (nn but for
    // an all-reduce's last blocks).
    auto piece = [&](u32 p, u64 base, u64 nn) -> u64 {
        if (!ar) return nn;
        const u64 len = twoshot_len(a.count, B, p);
        return base >= len ? 0 : umin(nn, len - base);
    };
    __syncthreads();
    // D.fail is set only between a barrier and the next (by the peer
    // threads) and read only after one, so every thread breaks together.
    for (u64 base = lo; base < hi; base += E_) {
        const u64 nn = umin(E_, hi - base);
        if (pt) direct_room(D, c, t);
        __syncthreads();
        if (D.fail) break;
        // First crossing: each peer's piece into its slot (an all-gather's:
        // this rank's block, also to its own place in out).
        if (ag) {
            S* own = out + (u64)q * B + base;
            if (own != in + base) dcopy(own, in + base, nn * sizeof(S));
            for (u32 p = 0; p < n; p++)
                if (p != q) dcopy(D.ss[p], in + base, nn * sizeof(S));
        } else {
            for (u32 p = 0; p < n; p++)
                if (p != q)
                    dsend<E, OP>(D.ss[p], in + (u64)p * B + base, piece(p, base, nn), s, n);
        }
        __syncthreads();
        if (pt) {
            direct_post_take(D, c, t, piece(t, base, nn) * sizeof(S));
            if (ar) direct_room(D, c, t);
        }
        if (t < n) {
            src[t] = t == q ? (const char*)(in + (u64)q * B + base) : D.rs[t];
            dst[t] = ar && t != q ? D.ss[t] : nullptr;
        }
        __syncthreads();
        if (D.fail) break;
        if (ag) {
            for (u32 p = 0; p < n; p++)
                if (p != q)
                    dcopy(out + (u64)p * B + base, D.rs[p], nn * sizeof(S));
        } else {
            // This rank's block: its input and every peer's piece of it,
            // folded in rank order into out (an all-reduce's also into every
            // peer's next slot: the second crossing).
            dfold_elems<E, OP>(src, dst, (char*)(out + (ar ? (u64)q * B : 0) + base), n, q,
                               piece(q, base, nn), s);
        }
        __syncthreads();
        if (pt) {
            st_relaxed_sys(D.k[t].rhead, ++D.k[t].rstep);
            if (ar) direct_post_take(D, c, t, piece(q, base, nn) * sizeof(S));
        }
        if (!ar) continue;
        __syncthreads();
        if (D.fail) break;
        // Second crossing: every peer's reduced block into out.
        for (u32 p = 0; p < n; p++)
            if (p != q)
                dcopy(out + (u64)p * B + base, D.rs[p], piece(p, base, nn) * sizeof(S));
        __syncthreads();
        if (pt) st_relaxed_sys(D.k[t].rhead, ++D.k[t].rstep);
    }
    __syncthreads();
    if (!D.fail && pt) chan_close(D.k[t], c);
}

template <typename E, int OP>
__device__ void ring_run(const RingArgs& a) {
    if (a.mode == KERNEL_ALLREDUCE_RING_LL) {
        ring_run_ll<E, OP>(a);
        return;
    }
    if (a.mode == KERNEL_ALLREDUCE_ONESHOT_LL || a.mode == KERNEL_ALLGATHER_ONESHOT_LL || a.mode == KERNEL_REDUCE_SCATTER_ONESHOT_LL ||
        a.mode == KERNEL_BROADCAST_ONESHOT_LL || a.mode == KERNEL_REDUCE_ONESHOT_LL) {
        run_oneshot_ll<E, OP>(a);
        return;
    }
    if (a.mode == KERNEL_ALLREDUCE_TWOSHOT_LL) {
        run_twoshot_ll<E, OP>(a);
        return;
    }
    if (a.mode == KERNEL_ALLREDUCE_ONESHOT_SIMPLE) {
        ring_run_1s<E, OP>(a);
        return;
    }
    if (a.mode == KERNEL_ALLGATHER_ONESHOT_SIMPLE || a.mode == KERNEL_REDUCE_SCATTER_ONESHOT_SIMPLE || a.mode == KERNEL_ALLREDUCE_TWOSHOT_SIMPLE) {
        ring_run_direct<E, OP>(a);
        return;
    }
    typedef typename E::S S;
    typedef typename E::A A;
    const RingCommon& c = a.c;
    __shared__ Chan k;
    const u32 n = c.nranks, q = c.pos;
    // No look at the host's abort word here: it is host memory, and 32
    // blocks each reading it over PCIe at entry cost ~2 us per block (a 2 MB
    // all-reduce took 97 us with 32 channels, 68 with 16, 38 with 8). The
    // host launches nothing once an error or abort is recorded, and waits
    // look at the word while they spin.
    if (threadIdx.x == 0) ProtoSimple::open(k, c, ring_at(c, (q + n - 1) % n), ring_at(c, (q + 1) % n));
    __syncthreads();
    const A s = ring_scale<E>(a);
    const u64 E_ = ProtoSimple::slot_elems<S>(c);
    u64 lo, hi;
    channel_part<ProtoSimple, S>(a.count, lo, hi);
    const S* in = (const S*)a.in;
    S* out = (S*)a.out;
    bool ok = true;
    if (a.mode == KERNEL_ALLREDUCE_RING_SIMPLE) {
        ok = ring_allreduce<ProtoSimple, E, OP>(k, c, in, out, lo, hi, s);
    } else if (a.mode == KERNEL_REDUCE_SCATTER_RING_SIMPLE) {
        const u64 M = a.count;
        for (u64 base = lo; ok && base < hi; base += E_) {
            const u64 cs = umin(E_, hi - base);
            // Position kk's block of the input is rank ring_at(kk)'s output.
            u32 kk = mod((long long)q - 1, n);
            ok = rstep<E, OP>(k, c, F_IN | F_PRE, true, in + (u64)ring_at(c, kk) * M + base, nullptr, cs, s);
            for (u32 st = 1; ok && st + 1 < n; st++) {
                kk = mod((long long)q - 1 - st, n);
                ok = rstep<E, OP>(k, c, F_RECV | F_IN | F_PRE, true, in + (u64)ring_at(c, kk) * M + base,
                                  nullptr, cs, s);
            }
            if (ok)
                ok = rstep<E, OP>(k, c, F_RECV | F_IN | F_PRE | F_POST, false, in + (u64)c.rank * M + base,
                                  out + base, cs, s);
        }
    } else if (a.mode == KERNEL_ALLGATHER_RING_SIMPLE) {
        const u64 M = a.count;
        S* mine = out + (u64)c.rank * M;
        for (u64 base = lo; ok && base < hi; base += E_) {
            const u64 cs = umin(E_, hi - base);
            ok = rstep<E, OP>(k, c, F_IN, true, in + base, in == mine ? nullptr : mine + base, cs, s);
            for (u32 j = 1; ok && j < n; j++) {
                const u32 kk = mod((long long)q - j, n);
                ok = rstep<E, OP>(k, c, F_RECV, j + 1 < n, nullptr, out + (u64)ring_at(c, kk) * M + base, cs, s);
            }
        }
    } else if (a.mode == KERNEL_BROADCAST_RING_SIMPLE) {
        const u32 p = mod((long long)q - a.root, n);
        for (u64 base = lo; ok && base < hi; base += E_) {
            const u64 cs = umin(E_, hi - base);
            if (p == 0) {
                ok = rstep<E, OP>(k, c, F_IN, true, in + base, in == out ? nullptr : out + base, cs, s);
            } else {
                ok = rstep<E, OP>(k, c, F_RECV, p + 1 < n, nullptr, out + base, cs, s);
            }
        }
    } else if (a.mode == KERNEL_REDUCE_RING_SIMPLE) {
        const u32 p = mod((long long)q - a.root - 1, n);
        for (u64 base = lo; ok && base < hi; base += E_) {
            const u64 cs = umin(E_, hi - base);
            if (p == 0) {
                ok = rstep<E, OP>(k, c, F_IN | F_PRE, true, in + base, nullptr, cs, s);
            } else if (p + 1 < n) {
                ok = rstep<E, OP>(k, c, F_RECV | F_IN | F_PRE, true, in + base, nullptr, cs, s);
            } else {
                ok = rstep<E, OP>(k, c, F_RECV | F_IN | F_PRE | F_POST, false, in + base, out + base, cs, s);
            }
        }
    }
    __syncthreads();
    if (ok && threadIdx.x == 0) ProtoSimple::close(k, c);
}

// The point-to-point kernels and the barrier are untyped: they live in
// one program of their own (kernels.rs, ring_p2p), not in every typed one
// (kernels.rs, ring_variant defines OXCCL_RING_TYPED).
#ifndef OXCCL_RING_TYPED

// ---- Point-to-point: sends and receives of one group ----

struct P2pOp {
    u64 ptr;    // device buffer of this rank
    u64 bytes;
    u32 peer;
    u32 recv;   // 0: send to peer, 1: receive from peer
    u32 nch;    // channels (connection channels 0..nch-1), the same on both ends
    u32 ll;     // 1: as LL lines over the pair's channel 0 (small, within a host)
};

struct P2pArgs {
    RingCommon c;
    u32 nops;
    u32 nitems;  // sum of ops[i].nch
    P2pOp ops[RING_P2P_MAX_OPS];
    // A copy of this rank to itself (gather, scatter, all-to-all; 0 bytes:
    // none): by the blocks past the items when the host added some (they
    // start at once), else by every block once its items are done.
    char* self_dst;
    const char* self_src;
    u64 self_bytes;
};

// Up to 8 bytes at p (`avail` of them exist).
__device__ __forceinline__ u64 ld8(const char* p, u64 avail) {
    if (avail >= 8 && ((u64)p & 7) == 0) return *(const u64*)p;
    u64 v = 0;
    for (u64 i = 0; i < 8 && i < avail; i++) v |= (u64)(unsigned char)p[i] << (8 * i);
    return v;
}

__device__ __forceinline__ void st8(char* p, u64 v, u64 avail) {
    if (avail >= 8 && ((u64)p & 7) == 0) {
        *(u64*)p = v;
        return;
    }
    for (u64 i = 0; i < 8 && i < avail; i++) p[i] = (char)(v >> (8 * i));
}

// A send of `bytes` as LL lines (8 data bytes each) into the peer's LL
// slots, by the whole block. No fence and no tail: the flags travel in the
// lines. At most LL capacity (ll_nslots slots) per op, so a send finds room
// once the peer drained earlier launches (the host keeps ops that small).
__device__ bool p2p_ll_send(const RingCommon& c, LLChan& k, const char* src, u64 bytes) {
    const u64 per = c.ll_bytes / 2;
    for (u64 off = 0; off < bytes; off += per) {
        const u64 n = umin(per, bytes - off);
        if (threadIdx.x == 0) k.fail = ll_room(k, c) ? 0 : 1;
        __syncthreads();
        if (k.fail) return false;
        uint4* sl = ll_slot(c, k.sll, k.sstep);
        const u32 fl = (u32)(k.sstep + 1);
        for (u64 u = threadIdx.x; u * 8 < n; u += blockDim.x)
            st_line(sl + u, ld8(src + off + u * 8, n - u * 8), fl);
        __syncthreads();
        if (threadIdx.x == 0) k.sstep++;
    }
    return true;
}

// The matching receive: each thread waits for its lines, then the slot goes
// back to the sender (the LL head).
__device__ bool p2p_ll_recv(const RingCommon& c, LLChan& k, char* dst, u64 bytes, u32 peer) {
    const u64 per = c.ll_bytes / 2;
    for (u64 off = 0; off < bytes; off += per) {
        const u64 n = umin(per, bytes - off);
        const uint4* rl = ll_slot(c, k.rll, k.rstep);
        const u32 fl = (u32)(k.rstep + 1);
        for (u64 u = threadIdx.x; u * 8 < n; u += blockDim.x) {
            u64 v = 0;
            if (!ll_wait(c, rl + u, fl, &v, peer)) {
                k.fail = 1;
                break;
            }
            st8(dst + off + u * 8, v, n - u * 8);
        }
        __syncthreads();
        if (k.fail) return false;
        if (threadIdx.x == 0) {
            k.rstep++;
            st_relaxed_sys(k.rhead, k.rstep);
        }
        __syncthreads();
    }
    return true;
}

// The launch's LL ops, each by one block (the i-th LL op by block i mod the
// grid), every block's sends before its receives: a send never waits for a
// receive (the op fits the slots), so no block holds a send back while it
// waits. Returns false when one failed (timeout, abort).
__device__ bool p2p_ll_ops(const P2pArgs& a) {
    const RingCommon& c = a.c;
    __shared__ LLChan k;
    u32 li = 0;
    for (u32 pass = 0; pass < 2; pass++) {
        for (u32 o = 0; o < a.nops; o++) {
            const P2pOp& op = a.ops[o];
            if (!op.ll || op.recv != pass) continue;
            // Channel ch carries bytes [ch * per, (ch + 1) * per) (16-byte
            // parts, so aligned buffers keep aligned 8-byte loads); both ends
            // cut the same parts from the same byte count and channel count.
            const u64 per = ((op.bytes + op.nch - 1) / op.nch + 15) / 16 * 16;
            for (u32 ch = 0; ch < op.nch; ch++) {
                if (li++ % gridDim.x != blockIdx.x) continue;
                const u64 lo = umin((u64)ch * per, op.bytes), nb = umin(lo + per, op.bytes) - lo;
                if (threadIdx.x == 0) ll_open_ch(k, c, op.peer, op.peer, ch);
                __syncthreads();
                const bool ok = op.recv ? p2p_ll_recv(c, k, (char*)op.ptr + lo, nb, op.peer)
                                        : p2p_ll_send(c, k, (const char*)op.ptr + lo, nb);
                if (!ok) return false;
                if (threadIdx.x == 0) {
                    if (op.recv) {
                        *counter(c, 3, op.peer, ch) = k.rstep;
                    } else {
                        *counter(c, 2, op.peer, ch) = k.sstep;
                    }
                }
                __syncthreads();
            }
        }
    }
    return true;
}

struct Item {
    char* buf;        // this item's part of the user buffer
    u64 bytes;        // its length
    u64 done;         // bytes moved so far
    const u64* wait;  // recv: my tail from peer; send: my head from peer
    u64* post;        // recv: peer's head for me; send: peer's tail for me
    char* slots;      // recv: my slots from peer; send: peer's slots for me
    u64 step;
    u32 peer, recv, ch, pad;
};

// Each block serves several (op, channel) items, taking whichever is ready,
// so sends and receives of one group progress together whatever their
// order (a block never blocks on one item while another could move).
extern "C" __global__ void __launch_bounds__(512) oxccl_ring_p2p(P2pArgs a) {
    const RingCommon& c = a.c;
    __shared__ Item it[RING_P2P_MAX_ITEMS];
    __shared__ int pick;
    __shared__ u32 nmine;
    kernel_entry();
    if (!p2p_ll_ops(a)) return;
    if (threadIdx.x == 0) {
        u32 m = 0, idx = 0;
        for (u32 o = 0; o < a.nops; o++) {
            const P2pOp& op = a.ops[o];
            if (op.ll) continue;
            const u64 per = ((op.bytes + op.nch - 1) / op.nch + 15) / 16 * 16;
            for (u32 ch = 0; ch < op.nch; ch++, idx++) {
                if (idx % gridDim.x != blockIdx.x || m >= RING_P2P_MAX_ITEMS) continue;
                Item& x = it[m++];
                const u64 lo = umin((u64)ch * per, op.bytes);
                x.buf = (char*)op.ptr + lo;
                x.bytes = umin(lo + per, op.bytes) - lo;
                x.done = 0;
                x.peer = op.peer;
                x.recv = op.recv;
                x.ch = ch;
                char* mine = region_of(c, c.rank, op.peer, ch);
                char* theirs = region_of(c, op.peer, c.rank, ch);
                if (op.recv) {
                    x.wait = (const u64*)mine;
                    x.post = (u64*)(theirs + RING_HEAD);
                    x.slots = slots_of(c, c.rank, op.peer, ch);
                    x.step = *counter(c, 1, op.peer, ch);
                } else {
                    x.wait = (const u64*)(mine + RING_HEAD);
                    x.post = (u64*)theirs;
                    x.slots = slots_of(c, op.peer, c.rank, ch);
                    x.step = *counter(c, 0, op.peer, ch);
                }
            }
        }
        nmine = m;
    }
    __syncthreads();
    bool failed = false;
    for (;;) {
        if (threadIdx.x == 0) {
            int p = -1;
            bool left = false;
            u64 spins = 0, t0 = 0;
            while (p < 0) {
                left = false;
                for (u32 i = 0; i < nmine && p < 0; i++) {
                    Item& x = it[i];
                    if (x.done >= x.bytes) continue;
                    left = true;
                    const u64 need = x.recv ? x.step + 1 : (x.step + 1 > c.nslots ? x.step + 1 - c.nslots : 0);
                    if (ld_relaxed_sys(x.wait) >= need) p = (int)i;
                }
                if (!left) break;
                if (p < 0 && (++spins & 1023) == 0) {
                    if (ring_stopped(c)) {
                        p = -2;
                        break;
                    }
                    const u64 now = gtimer();
                    if (t0 == 0) {
                        t0 = now;
                    } else if (c.timeout_ns != 0 && now - t0 > c.timeout_ns) {
                        u32 peer = 0;
                        for (u32 i = 0; i < nmine; i++)
                            if (it[i].done < it[i].bytes) peer = it[i].peer;
                        ring_fail(c, RERR_TIMEOUT, peer);
                        p = -2;
                        break;
                    }
                }
            }
            if (p >= 0) fence_acq_rel_sys();
            pick = left ? p : -1;
        }
        __syncthreads();
        const int p = pick;
        if (p == -2) failed = true;
        if (p < 0) break;
        Item& x = it[p];
        const u64 n = umin(c.slot, x.bytes - x.done);
        char* slot = x.slots + (x.step % c.nslots) * c.slot;
        if (x.recv) {
            block_copy(x.buf + x.done, slot, n);
        } else {
            block_copy(slot, x.buf + x.done, n);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            if (!x.recv) ((volatile u32*)((char*)x.post + RING_SIZES))[x.step % c.nslots] = (u32)n;
            st_release_sys(x.post, ++x.step);
            x.done += n;
        }
        __syncthreads();
    }
    if (!failed && threadIdx.x == 0) {
        for (u32 i = 0; i < nmine; i++) {
            const Item& x = it[i];
            if (x.recv) {
                *counter(c, 1, x.peer, x.ch) = x.step;
            } else {
                *counter(c, 0, x.peer, x.ch) = x.step;
            }
        }
    }
    // Blocks past the items hold none (items go to blocks by index modulo
    // the grid) and got here at once: they copy alone, beside the
    // transfers. Without such blocks every block copies after its items
    // (2-process all-to-alls of 2 MB spent ~2 us there, 1 MiB to itself).
    if (!failed) {
        const u32 first = gridDim.x > a.nitems ? a.nitems : 0;
        if (blockIdx.x >= first)
            copy_bytes_by(a.self_dst, a.self_src, a.self_bytes, blockIdx.x - first, gridDim.x - first);
    }
}

// A barrier with one peer (RingArgs.root, a rank) in stream order, for the
// copy-engine calls between two processes (xp.rs): everything queued before
// it on both ranks' streams is done when either leaves it. The count lives
// on the GPU (counter kind 4), so a replay under CUDA graphs takes the next
// value on both sides; the wait observes the abort word and the timeout.
// One thread: the launch costs what any launch costs, the work is one
// remote store and one poll.
extern "C" __global__ void __launch_bounds__(32) oxccl_ring_barrier(RingArgs a) {
    kernel_entry();
    const RingCommon& c = a.c;
    if (threadIdx.x != 0) return;
    const u32 peer = a.root;
    u64* n = counter(c, 4, peer, 0);
    const u64 v = *n + 1;
    *n = v;
    // Release: this stream's earlier writes (kernels, copies into the
    // peer's memory) are visible before the peer sees the count.
    fence_acq_rel_sys();
    st_release_sys((u64*)(region_of(c, peer, c.rank, 0) + RING_BAR), v);
    wait_ge(c, (const u64*)(region_of(c, c.rank, peer, 0) + RING_BAR), v, peer);
}

#endif  // OXCCL_RING_TYPED

// A one-rank PreMulSum (all-reduce, reduce-scatter, reduce: out = in x
// scalar, with the scalar's rounding as every rank's pre-multiplication in
// the ring): elementwise over a grid-stride loop, in place or not (each
// thread reads an element before writing it). Only a.in, a.out, a.count
// and the scalar fields are used (no ring: a one-rank communicator has none).
template <typename E, int OP>
__device__ __forceinline__ void scale_run(const RingArgs& a) {
    typedef typename E::S S;
    const typename E::A s = ring_scale<E>(a);
    const S* in = (const S*)a.in;
    S* out = (S*)a.out;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < a.count; i += stride)
        out[i] = rpre<E, OP>(in[i], s);
}

// ---- Every rank of a communicator in one launch ----
//
// A group that holds every rank's calls of a communicator whose ranks all
// live in this process (ranks sharing a GPU; nccl-tests -g N with
// OXCCL_CUDA_JOINT_PEERS=1) runs small collectives as one kernel on rank
// 0's GPU, which reads every rank's input and writes every rank's output
// (through the peer mappings across GPUs): one launch per call instead of
// one per rank, and no exchange of lines between kernels. The host orders
// the other ranks' streams around it with events (exec/group.rs, enqueue_one_launch). Why:
// an eager call is bound by the host's launches, ~3.2-3.5 us each on the
// GPU machine's host; two streams of one H200 took 6.9-7.8 us per op for
// two empty launches against 4.3-5.7 for one launch with an event each way
// (scripts/launch-probe.sh); the eager calls measured through it:
// oxccl_core::gpu::one_launch. No waits: nothing here can hang.
#define ONE_LAUNCH_MAX_RANKS 8
struct OneLaunchArgs {
    u64 in[ONE_LAUNCH_MAX_RANKS];
    u64 out[ONE_LAUNCH_MAX_RANKS];        // 0: that rank has no output (a reduce's non-roots)
    double scale[ONE_LAUNCH_MAX_RANKS];   // float avg / PreMulSum: each rank's multiplier
    u64 iscale[ONE_LAUNCH_MAX_RANKS];     // integer PreMulSum: each rank's scalar's bits
    u64 scalar_ptr[ONE_LAUNCH_MAX_RANKS]; // PreMulSum with a device scalar: its address, else 0
    u64 count;   // elements: all-reduce, reduce, broadcast; per rank: all-gather, reduce-scatter
    u32 mode;    // KERNEL_ALLREDUCE_RING_SIMPLE, KERNEL_REDUCE_SCATTER_RING_SIMPLE, KERNEL_ALLGATHER_RING_SIMPLE, KERNEL_BROADCAST_RING_SIMPLE, KERNEL_REDUCE_RING_SIMPLE
    u32 root;    // broadcast's or reduce's root rank
    u32 nranks;  // 2..ONE_LAUNCH_MAX_RANKS
    u32 pad;
};

// acc (rank r > 0's turn) combined with rank r's value pre-scaled by its
// own scalar; rank 0's value only pre-scaled. In rank order, as the ring's
// one-shot kernels fold them (the same bits).
template <typename E, int OP>
__device__ __forceinline__ typename E::S one_launch_fold(u32 r, typename E::S acc, typename E::S x,
                                                    typename E::A s) {
    const typename E::S v = rpre<E, OP>(x, s);
    return r == 0 ? v : rcomb<E, OP>(acc, v);
}
template <typename E, int OP>
__device__ __forceinline__ uint4 one_launch_fold(u32 r, uint4 acc, uint4 x, typename E::A s) {
    typedef typename E::S S;
    return per_elem<S>(acc, x, [&](S a, S b) { return one_launch_fold<E, OP>(r, a, b, s); });
}
template <typename E, int OP>
__device__ __forceinline__ typename E::S one_launch_post(typename E::S x, u32 n) {
    return rpost<E, OP>(x, n);
}
template <typename E, int OP>
__device__ __forceinline__ uint4 one_launch_post(uint4 x, u32 n) {
    typedef typename E::S S;
    return per_elem<S>(x, x, [&](S a, S) { return rpost<E, OP>(a, n); });
}

// For i in [0, n) units over the grid: v = the ranks' x_r[at + i] folded in
// rank order; written to out_r[i] for every rank r with one (all-reduce),
// or to `only[i]` when given (reduce, a reduce-scatter's part). A thread
// loads its units from every input before it stores any, so an output may
// be one of the inputs (in place).
template <typename E, int OP, typename Unit>
__device__ __forceinline__ void one_launch_move(const OneLaunchArgs& a, const typename E::A* s, u64 at,
                                           Unit* only, u64 n) {
    const u32 nr = a.nranks;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 base = (u64)blockIdx.x * blockDim.x + threadIdx.x; base < n; base += stride * 4) {
        Unit v[4];
        for (u32 r = 0; r < nr; r++) {
            const Unit* x = (const Unit*)a.in[r] + at;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u64 i = base + (u64)j * stride;
                if (i < n) v[j] = one_launch_fold<E, OP>(r, v[j], ldcg(x + i), s[r]);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u64 i = base + (u64)j * stride;
            if (i >= n) continue;
            const Unit w = one_launch_post<E, OP>(v[j], nr);
            if (only) {
                only[i] = w;
            } else {
                for (u32 r = 0; r < nr; r++)
                    if (a.out[r]) ((Unit*)a.out[r])[i] = w;
            }
        }
    }
}

// one_launch_move over n elements from element `at` of every input: 16-byte
// packs when every pointer involved is 16-byte aligned, the rest (or all,
// when one is not) element by element.
template <typename E, int OP>
__device__ __forceinline__ void one_launch_reduce(const OneLaunchArgs& a, const typename E::A* s, u64 at,
                                             void* only, u64 n) {
    typedef typename E::S S;
    constexpr u64 N = 16 / sizeof(S);
    u64 mis = (u64)only | (at * sizeof(S));
    for (u32 r = 0; r < a.nranks; r++) mis |= a.in[r] | (only ? 0 : a.out[r]);
    u64 done = 0;
    if ((mis & 15) == 0) {
        const u64 packs = n / N;
        one_launch_move<E, OP, uint4>(a, s, at / N, (uint4*)only, packs);
        done = packs * N;
    }
    if (done < n) {
        // The tail: inputs from at + done; outputs moved by `done` (`only`,
        // or every rank's, in a copy of the arguments).
        if (only) {
            one_launch_move<E, OP, S>(a, s, at + done, (S*)only + done, n - done);
        } else {
            OneLaunchArgs b = a;
            for (u32 r = 0; r < a.nranks; r++)
                if (b.out[r]) b.out[r] += done * sizeof(S);
            one_launch_move<E, OP, S>(b, s, at + done, nullptr, n - done);
        }
    }
}

template <typename E, int OP>
__device__ __forceinline__ void one_launch_run(const OneLaunchArgs& a) {
    typedef typename E::S S;
    const u32 nr = a.nranks;
    typename E::A s[ONE_LAUNCH_MAX_RANKS];
    for (u32 r = 0; r < nr; r++) s[r] = scale_of<E>(a.scalar_ptr[r], a.scale[r], a.iscale[r]);
    const u64 m = a.count;
    switch (a.mode) {
    case KERNEL_ALLREDUCE_RING_SIMPLE:
        one_launch_reduce<E, OP>(a, s, 0, nullptr, m);
        break;
    case KERNEL_REDUCE_RING_SIMPLE:
        one_launch_reduce<E, OP>(a, s, 0, (void*)a.out[a.root], m);
        break;
    case KERNEL_REDUCE_SCATTER_RING_SIMPLE:
        // Rank p's part of every input into rank p's output; in place
        // (out_p = in_p + p m) a part's values are read only by the threads
        // that write them.
        for (u32 p = 0; p < nr; p++) one_launch_reduce<E, OP>(a, s, p * m, (void*)a.out[p], m);
        break;
    case KERNEL_ALLGATHER_RING_SIMPLE: {
        // In place (in_p = out_p + p b) the copies that would read a block
        // another copy writes are the copies to self, which copy_bytes skips.
        const u64 b = m * sizeof(S);
        for (u32 r = 0; r < nr; r++)
            for (u32 p = 0; p < nr; p++) copy_bytes((char*)a.out[r] + p * b, (const char*)a.in[p], b);
        break;
    }
    case KERNEL_BROADCAST_RING_SIMPLE:
        for (u32 r = 0; r < nr; r++)
            copy_bytes((char*)a.out[r], (const char*)a.in[a.root], m * sizeof(S));
        break;
    }
}

// Each (type, op): the ring kernel, the small one-shot and two-shot LL
// collectives (small_oneshot_ll_run, small_twoshot_ll_run: each calls kernel_entry itself,
// after its early loads),
// every rank of a group of one process in one launch (one_launch_run) and the one-rank
// scaling (used for PreMulSum only).
#define OXCCL_RING(TN, E, ON, OP)                                                         \
    extern "C" __global__ void __launch_bounds__(512) oxccl_ring_##TN##_##ON(RingArgs a) { \
        kernel_entry();                                                                   \
        ring_run<E, OP>(a);                                                               \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(512) oxccl_small_##TN##_##ON(RingArgs a) {  \
        if (a.mode == KERNEL_ALLREDUCE_TWOSHOT_LL)                                                   \
            small_twoshot_ll_run<E, OP>(a);                                                       \
        else                                                                              \
            small_oneshot_ll_run<E, OP>(a);                                                       \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(512) oxccl_one_launch_##TN##_##ON(OneLaunchArgs a) { \
        kernel_entry();                                                                   \
        one_launch_run<E, OP>(a);                                                              \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(512) oxccl_scale_##TN##_##ON(RingArgs a) { \
        kernel_entry();                                                                   \
        scale_run<E, OP>(a);                                                              \
    }
#define OXCCL_RING_ALL_OPS(TN, E)      \
    OXCCL_RING(TN, E, sum, OP_SUM)     \
    OXCCL_RING(TN, E, prod, OP_PROD)   \
    OXCCL_RING(TN, E, max, OP_MAX)     \
    OXCCL_RING(TN, E, min, OP_MIN)     \
    OXCCL_RING(TN, E, avg, OP_AVG)     \
    OXCCL_RING(TN, E, premulsum, OP_PREMULSUM)
// Kernels that would repeat another's machine code are left out, and the
// launch code names the other (kernels.rs, ring_kernel_of):
// - a signed integer type's sum, prod and PreMulSum: the unsigned type of
//   its width computes them (the arithmetic is in the unsigned type, and
//   the low bits of a wrapping sum or product depend only on the operands'
//   low bits, so i8 and u8 give the same bits);
// - a floating type's avg: its PreMulSum computes it (a float average is
//   the sum of the inputs each pre-multiplied by 1/nranks: rpre, rcomb and
//   rpost treat OP_AVG and OP_PREMULSUM alike for floats).
#define OXCCL_RING_SIGNED_OPS(TN, E)   \
    OXCCL_RING(TN, E, max, OP_MAX)     \
    OXCCL_RING(TN, E, min, OP_MIN)     \
    OXCCL_RING(TN, E, avg, OP_AVG)
#define OXCCL_RING_FLOAT_OPS(TN, E)    \
    OXCCL_RING(TN, E, sum, OP_SUM)     \
    OXCCL_RING(TN, E, prod, OP_PROD)   \
    OXCCL_RING(TN, E, max, OP_MAX)     \
    OXCCL_RING(TN, E, min, OP_MIN)     \
    OXCCL_RING(TN, E, premulsum, OP_PREMULSUM)

// Every kernel, for reading only: no program holds them all. A program
// holds one type's kernels (kernels.rs, ring_program: OXCCL_RING_TYPED and
// OXCCL_RING_ONE defined, the type's line below appended), and ring_p2p
// the untyped ones (OXCCL_RING_ONE alone).
#ifndef OXCCL_RING_ONE
OXCCL_RING_SIGNED_OPS(i8, I8E)
OXCCL_RING_ALL_OPS(u8, U8E)
OXCCL_RING_SIGNED_OPS(i32, I32E)
OXCCL_RING_ALL_OPS(u32, U32E)
OXCCL_RING_SIGNED_OPS(i64, I64E)
OXCCL_RING_ALL_OPS(u64, U64E)
OXCCL_RING_FLOAT_OPS(f16, F16E)
OXCCL_RING_FLOAT_OPS(f32, F32E)
OXCCL_RING_FLOAT_OPS(f64, F64E)
OXCCL_RING_FLOAT_OPS(bf16, BF16E)
OXCCL_RING_FLOAT_OPS(e4m3, E4M3E)
OXCCL_RING_FLOAT_OPS(e5m2, E5M2E)
#endif
