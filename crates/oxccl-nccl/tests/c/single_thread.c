/* Drives libnccl.so from one thread: everything that needs no GPU. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond, ...)                                        \
  do {                                                          \
    if (!(cond)) {                                              \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);      \
      fprintf(stderr, __VA_ARGS__);                             \
      fprintf(stderr, "\n");                                    \
      failures++;                                               \
    }                                                           \
  } while (0)

#define OK(call)                                                                  \
  do {                                                                            \
    ncclResult_t r_ = (call);                                                     \
    if (r_ != ncclSuccess) {                                                      \
      fprintf(stderr, "FAIL %s:%d: %s -> %d (%s) last: %s\n", __FILE__, __LINE__, \
              #call, (int)r_, ncclGetErrorString(r_), ncclGetLastError(NULL));    \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

/* `call` must return `want`, and the last error must contain `text`. */
#define EXPECT_ERR(call, want, comm, text)                                           \
  do {                                                                               \
    ncclResult_t r_ = (call);                                                        \
    const char* e_ = ncclGetLastError(comm);                                         \
    CHECK(r_ == (want), "%s -> %d, want %d", #call, (int)r_, (int)(want));           \
    CHECK(e_ && strstr(e_, text), "%s: last error '%s' lacks '%s'", #call, e_ ? e_ : "(null)", text); \
  } while (0)

#define N 3

static void test_version_and_strings(void) {
  int v = 0;
  OK(ncclGetVersion(&v));
  CHECK(v == NCCL_VERSION_CODE, "ncclGetVersion %d != NCCL_VERSION_CODE %d", v, NCCL_VERSION_CODE);
  OK(pncclGetVersion(&v));
  CHECK(v == 22705, "version %d", v);
  CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "success string");
  CHECK(strstr(ncclGetErrorString(ncclInvalidArgument), "invalid argument") != NULL, "invalid argument string");
  CHECK(strcmp(ncclGetErrorString(ncclInProgress), "NCCL operation in progress") == 0, "in progress string");
  CHECK(strcmp(ncclGetErrorString(ncclTimeout), "timeout") == 0, "timeout string");
  CHECK(strcmp(ncclGetErrorString((ncclResult_t)9), "unknown result code") == 0, "9 string");
  CHECK(strcmp(ncclGetErrorString((ncclResult_t)-3), "unknown result code") == 0, "-3 string");
  EXPECT_ERR(ncclGetVersion(NULL), ncclInvalidArgument, NULL, "ncclGetVersion: version is NULL");
}

static void test_config(void) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  int i, nonzero = 0;
  OK(ncclGetUniqueId(&id));
  for (i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) nonzero |= id.internal[i];
  CHECK(nonzero, "unique id is all zeros");

  bad.magic = 0x1234;
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument, NULL,
             "NCCL_CONFIG_INITIALIZER");
  CHECK(comm == NULL, "comm set after a failed init");
  bad = cfg;
  bad.blocking = 5;
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument, NULL, "blocking");
  bad = cfg;
  bad.minCTAs = 8;
  bad.maxCTAs = 2;
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument, NULL, "minCTAs");
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 0, id, 0, &cfg), ncclInvalidArgument, NULL, "nranks");
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 2, id, 2, &cfg), ncclInvalidArgument, NULL, "rank 2");
  EXPECT_ERR(ncclCommInitRankConfig(NULL, 1, id, 0, &cfg), ncclInvalidArgument, NULL, "NULL");

  /* A config from NCCL 2.17 headers: 40 bytes, blocking garbage beyond... */
  {
    struct {
      ncclConfig_t c;
      int tail[8];
    } old;
    memset(&old, 0x7f, sizeof old); /* bytes past the old struct are garbage */
    old.c.size = 40;                /* up to and including netName */
    old.c.magic = NCCL_API_MAGIC;
    old.c.version = NCCL_VERSION(2, 17, 1);
    old.c.blocking = 1;
    old.c.cgaClusterSize = NCCL_CONFIG_UNDEF_INT;
    old.c.minCTAs = NCCL_CONFIG_UNDEF_INT;
    old.c.maxCTAs = NCCL_CONFIG_UNDEF_INT;
    old.c.netName = NULL;
    OK(ncclCommInitRankConfig(&comm, 1, id, 0, &old.c));
    CHECK(comm != NULL, "old-config init gave no comm");
    OK(ncclCommDestroy(comm));
  }
  /* A config from NCCL 2.13 headers: version too old for `blocking`, which is ignored. */
  {
    ncclUniqueId id2;
    ncclConfig_t c = cfg;
    OK(ncclGetUniqueId(&id2));
    c.size = 16;
    c.version = 21300;
    c.blocking = 99; /* not part of a 2.13 config: must be ignored */
    OK(ncclCommInitRankConfig(&comm, 1, id2, 0, &c));
    OK(ncclCommDestroy(comm));
  }
  /* Non-blocking init: ncclInProgress, then ncclSuccess from ncclCommGetAsyncError. */
  {
    ncclUniqueId id3;
    ncclConfig_t c = cfg;
    ncclResult_t r, async = ncclInProgress;
    int polls = 0;
    OK(ncclGetUniqueId(&id3));
    c.blocking = 0;
    c.commName = "nonblocking";
    r = ncclCommInitRankConfig(&comm, 1, id3, 0, &c);
    CHECK(r == ncclInProgress || r == ncclSuccess, "non-blocking init -> %d", (int)r);
    CHECK(comm != NULL, "non-blocking init gave no handle");
    while (async == ncclInProgress && polls++ < 60000) {
      struct timespec ms = {0, 1000000};
      OK(ncclCommGetAsyncError(comm, &async));
      if (async == ncclInProgress) nanosleep(&ms, NULL);
    }
    CHECK(async == ncclSuccess, "async error %d", (int)async);
    OK(ncclCommDestroy(comm));
  }
}

static ncclComm_t comms[N];

static void test_arg_errors(void) {
  float x[4] = {0};
  ncclComm_t c = comms[0];
  EXPECT_ERR(ncclAllReduce(x, x, 4, (ncclDataType_t)42, ncclSum, c, 0), ncclInvalidArgument, c,
             "ncclAllReduce: invalid datatype 42 (valid: 0..11)");
  EXPECT_ERR(ncclAllReduce(x, x, 4, ncclFloat, (ncclRedOp_t)99, c, 0), ncclInvalidArgument, c,
             "invalid reduction op 99");
  EXPECT_ERR(ncclAllReduce(x, x, 4, ncclFloat, (ncclRedOp_t)-1, c, 0), ncclInvalidArgument, c,
             "invalid reduction op -1");
  EXPECT_ERR(ncclAllReduce(x, x, 4, ncclFloat, ncclSum, NULL, 0), ncclInvalidArgument, NULL,
             "comm is NULL");
  EXPECT_ERR(ncclAllReduce(x, x, 4, ncclFloat, ncclSum, (ncclComm_t)(uintptr_t)0xdeadbeef, 0),
             ncclInvalidArgument, NULL, "not a live communicator");
  EXPECT_ERR(ncclAllReduce(NULL, x, 4, ncclFloat, ncclSum, c, 0), ncclInvalidArgument, c,
             "sendbuff is NULL");
  EXPECT_ERR(ncclBroadcast(x, x, 4, ncclFloat, 3, c, 0), ncclInvalidArgument, c, "invalid root 3");
  EXPECT_ERR(ncclSend(x, 4, ncclFloat, -1, c, 0), ncclInvalidArgument, c, "invalid peer -1");
  EXPECT_ERR(ncclCommCount(c, NULL), ncclInvalidArgument, c, "count is NULL");
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, NULL, "ncclGroupStart");
  EXPECT_ERR(ncclCommSuspend(c, 1), ncclInvalidUsage, c,
             "ncclCommSuspend is not supported by oxccl yet");
  EXPECT_ERR(ncclDevCommCreate(c, NULL, NULL), ncclInvalidUsage, NULL,
             "ncclDevCommCreate is not supported by oxccl yet");
  {
    /* Teams: this process's N ranks are one host's consecutive ranks. */
    ncclTeam_t w = ncclTeamWorld(c), l = ncclTeamLsa(c), r = ncclTeamRail(c), bad;
    CHECK(w.nRanks == N && w.rank == 0 && w.stride == 1, "world team");
    CHECK(l.nRanks == N && l.rank == 0 && l.stride == 1, "lsa team");
    CHECK(r.nRanks == 1 && r.rank == 0 && r.stride == N, "rail team");
    CHECK(ncclTeamRankToWorld(c, l, N - 1) == N - 1, "lsa rank to world");
    CHECK(ncclTeamRankToLsa(c, w, 1) == 1, "world rank to lsa");
    CHECK(ncclTeamRankToWorld(c, w, N) == -1, "rank past the team");
    CHECK(strstr(ncclGetLastError(NULL), "not in the team") != NULL, "team rank warn");
    bad = ncclTeamWorld((ncclComm_t)(uintptr_t)0xdeadbeef);
    CHECK(bad.nRanks == 0 && bad.rank == 0 && bad.stride == 0, "team of a bad handle not zeroed");
    CHECK(strstr(ncclGetLastError(NULL), "not a live communicator") != NULL, "team warn");
  }
  /* Zero-count operations with NULL buffers are fine (every rank must call). */
}

static void test_queries(void) {
  int i, v;
  for (i = 0; i < N; i++) {
    OK(ncclCommCount(comms[i], &v));
    CHECK(v == N, "count %d", v);
    OK(ncclCommUserRank(comms[i], &v));
    CHECK(v == i, "rank %d != %d", v, i);
    OK(ncclCommCuDevice(comms[i], &v));
    CHECK(v == i, "device %d != %d", v, i);
    OK(ncclCommGetAsyncError(comms[i], (ncclResult_t*)&v));
    CHECK(v == ncclSuccess, "async %d", v);
  }
}

static void test_collectives(void) {
  enum { C = 1000 };
  float* send[N];
  float* recv[N];
  int i, j, r, bad;
  for (i = 0; i < N; i++) {
    OK(ncclMemAlloc((void**)&send[i], N * C * sizeof(float)));
    OK(ncclMemAlloc((void**)&recv[i], N * C * sizeof(float)));
    CHECK(((uintptr_t)send[i] & 4095) == 0, "ncclMemAlloc alignment");
  }
  /* all_reduce sum */
  for (i = 0; i < N; i++)
    for (j = 0; j < C; j++) send[i][j] = (float)(i + 1) * (float)j;
  OK(ncclGroupStart());
  for (i = 0; i < N; i++) OK(ncclAllReduce(send[i], recv[i], C, ncclFloat, ncclSum, comms[i], 0));
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < N; i++)
    for (j = 0; j < C; j++) bad += recv[i][j] != 6.0f * (float)j;
  CHECK(bad == 0, "all_reduce: %d wrong", bad);

  /* in-place all_reduce max, nested groups */
  for (i = 0; i < N; i++)
    for (j = 0; j < C; j++) recv[i][j] = (float)((i + j) % N);
  OK(ncclGroupStart());
  OK(ncclGroupStart());
  for (i = 0; i < N; i++) OK(ncclAllReduce(recv[i], recv[i], C, ncclFloat, ncclMax, comms[i], 0));
  OK(ncclGroupEnd());
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < N; i++)
    for (j = 0; j < C; j++) bad += recv[i][j] != (float)(N - 1);
  CHECK(bad == 0, "in-place all_reduce max: %d wrong", bad);

  /* broadcast from root 1, and ncclBcast (in place) from root 2 */
  for (i = 0; i < N; i++)
    for (j = 0; j < C; j++) {
      send[i][j] = (float)(100 * i + j);
      recv[i][j] = -1.0f;
    }
  OK(ncclGroupStart());
  for (i = 0; i < N; i++) OK(ncclBroadcast(send[i], recv[i], C, ncclFloat, 1, comms[i], 0));
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < N; i++)
    for (j = 0; j < C; j++) bad += recv[i][j] != (float)(100 + j);
  CHECK(bad == 0, "broadcast: %d wrong", bad);
  OK(ncclGroupStart());
  for (i = 0; i < N; i++) OK(ncclBcast(send[i], C, ncclFloat, 2, comms[i], 0));
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < N; i++)
    for (j = 0; j < C; j++) bad += send[i][j] != (float)(200 + j);
  CHECK(bad == 0, "bcast: %d wrong", bad);

  /* all_gather out of place and in place */
  for (i = 0; i < N; i++)
    for (j = 0; j < C; j++) send[i][j] = (float)(i * C + j);
  OK(ncclGroupStart());
  for (i = 0; i < N; i++) OK(ncclAllGather(send[i], recv[i], C, ncclFloat, comms[i], 0));
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < N; i++)
    for (j = 0; j < N * C; j++) bad += recv[i][j] != (float)j;
  CHECK(bad == 0, "all_gather: %d wrong", bad);
  for (i = 0; i < N; i++)
    for (j = 0; j < N * C; j++) recv[i][j] = (j / C == i) ? (float)j : -1.0f;
  OK(ncclGroupStart());
  for (i = 0; i < N; i++) OK(ncclAllGather(recv[i] + i * C, recv[i], C, ncclFloat, comms[i], 0));
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < N; i++)
    for (j = 0; j < N * C; j++) bad += recv[i][j] != (float)j;
  CHECK(bad == 0, "in-place all_gather: %d wrong", bad);

  /* reduce_scatter sum, and in place */
  for (i = 0; i < N; i++)
    for (j = 0; j < N * C; j++) send[i][j] = (float)(j + i);
  OK(ncclGroupStart());
  for (i = 0; i < N; i++) OK(ncclReduceScatter(send[i], recv[i], C, ncclFloat, ncclSum, comms[i], 0));
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < N; i++)
    for (j = 0; j < C; j++) bad += recv[i][j] != (float)(3 * (i * C + j) + 3);
  CHECK(bad == 0, "reduce_scatter: %d wrong", bad);
  OK(ncclGroupStart());
  for (i = 0; i < N; i++)
    OK(ncclReduceScatter(send[i], send[i] + i * C, C, ncclFloat, ncclSum, comms[i], 0));
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < N; i++)
    for (j = 0; j < C; j++) bad += send[i][i * C + j] != (float)(3 * (i * C + j) + 3);
  CHECK(bad == 0, "in-place reduce_scatter: %d wrong", bad);

  /* reduce to root 0, int32 prod */
  {
    int32_t* is[N];
    int32_t* ir[N];
    for (i = 0; i < N; i++) {
      is[i] = (int32_t*)send[i];
      ir[i] = (int32_t*)recv[i];
      for (j = 0; j < C; j++) {
        is[i][j] = (j % 5) + i;
        ir[i][j] = -7;
      }
    }
    OK(ncclGroupStart());
    for (i = 0; i < N; i++) OK(ncclReduce(is[i], ir[i], C, ncclInt32, ncclProd, 0, comms[i], 0));
    OK(ncclGroupEnd());
    for (bad = 0, j = 0; j < C; j++) bad += ir[0][j] != (j % 5) * (j % 5 + 1) * (j % 5 + 2);
    for (i = 1; i < N; i++)
      for (j = 0; j < C; j++) bad += ir[i][j] != -7;
    CHECK(bad == 0, "reduce prod: %d wrong", bad);
  }

  /* send/recv ring: rank i sends to i+1 */
  for (i = 0; i < N; i++)
    for (j = 0; j < C; j++) {
      send[i][j] = (float)(i * 10000 + j);
      recv[i][j] = -1.0f;
    }
  OK(ncclGroupStart());
  for (i = 0; i < N; i++) {
    OK(ncclRecv(recv[i], C, ncclFloat, (i + N - 1) % N, comms[i], 0));
    OK(ncclSend(send[i], C, ncclFloat, (i + 1) % N, comms[i], 0));
  }
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < N; i++)
    for (j = 0; j < C; j++) bad += recv[i][j] != (float)(((i + N - 1) % N) * 10000 + j);
  CHECK(bad == 0, "send/recv: %d wrong", bad);

  /* all_to_all, gather and scatter */
  for (i = 0; i < N; i++)
    for (j = 0; j < N * C; j++) send[i][j] = (float)(i * N * C + j);
  OK(ncclGroupStart());
  for (i = 0; i < N; i++) OK(ncclAlltoAll(send[i], recv[i], C, ncclFloat, comms[i], 0));
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < N; i++)
    for (r = 0; r < N; r++)
      for (j = 0; j < C; j++) bad += recv[i][r * C + j] != (float)(r * N * C + i * C + j);
  CHECK(bad == 0, "all_to_all: %d wrong", bad);
  OK(ncclGroupStart());
  for (i = 0; i < N; i++) OK(ncclGather(send[i], recv[i], C, ncclFloat, 2, comms[i], 0));
  OK(ncclGroupEnd());
  for (bad = 0, r = 0; r < N; r++)
    for (j = 0; j < C; j++) bad += recv[2][r * C + j] != (float)(r * N * C + j);
  CHECK(bad == 0, "gather: %d wrong", bad);
  OK(ncclGroupStart());
  for (i = 0; i < N; i++) OK(ncclScatter(send[i], recv[i], C, ncclFloat, 1, comms[i], 0));
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < N; i++)
    for (j = 0; j < C; j++) bad += recv[i][j] != (float)(1 * N * C + i * C + j);
  CHECK(bad == 0, "scatter: %d wrong", bad);

  /* pre-multiplied sums: host-immediate and "device" (read at each call) */
  {
    double scal = 0.5, dev = 2.0;
    ncclRedOp_t imm[N], dop[N];
    double* ds[N];
    double* dr[N];
    for (i = 0; i < N; i++) {
      OK(ncclRedOpCreatePreMulSum(&imm[i], &scal, ncclFloat64, ncclScalarHostImmediate, comms[i]));
      OK(ncclRedOpCreatePreMulSum(&dop[i], &dev, ncclFloat64, ncclScalarDevice, comms[i]));
      CHECK(imm[i] >= ncclNumOps && dop[i] >= ncclNumOps && imm[i] != dop[i], "op ids %d %d",
            (int)imm[i], (int)dop[i]);
      ds[i] = (double*)send[i];
      dr[i] = (double*)recv[i];
      for (j = 0; j < C; j++) ds[i][j] = (double)(i + j);
    }
    scal = 100.0; /* immediate: must not matter any more */
    OK(ncclGroupStart());
    for (i = 0; i < N; i++) OK(ncclAllReduce(ds[i], dr[i], C, ncclFloat64, imm[i], comms[i], 0));
    OK(ncclGroupEnd());
    for (bad = 0, i = 0; i < N; i++)
      for (j = 0; j < C; j++) bad += dr[i][j] != 0.5 * (double)(3 + 3 * j);
    CHECK(bad == 0, "premulsum immediate: %d wrong", bad);
    dev = 3.0; /* device residence: read when the operation runs */
    OK(ncclGroupStart());
    for (i = 0; i < N; i++) OK(ncclAllReduce(ds[i], dr[i], C, ncclFloat64, dop[i], comms[i], 0));
    OK(ncclGroupEnd());
    for (bad = 0, i = 0; i < N; i++)
      for (j = 0; j < C; j++) bad += dr[i][j] != 3.0 * (double)(3 + 3 * j);
    CHECK(bad == 0, "premulsum device: %d wrong", bad);
    EXPECT_ERR(ncclAllReduce(ds[0], dr[0], C, ncclFloat32, imm[0], comms[0], 0), ncclInvalidArgument,
               comms[0], "was created for datatype");
    for (i = 0; i < N; i++) {
      OK(ncclRedOpDestroy(imm[i], comms[i]));
      OK(ncclRedOpDestroy(dop[i], comms[i]));
    }
    EXPECT_ERR(ncclRedOpDestroy(imm[0], comms[0]), ncclInvalidArgument, comms[0], "not a reduction op");
    EXPECT_ERR(ncclRedOpDestroy(ncclSum, comms[0]), ncclInvalidArgument, comms[0], "built-in");
  }

  /* registration: dummy handles */
  {
    void* h = NULL;
    OK(ncclCommRegister(comms[0], send[0], C, &h));
    CHECK(h != NULL, "register handle");
    OK(ncclCommDeregister(comms[0], h));
    EXPECT_ERR(ncclCommDeregister(comms[0], h), ncclInvalidArgument, comms[0], "not a registration");
  }
  for (i = 0; i < N; i++) {
    OK(ncclMemFree(send[i]));
    OK(ncclMemFree(recv[i]));
  }
  EXPECT_ERR(ncclMemFree(send[0]), ncclInvalidArgument, NULL, "not allocated by ncclMemAlloc");
}

/* nccl-tests' pattern: one thread creates several ranks inside a group. */
static void test_group_init_and_split(void) {
  ncclUniqueId id;
  ncclComm_t g[2], sub[N];
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  int i, v, x[2][8], j, bad;
  OK(ncclGetUniqueId(&id));
  OK(ncclGroupStart());
  for (i = 0; i < 2; i++) OK(ncclCommInitRankConfig(&g[i], 2, id, i, &cfg));
  OK(ncclGroupEnd());
  for (i = 0; i < 2; i++) {
    OK(ncclCommUserRank(g[i], &v));
    CHECK(v == i, "group-init rank %d", v);
    for (j = 0; j < 8; j++) x[i][j] = i + 1;
  }
  OK(ncclGroupStart());
  for (i = 0; i < 2; i++) OK(ncclAllReduce(x[i], x[i], 8, ncclInt32, ncclSum, g[i], 0));
  OK(ncclGroupEnd());
  for (bad = 0, i = 0; i < 2; i++)
    for (j = 0; j < 8; j++) bad += x[i][j] != 3;
  CHECK(bad == 0, "group-init all_reduce: %d wrong", bad);
  for (i = 0; i < 2; i++) OK(ncclCommDestroy(g[i]));
  EXPECT_ERR(ncclCommDestroy(g[0]), ncclInvalidUsage, NULL, "already destroyed");
  EXPECT_ERR(ncclAllReduce(x[0], x[0], 8, ncclInt32, ncclSum, g[1], 0), ncclInvalidUsage, NULL,
             "already destroyed");

  /* split: ranks 0 and 2 get color 7, rank 1 NCCL_SPLIT_NOCOLOR */
  OK(ncclGroupStart());
  for (i = 0; i < N; i++)
    OK(ncclCommSplit(comms[i], i == 1 ? NCCL_SPLIT_NOCOLOR : 7, -i, &sub[i], NULL));
  OK(ncclGroupEnd());
  CHECK(sub[1] == NULL, "NOCOLOR rank got a communicator");
  OK(ncclCommCount(sub[0], &v));
  CHECK(v == 2, "split count %d", v);
  OK(ncclCommUserRank(sub[0], &v));
  CHECK(v == 1, "split rank of old rank 0 (key 0 > key -2): %d", v);
  OK(ncclCommUserRank(sub[2], &v));
  CHECK(v == 0, "split rank of old rank 2: %d", v);
  OK(ncclCommDestroy(sub[0]));
  OK(ncclCommAbort(sub[2]));
}

int main(void) {
  int i;
  test_version_and_strings();
  test_config();
  OK(ncclCommInitAll(comms, N, NULL));
  test_queries();
  test_arg_errors();
  test_collectives();
  test_group_init_and_split();
  for (i = 0; i < N; i++) OK(ncclCommDestroy(comms[i]));
  if (failures) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("single_thread: all checks passed\n");
  return 0;
}
