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
// (then both use the two-shot all-reduce, also correct out of place).
//
// Cost per GPU: reads 2S (S local + S over NVLink), writes S, 2 barriers
// (entry: the peer's input is ready; exit: the peer finished reading ours, so
// the caller may overwrite it once the kernel returns). Floor: one launch
// (~4 us) plus one NVLink round trip for small messages; S / (peer-read
// bandwidth, ~370 GB/s measured) for large ones.
//
// In place (out aliases an input on either side) the all-reduce is two-shot
// instead (see pair_reduce): each side reduces its half and writes it to both
// outputs, so nobody reads a value its owner already overwrote, still with
// two barriers per call. The same kernels also do reduce-scatter and reduce
// (ArArgs.mode); oxccl_pcopy at the end does all-gather, broadcast and
// send/receive.
//
// Barrier values: the host passes `seq`, the first value of this call, and
// moves its counter past seq + 3 (entry, exit, a spare), so values on every
// flag word only grow (an epoch counter: a flag left by an earlier call can
// never satisfy a later call's wait).
#include "elem.cuh"

// Flag words per GPU; the mailbox (MBOX words per block) follows them, then
// the two words pair_wait reads (the ring's control words, the timeout).
#define OXCCL_MAX_BLOCKS 128
#define OXCCL_MBOX 4
#define OXCCL_CTL_WORD (OXCCL_MAX_BLOCKS * (1 + OXCCL_MBOX))

// Modes of the reducing kernels (ArArgs.mode).
enum { MODE_ALLREDUCE = 0, MODE_REDUCE_SCATTER = 1, MODE_REDUCE = 2 };
// Bits a side posts in its mailbox (ArArgs.bits adds host-chosen ones).
enum { BIT_MISALIGNED = 1, BIT_INPLACE = 2, BIT_TWO_SHOT = 4 };

struct ArArgs {
    const void* in;    // this GPU's input
    void* out;         // this GPU's output
    u64* my_flags;     // this GPU's flags + mailbox (written by the peer)
    u64* peer_flags;   // the peer's flags + mailbox (through the peer mapping)
    u64 count;         // elements (reduce-scatter: per rank)
    u64 seq;           // first barrier value of this call
    double scale;      // float avg / PreMulSum: the pre-multiplier
    u32 nranks;        // integer avg divides by this
    u32 rank;          // 0 or 1: which input is x0
    u64 iscale;        // integer PreMulSum: the scalar's bits
    u64 scalar_ptr;    // PreMulSum with a device scalar: its address (else 0)
    u32 mode;          // MODE_*
    u32 root;          // MODE_REDUCE: the rank that gets the result
    u64 bits;          // host-chosen mailbox bits (BIT_TWO_SHOT)
};

// Posts {in, out, bits, scalar} in the peer's mailbox slot of this block,
// meets the peer at barrier `seq` and reads the peer's slot into `box`
// (shared memory, 4 words). Called by the whole block.
__device__ __forceinline__ bool entry_exchange(u64* my_flags, u64* peer_flags, u64 seq,
                                               u64 in, u64 out, u64 bits, u64 scalar,
                                               u64* box, u32 peer) {
    __shared__ int ok;
    if (threadIdx.x == 0) {
        volatile u64* pb =
            (volatile u64*)(peer_flags + OXCCL_MAX_BLOCKS + OXCCL_MBOX * blockIdx.x);
        pb[0] = in;
        pb[1] = out;
        pb[2] = bits;
        pb[3] = scalar;
        __threadfence_system();
        st_release_sys(peer_flags + blockIdx.x, seq);
        ok = pair_wait(my_flags + blockIdx.x, seq, my_flags + OXCCL_CTL_WORD, peer);
        const volatile u64* mine =
            (const volatile u64*)(my_flags + OXCCL_MAX_BLOCKS + OXCCL_MBOX * blockIdx.x);
        box[0] = mine[0];
        box[1] = mine[1];
        box[2] = mine[2];
        box[3] = mine[3];
    }
    __syncthreads();
    return ok != 0;
}

// x0 op x1 with NCCL's semantics (see oxccl-core's reduce.rs): integers wrap,
// narrow floats compute in f32, float avg pre-multiplies each input by
// 1/nranks (rounded to the storage type), integer avg divides the wrapped sum.
template <typename E, int OP>
__device__ __forceinline__ typename E::S red2(typename E::S x0, typename E::S x1,
                                              typename E::A s0, typename E::A s1, u32 nranks) {
    typedef typename E::S S;
    if constexpr (E::is_float) {
        if constexpr (OP == OP_SUM) return E::store(E::load(x0) + E::load(x1));
        if constexpr (OP == OP_PROD) return E::store(E::load(x0) * E::load(x1));
        if constexpr (OP == OP_MAX) return E::store(amax(E::load(x0), E::load(x1)));
        if constexpr (OP == OP_MIN) return E::store(amin(E::load(x0), E::load(x1)));
        if constexpr (OP == OP_AVG || OP == OP_PREMULSUM) {
            S p0 = E::store(mul_rn(E::load(x0), s0));
            S p1 = E::store(mul_rn(E::load(x1), s1));
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
        if constexpr (OP == OP_PREMULSUM) {
            // Each rank's own scalar (NCCL: every rank may pass its own).
            return (S)((U)x0 * (U)s0 + (U)x1 * (U)s1);
        }
    }
    return x0;  // unreachable
}


// A unit is what one thread moves at once: a 16-byte pack, or one element.
template <typename E, int OP>
__device__ __forceinline__ uint4 red_unit(uint4 a, uint4 b, typename E::A s0, typename E::A s1, u32 nranks) {
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
    for (int i = 0; i < N; i++) uo.e[i] = red2<E, OP>(ua.e[i], ub.e[i], s0, s1, nranks);
    return uo.v;
}
template <typename E, int OP>
__device__ __forceinline__ typename E::S red_unit(typename E::S a, typename E::S b,
                                                  typename E::A s0, typename E::A s1, u32 nranks) {
    return red2<E, OP>(a, b, s0, s1, nranks);
}



// The scalar of avg / PreMulSum in the arithmetic type: from device memory
// (ncclScalarDevice) when scalar_ptr is set, else from the launch arguments.
template <typename E>
__device__ __forceinline__ typename E::A scale_of(const ArArgs& a) {
    typedef typename E::S S;
    typedef typename E::A A;
    if constexpr (E::is_float) {
        if (a.scalar_ptr != 0) return E::load(*(const volatile S*)a.scalar_ptr);
        return (A)a.scale;
    } else {
        if (a.scalar_ptr != 0) return (A) * (const volatile S*)a.scalar_ptr;
        return (A)a.iscale;
    }
}

// oa[i] = ob[i] = x0[i] op x1[i] for units i in [lo, hi) (ob may be NULL),
// spread over the grid, OXCCL_UNROLL units per thread per step; every value
// is loaded before any is stored, and a unit is touched by one thread only,
// so oa may alias x0 or x1 (in place).
template <typename E, int OP, typename Unit>
__device__ __forceinline__ void red_range(const Unit* x0, const Unit* x1, Unit* oa, Unit* ob,
                                          u64 lo, u64 hi, typename E::A s0, typename E::A s1, u32 nranks) {
    const u64 stride = (u64)blockDim.x * gridDim.x;
    for (u64 base = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x; base < hi;
         base += stride * OXCCL_UNROLL) {
        Unit v0[OXCCL_UNROLL], v1[OXCCL_UNROLL];
#pragma unroll
        for (int j = 0; j < OXCCL_UNROLL; j++) {
            const u64 i = base + (u64)j * stride;
            if (i < hi) {
                v0[j] = ldcg(x0 + i);
                v1[j] = ldcg(x1 + i);
            }
        }
#pragma unroll
        for (int j = 0; j < OXCCL_UNROLL; j++) {
            const u64 i = base + (u64)j * stride;
            if (i < hi) {
                const Unit r = red_unit<E, OP>(v0[j], v1[j], s0, s1, nranks);
                oa[i] = r;
                if (ob) ob[i] = r;
            }
        }
    }
}

// Elements [lo, hi) of S-typed arrays: 16-byte packs when `vec` (all four
// base pointers 16-byte aligned), the unaligned head and tail by block 0.
template <typename E, int OP>
__device__ __forceinline__ void red_elems(const void* x0v, const void* x1v, void* oav, void* obv,
                                          u64 lo, u64 hi, bool vec, typename E::A s0,
                                          typename E::A s1, u32 nranks) {
    typedef typename E::S S;
    const S* x0 = (const S*)x0v;
    const S* x1 = (const S*)x1v;
    S* oa = (S*)oav;
    S* ob = (S*)obv;
    if (hi <= lo) return;
    if (!vec) {
        red_range<E, OP, S>(x0, x1, oa, ob, lo, hi, s0, s1, nranks);
        return;
    }
    constexpr u64 N = 16 / sizeof(S);
    u64 ulo = (lo + N - 1) / N, uhi = hi / N;
    if (uhi < ulo) uhi = ulo;
    red_range<E, OP, uint4>((const uint4*)x0, (const uint4*)x1, (uint4*)oa, (uint4*)ob, ulo, uhi,
                            s0, s1, nranks);
    if (blockIdx.x == 0) {
        const u64 hend = ulo * N < hi ? ulo * N : hi;  // head: [lo, hend)
        for (u64 i = lo + threadIdx.x; i < hend; i += blockDim.x) {
            const S r = red2<E, OP>(ldcg(x0 + i), ldcg(x1 + i), s0, s1, nranks);
            oa[i] = r;
            if (ob) ob[i] = r;
        }
        const u64 tlo = uhi * N > hend ? uhi * N : hend;  // tail: [tlo, hi)
        for (u64 i = tlo + threadIdx.x; i < hi; i += blockDim.x) {
            const S r = red2<E, OP>(ldcg(x0 + i), ldcg(x1 + i), s0, s1, nranks);
            oa[i] = r;
            if (ob) ob[i] = r;
        }
    }
}

// The reducing kernels' body. Entry barrier (the mailbox exchange: the peer's
// input and output pointers and bits), the work of the mode, exit barrier
// (the peer finished reading our input and writing our output, so the caller
// may use both once the kernel ends). Two barriers per call, whatever the size.
//
// All-reduce, one-shot (out of place, smaller messages): both sides read both
// inputs over the whole buffer and write their own output.
// All-reduce, two-shot (in place, or BIT_TWO_SHOT from either side): rank r
// reduces its half of the elements and writes the result to both outputs
// (its own and, through the peer mapping, the peer's). The halves never
// overlap, so in place needs no barrier between reading and writing: nobody
// else reads or writes a half but its owner. Per GPU: S/2 read from the
// peer, S/2 written to the peer, as the one-shot's S read.
// Reduce-scatter: rank r reduces block r of both inputs into its output.
// Reduce: the root reduces both inputs into its output; the other side only
// keeps its input alive until the root is done (the exit barrier).
template <typename E, int OP>
__device__ __forceinline__ void pair_reduce(const ArArgs& a) {
    typedef typename E::S S;
    typedef typename E::A A;
    __shared__ u64 box[4];
    const u64 sz = sizeof(S);
    const u64 extra = a.mode == MODE_REDUCE_SCATTER ? a.count * sz : 0;
    const u64 my_bits = ((((u64)a.in | (u64)a.out | extra) & 15) != 0 ? BIT_MISALIGNED : 0) |
                        (a.in == (const void*)a.out ? BIT_INPLACE : 0) | a.bits;
    // Each rank's scalar (avg, PreMulSum) travels with its pointers: with
    // PreMulSum every rank may pass its own (nccl-tests does: 1 and 2).
    union {
        A v;
        u64 u;
    } mine, theirs;
    mine.u = 0;
    mine.v = scale_of<E>(a);
    if (!entry_exchange(a.my_flags, a.peer_flags, a.seq, (u64)a.in, (u64)a.out, my_bits, mine.u,
                        box, 1 - a.rank))
        return;
    theirs.u = box[3];
    const A s0 = a.rank == 0 ? mine.v : theirs.v;
    const A s1 = a.rank == 0 ? theirs.v : mine.v;
    const void* peer_in = (const void*)box[0];
    void* peer_out = (void*)box[1];
    const u64 bits = my_bits | box[2];
    const bool vec = (bits & BIT_MISALIGNED) == 0;
    const void* in0 = a.rank == 0 ? a.in : peer_in;
    const void* in1 = a.rank == 0 ? peer_in : a.in;
    if (a.mode == MODE_ALLREDUCE) {
        if ((bits & (BIT_INPLACE | BIT_TWO_SHOT)) == 0) {
            red_elems<E, OP>(in0, in1, a.out, nullptr, 0, a.count, vec, s0, s1, a.nranks);
        } else {
            // Split at a 16-byte pack boundary (both sides compute the same).
            constexpr u64 N = 16 / sizeof(S);
            const u64 half = (a.count / N / 2) * N;
            const u64 lo = a.rank == 0 ? 0 : half;
            const u64 hi = a.rank == 0 ? half : a.count;
            red_elems<E, OP>(in0, in1, a.out, peer_out, lo, hi, vec, s0, s1, a.nranks);
        }
    } else if (a.mode == MODE_REDUCE_SCATTER) {
        const u64 off = (u64)a.rank * a.count * sz;
        red_elems<E, OP>((const char*)in0 + off, (const char*)in1 + off, a.out, nullptr, 0,
                         a.count, vec, s0, s1, a.nranks);
    } else if (a.rank == a.root) {
        red_elems<E, OP>(in0, in1, a.out, nullptr, 0, a.count, vec, s0, s1, a.nranks);
    }
    pair_barrier(a.my_flags + blockIdx.x, a.peer_flags + blockIdx.x, a.seq + 1,
                 a.my_flags + OXCCL_CTL_WORD, 1 - a.rank);
}

// ---- Copies between the two GPUs (all-gather, broadcast, send/receive) ----

enum { CP_ALLGATHER = 0, CP_BROADCAST = 1, CP_P2P = 2 };

struct CpArgs {
    const void* in;   // this GPU's input (send buffer), or NULL
    void* out;        // this GPU's output (receive buffer), or NULL
    u64* my_flags;
    u64* peer_flags;
    u64 bytes;        // all-gather: per rank; broadcast: all; p2p: to receive
    u64 seq;
    u32 mode;         // CP_*
    u32 rank;
    u32 root;         // broadcast
    u32 pad;
    // p2p: a copy of this rank to itself (gather, scatter, all-to-all),
    // done by the same grid after the peer's data (0 bytes: none).
    char* self_dst;
    const char* self_src;
    u64 self_bytes;
};

// Only in the pair program (ALLREDUCE), not in the copy-engine ones.
#ifndef OXCCL_CER_ONE
// Entry barrier (mailbox: the peer's in/out pointers), then each side pulls
// what it needs into its own output, then the exit barrier (the peer finished
// reading our input). Both sides launch the same grid (from the same bytes).
extern "C" __global__ void __launch_bounds__(512) oxccl_pcopy(CpArgs a) {
    __shared__ u64 box[4];
    kernel_entry();
    if (!entry_exchange(a.my_flags, a.peer_flags, a.seq, (u64)a.in, (u64)a.out, 0, 0, box,
                        1 - a.rank))
        return;
    const char* peer_in = (const char*)box[0];
    const u32 peer = 1 - a.rank;
    if (a.mode == CP_ALLGATHER) {
        copy_bytes((char*)a.out + a.rank * a.bytes, (const char*)a.in, a.bytes);
        copy_bytes((char*)a.out + peer * a.bytes, peer_in, a.bytes);
    } else if (a.mode == CP_BROADCAST) {
        copy_bytes((char*)a.out, a.rank == a.root ? (const char*)a.in : peer_in, a.bytes);
    } else {
        if (a.out != nullptr && peer_in != nullptr) copy_bytes((char*)a.out, peer_in, a.bytes);
        copy_bytes(a.self_dst, a.self_src, a.self_bytes);
    }
    pair_barrier(a.my_flags + blockIdx.x, a.peer_flags + blockIdx.x, a.seq + 1,
                 a.my_flags + OXCCL_CTL_WORD, 1 - a.rank);
}
#endif  // OXCCL_CER_ONE


// ---- Copy-engine all-reduce / reduce-scatter: the reducing kernel ----
//
// See crates/oxccl-cuda/src/ce_reduce.rs for the whole call. This rank owns
// `count` elements (its part); a copy stream pulls the peer's values of the
// part into a ring of `slots` slots of `piece` elements (this GPU's scratch)
// and, after each piece, writes landed[slot] = piece number + 1 with
// cuStreamWriteValue32 (whose default memory barrier makes the copy's bytes
// visible first). This kernel, on the caller's stream, takes the pieces in
// order: thread 0 of each block waits for the piece's landed flag, the grid
// computes out = x0 op x1 for the piece (x0 is rank 0's value, so the bits are
// NCCL's pair order), and the last block through the piece (a per-slot block
// counter) puts landed and the counter back to 0 and writes consumed[slot] =
// piece number + 1, which the copy stream waits for before it refills the
// slot. Flags are left at 0 between calls (the copy stream clears consumed),
// so a replay of the same work starts from what the first run saw.
//
// Bound: per piece, reads 2 x piece and writes 1 x piece from this GPU's
// memory, which must keep up with the copy engine's 390 GB/s into the ring:
// ~1.2 TB/s, which a fraction of the SMs (the host launches 32 blocks) gives,
// leaving the rest to the caller's kernels.
//
// The waits for landed flags spin without a bound: they wait for this
// GPU's own copy stream, queued by the same call right after this kernel
// (the peer is met by the barriers around it, which observe abort and the
// timeout); only a copy stream that failed halfway through its queue would
// leave this kernel waiting.
//
// Pushed pieces (`landed_at` set; two processes, out of place: xp.rs and
// ce_reduce.rs `plan_pushed`): the PEER's copy stream writes piece k of
// this rank's part straight into `out` at its place and then k + 1 into
// *landed_at (a u64 in this rank's ring window, cuStreamWriteValue32 with
// its memory barrier, on the low word); the kernel reduces out = in op out in place, piece
// by piece. No slots, so no consumed flags and no wait of either copy
// stream on the other rank. The wait for a piece is on the peer's stream,
// so it is bounded: the ring's control words (abort, an error already
// recorded) and the timeout, as every ring wait. The last block through
// the last piece puts the counter (and its block counter, the next u32
// after it) back to 0 for the next call, which pushes only after its first
// barrier, so after this kernel.
//
// In place (`zone` set; ce_reduce.rs `plan_pushed_in_place`): `out` is
// `in`, so the peer's pieces land elsewhere: element i of the part below
// `piece` at `scratch` + i, from `piece` on at `zone` + (i - piece) (this
// rank's copy of the peer's part, whose values this rank's own pushes have
// sent on by then). The counter is then the ring's other word, which the
// host puts back to 0 after the call's last barrier (the peer's copy stream
// waits on it too, so the kernel must leave it alone).
//
// Into a slot ring (`consumed_at` set; ce_reduce.rs `plan_pushed_ring`, an
// in-place reduce-scatter): piece k lands in slot k mod `slots` of `piece`
// elements at `scratch`, and the last block through a piece (a per-slot
// block counter in `flags`, the scratch's flag words) writes the pieces
// reduced so far into the peer's window (`consumed_at`), which the peer's
// copy stream waits for before it refills that slot. The landed counter is
// this kernel's alone then, put back to 0 after the last piece.
//
// Copy streams (`streams`, 1 or 2): piece k travels on stream k mod streams,
// and each stream counts its own landed pieces in its 32-bit half of the
// counter, so piece k has landed once half (k mod streams) reached
// k / streams + 1, whichever stream finishes first (ce_reduce.rs,
// counter_slot). With one stream that is the low word reaching k + 1.
struct CerArgs {
    const void* in;       // this rank's input, at its part
    void* out;            // this rank's output, at its part
    const char* scratch;  // slot 0 (slot s at s * piece elements)
    u32* flags;           // landed[], consumed[] at CER_CONSUMED, counters at CER_DONE
    u64 count;            // elements of the part
    u64 piece;            // elements per piece (a slot), a multiple of 16 bytes
    u32 slots;
    u32 rank;             // 0: `in` is x0; 1: the pulled values are x0
    u64* landed_at;       // pushed: pieces landed in `out` (null: the slot ring)
    u32* ctrl;            // pushed: the ring's control words (abort, error, peer, block)
    u64 timeout_ns;       // pushed: a wait longer than this is an error (0: never)
    u32 peer;             // pushed: the peer's rank (named in an error)
    u32 taper;            // pushed: halvings of the last piece (see ce_reduce_pushed)
    const char* zone;     // pushed in place: where pieces after the first land (null: in `out`)
    u32 streams;          // pushed: copy streams the pieces alternate on (1 or 2)
    u32* consumed_at;     // pushed into a slot ring: the peer's word for pieces reduced (else null)
};
enum { CER_CONSUMED = 16, CER_DONE = 32 };

__device__ __forceinline__ void st_release_sys32(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Pushed pieces (see CerArgs): out = in op out (or the landed copy), piece k
// once its stream's half of *landed_at counted it; the grid stops where a
// wait gave up (its error recorded).
template <typename E, int OP>
__device__ __forceinline__ void ce_reduce_pushed(const CerArgs& a) {
    const u64 sz = sizeof(typename E::S);
    const bool staged = a.zone != nullptr;
    const bool ringed = a.consumed_at != nullptr;
    const u64 away = staged ? ((u64)a.scratch | (u64)a.zone) : ringed ? (u64)a.scratch : 0ull;
    const bool vec = ((((u64)a.in) | ((u64)a.out) | away) & 15) == 0;
    u32* done = (u32*)(a.landed_at + 1);
    __shared__ int ok;
    // Pieces of `piece` elements, but the last one (s elements) is cut into
    // s/2, s/4, ... (`taper` halvings, each a whole number of 16-byte units)
    // and what remains, so the reduction left after the last copy is short
    // (ce_reduce.rs, Reduce::pieces, cuts the same).
    const u64 unit = sz >= 16 ? 1 : 16 / sz;
    u64 lo = 0, s = 0;
    u32 j = 0;
    for (u64 k = 0; lo < a.count; k++) {
        const u64 rest = a.count - lo;
        u64 n = rest;
        if (rest > a.piece) {
            n = a.piece;
        } else {
            if (s == 0) s = rest;
            if (j < a.taper) {
                const u64 h = (s >> (j + 1)) / unit * unit;
                if (h >= unit && h < rest) n = h;
            }
            j++;
        }
        if (threadIdx.x == 0) {
            const u32 ns = a.streams == 2 ? 2u : 1u;
            ok = ctl_wait((const u32*)a.landed_at + (u32)(k % ns), (u32)(k / ns) + 1u, a.ctrl,
                            a.timeout_ns, a.peer);
        }
        __syncthreads();
        if (!ok) return;
        const char* mine = (const char*)a.in + lo * sz;
        char* both = (char*)a.out + lo * sz;
        // Pieces never straddle `piece` (the first one ends there).
        const char* pushed = ringed         ? a.scratch + (k % a.slots) * a.piece * sz
                             : !staged      ? both
                             : lo < a.piece ? a.scratch + lo * sz
                                            : a.zone + (lo - a.piece) * sz;
        // The pushed values are read through L2 (red_range's ldcg): they came
        // from the peer's copy engine, never through this SM's L1.
        red_elems<E, OP>(a.rank == 0 ? (const void*)mine : (const void*)pushed,
                         a.rank == 0 ? (const void*)pushed : (const void*)mine, both, nullptr, 0,
                         n, vec, (typename E::A)0, (typename E::A)0, 2u);
        __syncthreads();  // `ok` is read by all before thread 0 writes it again
        lo += n;
        if (ringed && threadIdx.x == 0) {
            // This block is done with the slot (its reads returned before
            // the barrier above). The slot's block counter (in the scratch's
            // flags, 0 between uses) finds the grid's last one, which puts
            // it back to 0 and then tells the peer: the slot's next piece
            // lands only after that, so no block counts it early. Piece k
            // completes only after every block finished k - 1, and each
            // block fences before it counts, so the counts reach the peer
            // in order.
            u32* cnt = a.flags + CER_DONE + (u32)(k % a.slots);
            __threadfence();
            if (atomicAdd(cnt, 1u) == gridDim.x - 1) {
                atomicExch(cnt, 0u);
                __threadfence_system();
                st_release_sys32(a.consumed_at, (u32)(k + 1));
                if (lo >= a.count) *(volatile u64*)a.landed_at = 0ull;
            }
        }
    }
    if (threadIdx.x == 0 && a.count > 0 && !staged && !ringed) {
        __threadfence();
        if (atomicAdd(done, 1u) == gridDim.x - 1) {
            // Every block has seen the last piece's value: nothing waits on
            // the counter any more this call.
            atomicExch(done, 0u);
            *(volatile u64*)a.landed_at = 0ull;
            __threadfence_system();
        }
    }
}

template <typename E, int OP>
__device__ __forceinline__ void ce_reduce(const CerArgs& a) {
    if (a.landed_at != nullptr) {
        ce_reduce_pushed<E, OP>(a);
        return;
    }
    typedef typename E::S S;
    typedef typename E::A A;
    const u64 sz = sizeof(S);
    // The part's pointers keep the buffers' alignment (parts and pieces
    // start at 16-byte multiples); the slots are 16-byte aligned.
    const bool vec = ((((u64)a.in) | ((u64)a.out)) & 15) == 0;
    u32* landed = a.flags;
    u32* consumed = a.flags + CER_CONSUMED;
    u32* done = a.flags + CER_DONE;
    const u64 pieces = (a.count + a.piece - 1) / a.piece;
    for (u64 k = 0; k < pieces; k++) {
        const u32 s = (u32)(k % a.slots);
        const u32 tag = (u32)(k + 1);
        if (threadIdx.x == 0) {
            while (ld_acquire_sys32(landed + s) != tag) {
            }
        }
        __syncthreads();
        const u64 lo = k * a.piece;
        const u64 n = a.count - lo < a.piece ? a.count - lo : a.piece;
        const char* mine = (const char*)a.in + lo * sz;
        const char* theirs = a.scratch + (u64)s * a.piece * sz;
        // Slot reads go through ldcg (L2): a slot's earlier piece may sit in L1.
        red_elems<E, OP>(a.rank == 0 ? (const void*)mine : (const void*)theirs,
                         a.rank == 0 ? (const void*)theirs : (const void*)mine,
                         (char*)a.out + lo * sz, nullptr, 0, n, vec, (A)0, (A)0, 2u);
        __syncthreads();  // the block's reads of the slot are done
        if (threadIdx.x == 0) {
            __threadfence();
            if (atomicAdd(done + s, 1u) == gridDim.x - 1) {
                atomicExch(done + s, 0u);
                *(volatile u32*)(landed + s) = 0u;
                __threadfence_system();
                st_release_sys32(consumed + s, tag);
            }
        }
    }
}

// The reducing kernel of (type, op). A program holds one type's four
// (kernels.rs `ce_reduce_variant`, which defines OXCCL_CER_ONE and leaves
// out the 72 pair kernels below and oxccl_pcopy).
#define OXCCL_CER(TN, E, ON, OP)                                                          \
    extern "C" __global__ void __launch_bounds__(512) oxccl_cer_##TN##_##ON(CerArgs a) { \
        kernel_entry();                                                                   \
        ce_reduce<E, OP>(a);                                                              \
    }

// A copy stream's wait on the peer (ce_reduce.rs `plan_pushed_in_place`):
// thread 0 until the 32-bit half of the counter at `landed_at` reaches
// `count`, bounded as every ring wait (abort, an
// error already recorded, the timeout; a wait that gives up records it and
// ends, and the call's kernel and barriers then stop too). Launched on the
// copy stream before a push that lands where the peer's own pushes read;
// cuStreamWaitValue would wait without a bound. One per type's program,
// beside the kernels it serves.
extern "C" __global__ void __launch_bounds__(32) oxccl_cer_wait(CerArgs a) {
    kernel_entry();
    if (threadIdx.x == 0)
        ctl_wait((const u32*)a.landed_at, (u32)a.count, a.ctrl, a.timeout_ns, a.peer);
}

#define OXCCL_CER_ALL_OPS(TN, E)  \
    OXCCL_CER(TN, E, sum, OP_SUM)   \
    OXCCL_CER(TN, E, prod, OP_PROD) \
    OXCCL_CER(TN, E, max, OP_MAX)   \
    OXCCL_CER(TN, E, min, OP_MIN)

#define OXCCL_AR1(TN, E, ON, OP)                                                         \
    extern "C" __global__ void __launch_bounds__(512) oxccl_ar1_##TN##_##ON(ArArgs a) { \
        kernel_entry();                                                                  \
        pair_reduce<E, OP>(a);                                                           \
    }
#define OXCCL_AR1_ALL_OPS(TN, E)      \
    OXCCL_AR1(TN, E, sum, OP_SUM)     \
    OXCCL_AR1(TN, E, prod, OP_PROD)   \
    OXCCL_AR1(TN, E, max, OP_MAX)     \
    OXCCL_AR1(TN, E, min, OP_MIN)     \
    OXCCL_AR1(TN, E, avg, OP_AVG)     \
    OXCCL_AR1(TN, E, premulsum, OP_PREMULSUM)

#ifndef OXCCL_CER_ONE
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
// fp8 conversions need sm_89 or newer (common.cuh): a build for an older
// GPU (sm_80) leaves these out, and the rest of the module still loads.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
OXCCL_AR1_ALL_OPS(e4m3, E4M3E)
OXCCL_AR1_ALL_OPS(e5m2, E5M2E)
#endif
#endif  // OXCCL_CER_ONE
