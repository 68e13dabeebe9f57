/* A profiler plugin for NCCL's ncclProfiler ABI, written the way a third
 * party would, that tests compile with cc. -DPROFILER_VERSION=N (1 to 6,
 * default 6) makes it export ncclProfiler_vN only, with that version's
 * init signature and event descriptor (oxtest_profiler_abi.h). It asks for
 * the events in -DMASK=... (default: group, collective and
 * point-to-point), counts every start and stop per rank and kind (and
 * apart, the events started of kinds its mask left out: NCCL starts the
 * parents of wanted events too), every state recorded per rank, and checks
 * each descriptor: a kind its version defines; strings set; members older
 * versions keep but NCCL no longer fills NULL or 0; parents as NCCL sets
 * them (group API: none; collective and point-to-point API: a live group
 * API event of the same rank; group: none; collective and point-to-point:
 * their API event from v5 on, `parentGroup` or, before v5, `parentObj` a
 * live group event of the same rank); group API states in NCCL's order
 * (start-API-stop, then end-API-start, then the stop). It keeps the last
 * collective's, point-to-point's and API events' fields per rank (v1's
 * numbers named back, and kept as numbers too), all in exported arrays
 * that the test reads. Events are never freed: an API event's handle
 * stays the parent of its operation after it stopped, as in NCCL.
 * -DFAIL_INIT makes init fail; -DNO_STOP exports a table without stopEvent;
 * -DEXPORT_AS=name exports the table under another name; -DAPI_STREAM
 * makes the API events' `stream` required (calls on device buffers pass
 * theirs) where it is otherwise required NULL (host buffers). It also
 * checks that each rank's collectives are numbered from 0 per function,
 * one after another (oxtest_prof_seq_bad counts those that are not; the
 * numbering is per communicator, so that holds for a process with one
 * communicator per rank).
 */
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "oxtest_profiler_abi.h"

#ifndef PROFILER_VERSION
#define PROFILER_VERSION 6
#endif
#ifndef MASK
#define MASK ((1 << 0) | (1 << 1) | (1 << 2))
#endif
#define MAX_RANKS 16

enum {
  GROUP = 1 << 0,
  COLL = 1 << 1,
  P2P = 1 << 2,
  PROXY_OP = 1 << 3,
  PROXY_STEP = 1 << 4,
  GROUP_API = 1 << 8,
  COLL_API = 1 << 9,
  P2P_API = 1 << 10,
  KERNEL_LAUNCH = 1 << 11
};
/* ncclProfilerEventState_t values. */
enum {
  SEND_WAIT = 9,
  RECV_WAIT = 10,
  PROXY_OP_IN_PROGRESS = 19,
  SEND_PEER_WAIT = 20,
  GROUP_START_API_STOP = 23,
  GROUP_END_API_START = 24
};
#define NKINDS 16
#define NSTATES 32

#if PROFILER_VERSION >= 6
#define KNOWN ((1 << 15) - 1)
#elif PROFILER_VERSION == 5
#define KNOWN ((1 << 12) - 1)
#elif PROFILER_VERSION >= 3
#define KNOWN ((1 << 8) - 1)
#else
#define KNOWN ((1 << 6) - 1)
#endif

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

typedef struct event {
  uint64_t type;
  int rank;
  int magic;
  int stopped;
  int last_state;
  /* Proxy operations: steps declared and started; steps: their operation. */
  int n_steps;
  int steps_seen;
  int is_send;
  struct event* op;
} event_t;

int oxtest_prof_inits = 0;
int oxtest_prof_finalizes = 0;
/* [rank][kind's bit: 0 group, 1 coll, 2 p2p, 8 group API, ...] */
int oxtest_prof_started[MAX_RANKS][NKINDS];
int oxtest_prof_stopped[MAX_RANKS][NKINDS];
/* Started though MASK leaves the kind out. */
int oxtest_prof_unasked[MAX_RANKS][NKINDS];
/* [rank][ncclProfilerEventState_t] */
int oxtest_prof_states[MAX_RANKS][NSTATES];
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
/* Proxy operations: the steps they declared, of those sending, and the
 * sends' and receives' count, per rank. */
int oxtest_prof_proxy_declared_steps[MAX_RANKS];
int oxtest_prof_proxy_send_steps[MAX_RANKS];
int oxtest_prof_proxy_sends[MAX_RANKS];
int oxtest_prof_proxy_recvs[MAX_RANKS];
/* The last proxy operation's channel and peer. */
int oxtest_prof_proxy_channel[MAX_RANKS];
int oxtest_prof_proxy_peer[MAX_RANKS];
/* The last API events of each rank (v5 and v6). */
int oxtest_prof_group_api_depth[MAX_RANKS];
char oxtest_prof_coll_api_func[MAX_RANKS][32];
char oxtest_prof_coll_api_dtype[MAX_RANKS][32];
size_t oxtest_prof_coll_api_count[MAX_RANKS];
int oxtest_prof_coll_api_root[MAX_RANKS];
char oxtest_prof_p2p_api_func[MAX_RANKS][32];
char oxtest_prof_p2p_api_dtype[MAX_RANKS][32];
size_t oxtest_prof_p2p_api_count[MAX_RANKS];

/* Collectives whose seqNumber is not the count of that rank's earlier
 * collectives of the same function. */
int oxtest_prof_seq_bad[MAX_RANKS];
static char seq_funcs[MAX_RANKS][16][32];
static uint64_t seq_next[MAX_RANKS][16];

static int marker;

#ifdef API_STREAM
#define BAD_API_STREAM(s) (!(s))
#else
#define BAD_API_STREAM(s) ((s) != NULL)
#endif

/* Counts a collective of function `func` numbered `seq` on rank r. */
static void check_seq(int r, const char* func, uint64_t seq) {
  for (int i = 0; i < 16; i++) {
    if (seq_funcs[r][i][0] == 0) strncpy(seq_funcs[r][i], func, 31);
    if (strncmp(seq_funcs[r][i], func, 31) == 0) {
      if (seq != seq_next[r][i]) __atomic_add_fetch(&oxtest_prof_seq_bad[r], 1, __ATOMIC_SEQ_CST);
      seq_next[r][i] = seq + 1;
      return;
    }
  }
  __atomic_add_fetch(&oxtest_prof_seq_bad[r], 1, __ATOMIC_SEQ_CST);
}

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

static void bad(int r) { __atomic_add_fetch(&oxtest_prof_bad[r], 1, __ATOMIC_SEQ_CST); }

/* Whether p is an event this plugin handed out, of `type`, of rank r, and
 * (when `live`) not stopped yet. */
static int is_event(void* p, uint64_t type, int r, int live) {
  event_t* e = (event_t*)p;
  return e && e->magic == 0x6f78 && e->type == type && e->rank == r && (!live || !e->stopped);
}

static ncclResult_t start_event(void* ctx, void** handle, descr_t* d) {
  *handle = NULL;
  int r = d->rank;
  if (ctx != &marker || r < 0 || r >= MAX_RANKS) return 4;
  uint64_t type = d->type;
  if (type == 0 || (type & (type - 1)) || !(type & KNOWN)) {
    bad(r);
    return 0;
  }
  int k = __builtin_ctzll(type);
  if (!(type & MASK)) __atomic_add_fetch(&oxtest_prof_unasked[r][k], 1, __ATOMIC_SEQ_CST);
  event_t* op = NULL;
  if (type == GROUP) {
    if (d->parentObj) bad(r);
  } else if (type == PROXY_OP) {
    /* Under its collective or point-to-point, still running. */
    if (!is_event(d->parentObj, COLL, r, 1) && !is_event(d->parentObj, P2P, r, 1)) bad(r);
    if (d->proxyOp.pid != getpid() || d->proxyOp.nSteps < 1 || d->proxyOp.chunkSize < 1 || d->proxyOp.peer == r ||
        d->proxyOp.peer < 0 || (d->proxyOp.isSend != 0 && d->proxyOp.isSend != 1))
      bad(r);
    __atomic_add_fetch(&oxtest_prof_proxy_declared_steps[r], d->proxyOp.nSteps, __ATOMIC_SEQ_CST);
    if (d->proxyOp.isSend) __atomic_add_fetch(&oxtest_prof_proxy_send_steps[r], d->proxyOp.nSteps, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(d->proxyOp.isSend ? &oxtest_prof_proxy_sends[r] : &oxtest_prof_proxy_recvs[r], 1,
                       __ATOMIC_SEQ_CST);
    oxtest_prof_proxy_channel[r] = d->proxyOp.channelId;
    oxtest_prof_proxy_peer[r] = d->proxyOp.peer;
  } else if (type == PROXY_STEP) {
    /* Under its live proxy operation, numbered in order. */
    if (!is_event(d->parentObj, PROXY_OP, r, 1)) {
      bad(r);
    } else {
      op = (event_t*)d->parentObj;
      if (d->proxyStep.step != op->steps_seen || d->proxyStep.step >= op->n_steps) bad(r);
      op->steps_seen++;
    }
  }
#if PROFILER_VERSION >= 5
  if (type == GROUP_API) {
    if (d->parentObj || d->groupApi.graphCaptured || d->groupApi.groupDepth < 1) bad(r);
    oxtest_prof_group_api_depth[r] = d->groupApi.groupDepth;
  } else if (type == COLL_API) {
    if (!is_event(d->parentObj, GROUP_API, r, 1) || !d->collApi.func || !d->collApi.datatype || BAD_API_STREAM(d->collApi.stream) ||
        d->collApi.graphCaptured)
      bad(r);
    copy(oxtest_prof_coll_api_func[r], d->collApi.func);
    copy(oxtest_prof_coll_api_dtype[r], d->collApi.datatype);
    oxtest_prof_coll_api_count[r] = d->collApi.count;
    oxtest_prof_coll_api_root[r] = d->collApi.root;
  } else if (type == P2P_API) {
    if (!is_event(d->parentObj, GROUP_API, r, 1) || !d->p2pApi.func || !d->p2pApi.datatype || BAD_API_STREAM(d->p2pApi.stream) ||
        d->p2pApi.graphCaptured)
      bad(r);
    copy(oxtest_prof_p2p_api_func[r], d->p2pApi.func);
    copy(oxtest_prof_p2p_api_dtype[r], d->p2pApi.datatype);
    oxtest_prof_p2p_api_count[r] = d->p2pApi.count;
  } else if (type == KERNEL_LAUNCH) {
    if (!is_event(d->parentObj, GROUP_API, r, 1) || BAD_API_STREAM(d->kernelLaunch.stream)) bad(r);
  } else if (type == COLL) {
    if (!is_event(d->parentObj, COLL_API, r, 0) || !is_event(d->coll.parentGroup, GROUP, r, 1)) bad(r);
  } else if (type == P2P) {
    if (!is_event(d->parentObj, P2P_API, r, 0) || !is_event(d->p2p.parentGroup, GROUP, r, 1)) bad(r);
  }
#else
  if ((type == COLL || type == P2P) && !is_event(d->parentObj, GROUP, r, 1)) bad(r);
#endif
  if (type == COLL) {
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
    if (func) check_seq(r, func, d->coll.seqNumber);
    oxtest_prof_coll_count[r] = d->coll.count;
    oxtest_prof_coll_root[r] = d->coll.root;
    oxtest_prof_coll_nch[r] = COLL_NCH(d);
    copy(oxtest_prof_coll_func[r], func);
    copy(oxtest_prof_coll_dtype[r], dtype);
    copy(oxtest_prof_coll_algo[r], algo);
    copy(oxtest_prof_coll_proto[r], proto);
  } else if (type == P2P) {
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
  event_t* e = calloc(1, sizeof(event_t));
  e->type = type;
  e->rank = r;
  e->magic = 0x6f78;
  if (type == PROXY_OP) {
    e->n_steps = d->proxyOp.nSteps;
    e->is_send = d->proxyOp.isSend;
  }
  if (op) {
    e->op = op;
    e->is_send = op->is_send;
  }
  __atomic_add_fetch(&oxtest_prof_started[r][k], 1, __ATOMIC_SEQ_CST);
  *handle = e;
  return 0;
}

__attribute__((unused)) static ncclResult_t stop_event(void* handle) {
  event_t* e = (event_t*)handle;
  if (!e || e->magic != 0x6f78) return 4;
  if (e->stopped || (e->type == GROUP_API && e->last_state != GROUP_END_API_START)) bad(e->rank);
  /* An operation stops after all its steps (when steps are started); a
   * step after its last state, in NCCL's order. */
  if (e->type == PROXY_OP && (MASK & PROXY_STEP) && e->steps_seen != e->n_steps) bad(e->rank);
  if (e->type == PROXY_STEP && e->last_state != (e->is_send ? SEND_WAIT : RECV_WAIT)) bad(e->rank);
  e->stopped = 1;
  __atomic_add_fetch(&oxtest_prof_stopped[e->rank][__builtin_ctzll(e->type)], 1, __ATOMIC_SEQ_CST);
  return 0;
}

static ncclResult_t record_state(void* handle, int state, void* args) {
  event_t* e = (event_t*)handle;
  if (!e || e->magic != 0x6f78) return 4;
  int r = e->rank;
  if (e->stopped || state < 0 || state >= NSTATES) {
    bad(r);
    return 0;
  }
  if (e->type == GROUP_API) {
    int want = state == GROUP_START_API_STOP ? 0 : state == GROUP_END_API_START ? GROUP_START_API_STOP : -1;
    if (e->last_state != want || args) bad(r);
  } else if (e->type == PROXY_OP) {
    /* v1 to v3 have no in-progress state. */
    if (PROFILER_VERSION < 4 || state != PROXY_OP_IN_PROGRESS || e->last_state != 0 || !args) bad(r);
  } else if (e->type == PROXY_STEP) {
    /* Sends: peer wait (v4 on), then send wait; receives: receive wait.
     * From v4 the arguments carry the step's bytes. */
    int first = PROFILER_VERSION >= 4 ? SEND_PEER_WAIT : SEND_WAIT;
    int want = !e->is_send                     ? (state == RECV_WAIT ? 0 : -1)
               : state == first                ? 0
               : state == SEND_WAIT            ? SEND_PEER_WAIT
                                               : -1;
    if (e->last_state != want || !args) bad(r);
#if PROFILER_VERSION >= 4
    if (args && ((state_args_v4_t*)args)->proxyStep.transSize == 0) bad(r);
#endif
  } else {
    bad(r);
  }
  e->last_state = state;
  __atomic_add_fetch(&oxtest_prof_states[r][state], 1, __ATOMIC_SEQ_CST);
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
