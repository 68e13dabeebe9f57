/* ncclCommShrink from C, one rank per thread, host buffers: ranks 1 and 3
 * of 5 are excluded and never call it (as if they had died). Rank 0 first
 * makes every bad call and checks the error and its text; the survivors
 * pass the same ranks in different orders and with different flags; rank
 * 4's child is non-blocking. The child must hold parent ranks 0, 2, 4 as
 * ranks 0, 1, 2, and run collectives. */
#define _POSIX_C_SOURCE 200112L /* pthread barriers under -std=c99 */
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NR 5
#define C 1031

static ncclUniqueId id;
static int errors[NR];
static pthread_barrier_t done;

#define OK(call)                                                                   \
  do {                                                                             \
    ncclResult_t r_ = (call);                                                      \
    if (r_ != ncclSuccess) {                                                       \
      fprintf(stderr, "rank %d: %s -> %s (%s)\n", rank, #call,                     \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                     \
      errors[rank]++;                                                              \
      goto out;                                                                    \
    }                                                                              \
  } while (0)

/* A call that must fail with `want`, leave *nc NULL and say `needle`. */
static void bad(int rank, ncclComm_t comm, ncclResult_t got, ncclResult_t want,
                ncclComm_t nc, const char* needle, const char* what) {
  const char* text = ncclGetLastError(comm);
  if (got != want || nc != NULL || strstr(text, needle) == NULL) {
    fprintf(stderr, "rank %d: %s -> %s, newcomm %p, text \"%s\" (wanted \"%s\")\n",
            rank, what, ncclGetErrorString(got), (void*)nc, text, needle);
    errors[rank]++;
  }
}

/* Each call on its own line: C leaves the order of a call's arguments
 * open, so `nc` is read after the call, not beside it. */
#define BAD(on, call, needle, what)                                                \
  do {                                                                             \
    nc = (ncclComm_t)&nc;                                                          \
    r = (call);                                                                    \
    bad(rank, on, r, ncclInvalidArgument, nc, needle, what);                       \
  } while (0)

static void bad_calls(int rank, ncclComm_t comm) {
  int one[1] = {1}, self[1] = {0}, far[2] = {1, 5}, neg[1] = {-1};
  ncclComm_t nc;
  ncclResult_t r;
  BAD(comm, ncclCommShrink(comm, NULL, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), "excludeRanksList",
      "NULL list");
  BAD(comm, ncclCommShrink(comm, one, 0, &nc, NULL, NCCL_SHRINK_DEFAULT), "excludeRanksCount 0",
      "count 0");
  BAD(comm, ncclCommShrink(comm, self, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), "is this rank",
      "own rank");
  BAD(comm, ncclCommShrink(comm, far, 2, &nc, NULL, NCCL_SHRINK_DEFAULT),
      "excludeRanksList[1] = 5", "rank out of range");
  BAD(comm, ncclCommShrink(comm, neg, 1, &nc, NULL, NCCL_SHRINK_DEFAULT),
      "excludeRanksList[0] = -1", "negative rank");
  BAD(comm, ncclCommShrink(comm, one, 1, &nc, NULL, 2), "shrinkFlags", "unknown flag");
  BAD(NULL, ncclCommShrink(NULL, one, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), "comm is NULL",
      "NULL comm");
  nc = NULL;
  r = ncclCommShrink(comm, one, 1, NULL, NULL, NCCL_SHRINK_DEFAULT);
  bad(rank, comm, r, ncclInvalidArgument, nc, "newcomm", "NULL newcomm");
}

static void* run(void* arg) {
  int rank = (int)(size_t)arg, i, n = 0, me = -1;
  int list_a[2] = {3, 1}, list_b[3] = {1, 3, 1};
  int* list = rank == 2 ? list_b : list_a;
  int len = rank == 2 ? 3 : 2;
  int flags = rank == 2 ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
  int want_rank = rank / 2;
  ncclComm_t comm = NULL, child = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclResult_t r, async;
  double* a = (double*)malloc(NR * C * sizeof(double));
  double* b = (double*)malloc(NR * C * sizeof(double));
  OK(ncclCommInitRank(&comm, NR, id, rank));
  for (i = 0; i < C; i++) a[i] = rank;
  OK(ncclAllReduce(a, b, C, ncclDouble, ncclSum, comm, NULL));
  if (rank == 1 || rank == 3) goto out; /* excluded: never calls */
  if (rank == 0) bad_calls(rank, comm);
  if (rank == 4) cfg.blocking = 0;
  r = ncclCommShrink(comm, list, len, &child, rank == 4 ? &cfg : NULL, flags);
  if (rank == 4 && r == ncclInProgress) {
    do {
      OK(ncclCommGetAsyncError(child, &async));
    } while (async == ncclInProgress);
    r = async;
  }
  OK(r);
  /* The list is read, not sorted in place. */
  if (list[0] != (rank == 2 ? 1 : 3) || list[1] != (rank == 2 ? 3 : 1)) errors[rank]++;
  OK(ncclCommCount(child, &n));
  OK(ncclCommUserRank(child, &me));
  if (n != 3 || me != want_rank) {
    fprintf(stderr, "rank %d: child rank %d of %d (want %d of 3)\n", rank, me, n, want_rank);
    errors[rank]++;
  }
  OK(ncclAllReduce(a, b, C, ncclDouble, ncclSum, child, NULL));
  for (i = 0; i < C; i++)
    if (b[i] != 6.0) errors[rank]++;
  OK(ncclAllGather(a, b, C, ncclDouble, child, NULL));
  for (i = 0; i < 3 * C; i++)
    if (b[i] != (double)(2 * (i / C))) errors[rank]++;
  if (flags == NCCL_SHRINK_ABORT) {
    /* The parent, stopped by NCCL_SHRINK_ABORT, refuses work. */
    r = ncclAllReduce(a, b, C, ncclDouble, ncclSum, comm, NULL);
    if (r != ncclInvalidUsage || !strstr(ncclGetLastError(comm), "NCCL_SHRINK_ABORT")) {
      fprintf(stderr, "rank %d: stopped parent -> %s (%s)\n", rank, ncclGetErrorString(r),
              ncclGetLastError(comm));
      errors[rank]++;
    }
  }
  OK(ncclCommDestroy(child));
out:
  pthread_barrier_wait(&done);
  if (comm) ncclCommDestroy(comm);
  free(a);
  free(b);
  return NULL;
}

int main(void) {
  pthread_t t[NR];
  int i, total = 0;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
  pthread_barrier_init(&done, NULL, NR);
  for (i = 0; i < NR; i++) pthread_create(&t[i], NULL, run, (void*)(size_t)i);
  for (i = 0; i < NR; i++) pthread_join(t[i], NULL);
  for (i = 0; i < NR; i++) total += errors[i];
  if (total) {
    fprintf(stderr, "shrink: %d errors\n", total);
    return 1;
  }
  printf("shrink: all checks passed\n");
  return 0;
}
