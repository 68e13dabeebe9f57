/* A profiler plugin for NCCL's ncclProfiler ABI (v6, or v5 with
 * -DPROFILER_VERSION=5; 4 exports the v4 symbol name only), written the
 * way a third party would, that tests compile with cc. It asks for the events in -DMASK=... (default: group,
 * collective and point-to-point), counts every start and stop per rank and
 * kind, checks each descriptor (strings set, a child's parent is a live group
 * of the same rank when groups are on, NULL otherwise) and keeps the last
 * collective's and point-to-point's fields per rank, all in exported arrays
 * that the test reads. -DFAIL_INIT makes init fail.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef PROFILER_VERSION
#define PROFILER_VERSION 6
#endif
#ifndef MASK
#define MASK ((1 << 0) | (1 << 1) | (1 << 2))
#endif
#define MAX_RANKS 16

typedef int ncclResult_t;
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

enum { GROUP = 1 << 0, COLL = 1 << 1, P2P = 1 << 2 };

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    char pad[88];
  };
} descr_t;

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
int oxtest_prof_mask_seen = 0;
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
char oxtest_prof_p2p_func[MAX_RANKS][32];

static int marker;

static void copy(char* dst, const char* src) {
  strncpy(dst, src ? src : "(null)", 31);
  dst[31] = 0;
}

static ncclResult_t init(void** ctx, uint64_t commId, int* mask, const char* commName, int nNodes, int nranks,
                         int rank, logger_t log) {
  (void)commId; (void)commName; (void)log;
  __atomic_add_fetch(&oxtest_prof_inits, 1, __ATOMIC_SEQ_CST);
#ifdef FAIL_INIT
  return 3;
#endif
  if (nNodes < 1 || nranks < 1 || rank < 0 || rank >= nranks) return 4;
  *mask = MASK;
  *ctx = &marker;
  return 0;
}

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
    if (!d->coll.func || !d->coll.datatype || !d->coll.algo || !d->coll.proto || d->coll.nChannels == 0)
      __atomic_add_fetch(&oxtest_prof_bad[r], 1, __ATOMIC_SEQ_CST);
    oxtest_prof_coll_seq[r] = d->coll.seqNumber;
    oxtest_prof_coll_count[r] = d->coll.count;
    oxtest_prof_coll_root[r] = d->coll.root;
    oxtest_prof_coll_nch[r] = d->coll.nChannels;
    copy(oxtest_prof_coll_func[r], d->coll.func);
    copy(oxtest_prof_coll_dtype[r], d->coll.datatype);
    copy(oxtest_prof_coll_algo[r], d->coll.algo);
    copy(oxtest_prof_coll_proto[r], d->coll.proto);
  } else if (k == 2) {
    if (!d->p2p.func || !d->p2p.datatype) __atomic_add_fetch(&oxtest_prof_bad[r], 1, __ATOMIC_SEQ_CST);
    oxtest_prof_p2p_peer[r] = d->p2p.peer;
    oxtest_prof_p2p_count[r] = d->p2p.count;
    copy(oxtest_prof_p2p_func[r], d->p2p.func);
  }
  event_t* e = malloc(sizeof(event_t));
  e->type = d->type;
  e->rank = r;
  e->magic = 0x6f78;
  __atomic_add_fetch(&oxtest_prof_started[r][k], 1, __ATOMIC_SEQ_CST);
  *handle = e;
  return 0;
}

static ncclResult_t stop_event(void* handle) {
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
}
#if PROFILER_VERSION == 5
ncclProfiler_v5
#elif PROFILER_VERSION == 4
ncclProfiler_v4 /* a v4 name over v5 entries: only the symbol matters here */
#else
ncclProfiler_v6
#endif
    = {"oxtest-profiler", (void*)init, (void*)start_event, (void*)stop_event, (void*)record_state, (void*)finalize};
