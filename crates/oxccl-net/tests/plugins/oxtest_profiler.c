/* A profiler plugin for NCCL's ncclProfiler ABI, written the way a third
 * party would, that tests compile with cc. -DPROFILER_VERSION=N (1 to 6,
 * default 6) makes it export ncclProfiler_vN only, with that version's
 * init signature and event descriptor (oxtest_profiler_abi.h). It asks for
 * the events in -DMASK=... (default: group, collective and
 * point-to-point), counts every start and stop per rank and kind, checks
 * each descriptor (strings set; members older versions keep but NCCL no
 * longer fills are NULL or 0; a child's parent is a live group of the same
 * rank when groups are on, NULL otherwise) and keeps the last collective's
 * and point-to-point's fields per rank (v1's numbers named back, and kept
 * as numbers too), all in exported arrays that the test reads.
 * -DFAIL_INIT makes init fail; -DNO_STOP exports a table without stopEvent;
 * -DEXPORT_AS=name exports the table under another name.
 */
#include <stdlib.h>
#include <string.h>

#include "oxtest_profiler_abi.h"

#ifndef PROFILER_VERSION
#define PROFILER_VERSION 6
#endif
#ifndef MASK
#define MASK ((1 << 0) | (1 << 1) | (1 << 2))
#endif
#define MAX_RANKS 16

enum { GROUP = 1 << 0, COLL = 1 << 1, P2P = 1 << 2 };

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
typedef CAT(CAT(descr_v, PROFILER_VERSION), _t) descr_t;
#ifdef EXPORT_AS
#define TABLE EXPORT_AS
#else
#define TABLE CAT(ncclProfiler_v, PROFILER_VERSION)
#endif

#if PROFILER_VERSION >= 4
#define COLL_NCH(d) ((d)->coll.nChannels)
#else
#define COLL_NCH(d) ((d)->coll.nMaxChannels)
#endif

typedef struct {
  uint64_t type;
  int rank;
  int magic;
} event_t;

int oxtest_prof_inits = 0;
int oxtest_prof_finalizes = 0;
/* [rank][0 group, 1 coll, 2 p2p] */
int oxtest_prof_started[MAX_RANKS][3];
int oxtest_prof_stopped[MAX_RANKS][3];
int oxtest_prof_bad[MAX_RANKS];
int oxtest_prof_version = PROFILER_VERSION;
/* v1's numbers of the last collective (func, datatype, algo, proto) and
 * point-to-point (func, datatype) of each rank. */
int oxtest_prof_coll_codes[MAX_RANKS][4];
int oxtest_prof_p2p_codes[MAX_RANKS][2];
/* The last collective of each rank. */
uint64_t oxtest_prof_coll_seq[MAX_RANKS];
size_t oxtest_prof_coll_count[MAX_RANKS];
int oxtest_prof_coll_root[MAX_RANKS];
int oxtest_prof_coll_nch[MAX_RANKS];
char oxtest_prof_coll_func[MAX_RANKS][32];
char oxtest_prof_coll_dtype[MAX_RANKS][32];
char oxtest_prof_coll_algo[MAX_RANKS][32];
char oxtest_prof_coll_proto[MAX_RANKS][32];
/* The last point-to-point of each rank. */
int oxtest_prof_p2p_peer[MAX_RANKS];
size_t oxtest_prof_p2p_count[MAX_RANKS];
char oxtest_prof_p2p_dtype[MAX_RANKS][32];
char oxtest_prof_p2p_func[MAX_RANKS][32];

static int marker;

static void copy(char* dst, const char* src) {
  strncpy(dst, src ? src : "(null)", 31);
  dst[31] = 0;
}

#if PROFILER_VERSION == 1
/* ncclFunc_t, ncclDataType_t, NCCL_ALGO_*, NCCL_PROTO_* named back. */
static const char* name_of(int code, const char* const* names, int n) {
  return code >= 0 && code < n ? names[code] : "(unknown)";
}
static const char* const funcs[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv",
                                    "Send", "Recv", "AlltoAll", "Scatter", "Gather"};
static const char* const dtypes[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
                                     "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16"};
static const char* const algos[] = {"Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"};
static const char* const protos[] = {"LL", "LL128", "Simple"};
#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))
#endif

static ncclResult_t init_common(void** ctx, int* mask) {
  __atomic_add_fetch(&oxtest_prof_inits, 1, __ATOMIC_SEQ_CST);
#ifdef FAIL_INIT
  return 3;
#endif
  *mask = MASK;
  *ctx = &marker;
  return 0;
}

#if PROFILER_VERSION >= 5
static ncclResult_t init(void** ctx, uint64_t commId, int* mask, const char* commName, int nNodes, int nranks,
                         int rank, logger_t log) {
  (void)commId; (void)commName; (void)log;
  if (nNodes < 1 || nranks < 1 || rank < 0 || rank >= nranks) return 4;
  return init_common(ctx, mask);
}
#elif PROFILER_VERSION == 4
static ncclResult_t init(void** ctx, int* mask, const char* commName, uint64_t commHash, int nNodes, int nranks,
                         int rank, logger_t log) {
  (void)commHash; (void)log;
  if (!commName || nNodes < 1 || nranks < 1 || rank < 0 || rank >= nranks) return 4;
  return init_common(ctx, mask);
}
#else
static ncclResult_t init(void** ctx, int* mask) { return init_common(ctx, mask); }
#endif

static ncclResult_t start_event(void* ctx, void** handle, descr_t* d) {
  *handle = NULL;
  int r = d->rank;
  if (ctx != &marker || r < 0 || r >= MAX_RANKS) return 4;
  int k = d->type == GROUP ? 0 : d->type == COLL ? 1 : d->type == P2P ? 2 : -1;
  if (k < 0 || !(d->type & MASK)) {
    __atomic_add_fetch(&oxtest_prof_bad[r], 1, __ATOMIC_SEQ_CST);
    return 0;
  }
  if (k > 0) {
    event_t* parent = (event_t*)d->parentObj;
    bool parent_ok = (MASK & GROUP) ? (parent && parent->magic == 0x6f78 && parent->type == GROUP && parent->rank == r)
                                    : parent == NULL;
    if (!parent_ok) __atomic_add_fetch(&oxtest_prof_bad[r], 1, __ATOMIC_SEQ_CST);
  }
  if (k == 1) {
#if PROFILER_VERSION <= 3
    if (d->coll.name || d->coll.commHash) __atomic_add_fetch(&oxtest_prof_bad[r], 1, __ATOMIC_SEQ_CST);
#endif
#if PROFILER_VERSION <= 2
    if (d->coll.trafficBytes) __atomic_add_fetch(&oxtest_prof_bad[r], 1, __ATOMIC_SEQ_CST);
#endif
#if PROFILER_VERSION == 1
    if (d->coll.op) __atomic_add_fetch(&oxtest_prof_bad[r], 1, __ATOMIC_SEQ_CST);
    oxtest_prof_coll_codes[r][0] = d->coll.func;
    oxtest_prof_coll_codes[r][1] = d->coll.datatype;
    oxtest_prof_coll_codes[r][2] = d->coll.algo;
    oxtest_prof_coll_codes[r][3] = d->coll.proto;
    const char* func = name_of(d->coll.func, funcs, N(funcs));
    const char* dtype = name_of(d->coll.datatype, dtypes, N(dtypes));
    const char* algo = name_of(d->coll.algo, algos, N(algos));
    const char* proto = name_of(d->coll.proto, protos, N(protos));
#else
    const char *func = d->coll.func, *dtype = d->coll.datatype, *algo = d->coll.algo, *proto = d->coll.proto;
#endif
    if (!func || !dtype || !algo || !proto || COLL_NCH(d) == 0)
      __atomic_add_fetch(&oxtest_prof_bad[r], 1, __ATOMIC_SEQ_CST);
    oxtest_prof_coll_seq[r] = d->coll.seqNumber;
    oxtest_prof_coll_count[r] = d->coll.count;
    oxtest_prof_coll_root[r] = d->coll.root;
    oxtest_prof_coll_nch[r] = COLL_NCH(d);
    copy(oxtest_prof_coll_func[r], func);
    copy(oxtest_prof_coll_dtype[r], dtype);
    copy(oxtest_prof_coll_algo[r], algo);
    copy(oxtest_prof_coll_proto[r], proto);
  } else if (k == 2) {
#if PROFILER_VERSION <= 3
    if (d->p2p.name || d->p2p.commHash) __atomic_add_fetch(&oxtest_prof_bad[r], 1, __ATOMIC_SEQ_CST);
#endif
#if PROFILER_VERSION == 1
    oxtest_prof_p2p_codes[r][0] = d->p2p.func;
    oxtest_prof_p2p_codes[r][1] = d->p2p.datatype;
    const char* func = name_of(d->p2p.func, funcs, N(funcs));
    const char* dtype = name_of(d->p2p.datatype, dtypes, N(dtypes));
#else
    const char *func = d->p2p.func, *dtype = d->p2p.datatype;
#endif
    if (!func || !dtype) __atomic_add_fetch(&oxtest_prof_bad[r], 1, __ATOMIC_SEQ_CST);
    oxtest_prof_p2p_peer[r] = d->p2p.peer;
    oxtest_prof_p2p_count[r] = d->p2p.count;
    copy(oxtest_prof_p2p_func[r], func);
    copy(oxtest_prof_p2p_dtype[r], dtype);
  }
  event_t* e = malloc(sizeof(event_t));
  e->type = d->type;
  e->rank = r;
  e->magic = 0x6f78;
  __atomic_add_fetch(&oxtest_prof_started[r][k], 1, __ATOMIC_SEQ_CST);
  *handle = e;
  return 0;
}

__attribute__((unused)) static ncclResult_t stop_event(void* handle) {
  event_t* e = (event_t*)handle;
  if (!e || e->magic != 0x6f78) return 4;
  int k = e->type == GROUP ? 0 : e->type == COLL ? 1 : 2;
  __atomic_add_fetch(&oxtest_prof_stopped[e->rank][k], 1, __ATOMIC_SEQ_CST);
  /* Groups stop after their children: freeing here is safe. */
  e->magic = 0;
  free(e);
  return 0;
}

static ncclResult_t record_state(void* handle, int state, void* args) {
  (void)handle; (void)state; (void)args;
  return 0;
}

static ncclResult_t finalize(void* ctx) {
  __atomic_add_fetch(&oxtest_prof_finalizes, 1, __ATOMIC_SEQ_CST);
  return ctx == &marker ? 0 : 4;
}

struct {
  const char* name;
  void* init;
  void* startEvent;
  void* stopEvent;
  void* recordEventState;
  void* finalize;
} TABLE = {"oxtest-profiler", (void*)init, (void*)start_event,
#ifdef NO_STOP
           NULL,
#else
           (void*)stop_event,
#endif
           (void*)record_state, (void*)finalize};
