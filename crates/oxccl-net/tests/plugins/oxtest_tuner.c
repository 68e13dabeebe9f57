/* A tuner plugin for NCCL's ncclTuner ABI, written the way a third party
 * would (its own copies of the C layouts), that tests compile with cc into
 * each variant they need:
 *
 *   -DTUNER_VERSION=2..6   which ncclTunerPlugin_vN table is exported
 *   -DFORCE_ALGO=a         NCCL_ALGO_* id to force (the entry is set to 0
 *   -DFORCE_PROTO=p        unless the core marked it ignored; -1: leave the
 *                          table as given)
 *   -DFORCE_NCH=n          nChannels returned (0: unset)
 *   -DFAIL_INIT            init fails (ncclInternalError)
 *   -DFAIL_COLL_INFO       getCollInfo fails (ncclInternalError)
 *   -DNO_COLL_INFO         the table has no getCollInfo (NULL)
 *
 * getCollInfo checks the table's shape (7 algorithms x 3 protocols, every
 * entry -1 or a cost of 0 or more) and fails when it is wrong. The exported
 * counters oxtest_tuner_inits / _finalizes / _calls count the calls.
 */
#include <stddef.h>
#include <stdint.h>

#ifndef TUNER_VERSION
#define TUNER_VERSION 6
#endif
#ifndef FORCE_ALGO
#define FORCE_ALGO -1
#endif
#ifndef FORCE_PROTO
#define FORCE_PROTO -1
#endif
#ifndef FORCE_NCH
#define FORCE_NCH 0
#endif

typedef int ncclResult_t;
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

#define LOG_INFO 3
#define SUBSYS_TUNING 0x40

int oxtest_tuner_inits = 0;
int oxtest_tuner_finalizes = 0;
int oxtest_tuner_calls = 0;
static logger_t logger = 0;
static int context_marker = 0;

static ncclResult_t common_init(logger_t log, size_t nRanks, size_t nNodes, void** ctx) {
  logger = log;
  __atomic_add_fetch(&oxtest_tuner_inits, 1, __ATOMIC_SEQ_CST);
  if (logger)
    logger(LOG_INFO, SUBSYS_TUNING, __FILE__, __LINE__, "oxtest tuner v%d: init nRanks %zu nNodes %zu", TUNER_VERSION,
           nRanks, nNodes);
#ifdef FAIL_INIT
  return 3;
#else
  *ctx = &context_marker;
  return 0;
#endif
}

static ncclResult_t finalize(void* ctx) {
  __atomic_add_fetch(&oxtest_tuner_finalizes, 1, __ATOMIC_SEQ_CST);
  return ctx == &context_marker ? 0 : 4;
}

__attribute__((unused)) static ncclResult_t table_coll_info(void* ctx, int collType, size_t nBytes, int numPipeOps, float** collCostTable,
                                    int numAlgo, int numProto, int regBuff, int* nChannels) {
  (void)regBuff;
  __atomic_add_fetch(&oxtest_tuner_calls, 1, __ATOMIC_SEQ_CST);
#ifdef FAIL_COLL_INFO
  return 3;
#endif
  if (ctx != &context_marker || numAlgo != 7 || numProto != 3 || numPipeOps < 1) return 4;
  float(*table)[3] = (float(*)[3])collCostTable;
  for (int a = 0; a < numAlgo; a++)
    for (int p = 0; p < numProto; p++)
      if (table[a][p] != -1.0f && !(table[a][p] >= 0.0f)) return 4;
  if (logger)
    logger(LOG_INFO, SUBSYS_TUNING, __FILE__, __LINE__,
           "oxtest tuner: func %d, %zu bytes, tree %.1f/%.1f/%.1f ring %.1f/%.1f/%.1f nvls %.1f", collType, nBytes,
           table[0][0], table[0][1], table[0][2], table[1][0], table[1][1], table[1][2], table[4][2]);
  if (FORCE_ALGO >= 0 && FORCE_PROTO >= 0 && table[FORCE_ALGO][FORCE_PROTO] != -1.0f) table[FORCE_ALGO][FORCE_PROTO] = 0.0f;
  *nChannels = FORCE_NCH;
  return 0;
}

#if TUNER_VERSION == 2
static ncclResult_t init_v2(size_t nRanks, size_t nNodes, logger_t log, void** ctx) {
  return common_init(log, nRanks, nNodes, ctx);
}
static ncclResult_t coll_info_v2(void* ctx, int collType, size_t nBytes, int collNetSupport, int nvlsSupport,
                                 int numPipeOps, int* algorithm, int* protocol, int* nChannels) {
  (void)collType; (void)nBytes; (void)collNetSupport; (void)nvlsSupport; (void)numPipeOps;
  __atomic_add_fetch(&oxtest_tuner_calls, 1, __ATOMIC_SEQ_CST);
  if (ctx != &context_marker) return 4;
  *algorithm = FORCE_ALGO;
  *protocol = FORCE_PROTO;
  *nChannels = FORCE_NCH;
  return 0;
}
struct {
  const char* name;
  void* init;
  void* getCollInfo;
  void* destroy;
} ncclTunerPlugin_v2 = {"oxtest-tuner", (void*)init_v2, (void*)coll_info_v2, (void*)finalize};

#elif TUNER_VERSION == 3 || TUNER_VERSION == 4
static ncclResult_t init_v3(size_t nRanks, size_t nNodes, logger_t log, void** ctx) {
  return common_init(log, nRanks, nNodes, ctx);
}
#if TUNER_VERSION == 3
static ncclResult_t coll_info_v3(void* ctx, int collType, size_t nBytes, int numPipeOps, float** collCostTable,
                                 int numAlgo, int numProto, int* nChannels) {
  return table_coll_info(ctx, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, 0, nChannels);
}
#define COLL_INFO coll_info_v3
#define SYMBOL ncclTunerPlugin_v3
#else
#define COLL_INFO table_coll_info
#define SYMBOL ncclTunerPlugin_v4
#endif
struct {
  const char* name;
  void* init;
  void* getCollInfo;
  void* destroy;
} SYMBOL = {"oxtest-tuner", (void*)init_v3, (void*)COLL_INFO, (void*)finalize};

#else /* v5, v6 */
typedef struct {
  int nNvlDomains, minRanksPerNvlDomain, maxRanksPerNvlDomain;
} nvl_domains_t;
static ncclResult_t init_v5(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, logger_t log,
                            nvl_domains_t* domains, void* constants) {
  (void)commId;
  if (!domains || !constants || domains->nNvlDomains != (int)nNodes || domains->maxRanksPerNvlDomain < 1) return 4;
  return common_init(log, nRanks, nNodes, ctx);
}
#ifdef NO_COLL_INFO
#define COLL_INFO 0
#else
#define COLL_INFO table_coll_info
#endif
#if TUNER_VERSION == 5
struct {
  const char* name;
  void* init;
  void* getCollInfo;
  void* finalize;
} ncclTunerPlugin_v5 = {"oxtest-tuner", (void*)init_v5, (void*)COLL_INFO, (void*)finalize};
#else
struct {
  const char* name;
  void* init;
  void* getCollInfo;
  void* finalize;
  void* getChunkSize;
} ncclTunerPlugin_v6 = {"oxtest-tuner", (void*)init_v5, (void*)COLL_INFO, (void*)finalize, 0};
#endif
#endif
