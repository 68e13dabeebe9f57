/* One rank per thread: ncclGetUniqueId + ncclCommInitRank, as a
 * multi-process program would do with the id sent over the wire. */
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NR 4
#define C 4096

static ncclUniqueId id;
static int errors[NR];

#define OK(call)                                                                   \
  do {                                                                             \
    ncclResult_t r_ = (call);                                                      \
    if (r_ != ncclSuccess) {                                                       \
      fprintf(stderr, "rank %d: %s -> %s (%s)\n", rank, #call,                     \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                     \
      errors[rank]++;                                                              \
      return NULL;                                                                 \
    }                                                                              \
  } while (0)

static void* run(void* arg) {
  int rank = (int)(size_t)arg, i, n = 0, me = -1;
  ncclComm_t comm;
  ncclResult_t async;
  double* a = (double*)malloc(NR * C * sizeof(double));
  double* b = (double*)malloc(NR * C * sizeof(double));
  OK(ncclCommInitRank(&comm, NR, id, rank));
  OK(ncclCommCount(comm, &n));
  OK(ncclCommUserRank(comm, &me));
  if (n != NR || me != rank) errors[rank]++;
  for (i = 0; i < C; i++) a[i] = rank + i;
  OK(ncclAllReduce(a, b, C, ncclDouble, ncclSum, comm, NULL));
  for (i = 0; i < C; i++)
    if (b[i] != (double)(NR * i + NR * (NR - 1) / 2)) errors[rank]++;
  OK(ncclAllReduce(a, b, C, ncclDouble, ncclAvg, comm, NULL));
  for (i = 0; i < C; i++)
    if (b[i] != (double)i + (NR - 1) / 2.0) errors[rank]++;
  for (i = 0; i < C; i++) b[i] = rank == 3 ? (double)i : -1.0;
  OK(ncclBroadcast(b, b, C, ncclDouble, 3, comm, NULL));
  for (i = 0; i < C; i++)
    if (b[i] != (double)i) errors[rank]++;
  for (i = 0; i < C; i++) a[i] = rank * C + i;
  OK(ncclAllGather(a, b, C, ncclDouble, comm, NULL));
  for (i = 0; i < NR * C; i++)
    if (b[i] != (double)i) errors[rank]++;
  /* p2p exchange with the opposite rank, both orders inside one group */
  OK(ncclGroupStart());
  OK(ncclSend(a, C, ncclDouble, NR - 1 - rank, comm, NULL));
  OK(ncclRecv(b, C, ncclDouble, NR - 1 - rank, comm, NULL));
  OK(ncclGroupEnd());
  for (i = 0; i < C; i++)
    if (b[i] != (double)((NR - 1 - rank) * C + i)) errors[rank]++;
  OK(ncclCommGetAsyncError(comm, &async));
  if (async != ncclSuccess) errors[rank]++;
  OK(ncclCommFinalize(comm));
  OK(ncclCommDestroy(comm));
  free(a);
  free(b);
  return NULL;
}

int main(void) {
  pthread_t t[NR];
  int i, total = 0;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
  for (i = 0; i < NR; i++) pthread_create(&t[i], NULL, run, (void*)(size_t)i);
  for (i = 0; i < NR; i++) pthread_join(t[i], NULL);
  for (i = 0; i < NR; i++) total += errors[i];
  if (total) {
    fprintf(stderr, "threads: %d errors\n", total);
    return 1;
  }
  printf("threads: all checks passed\n");
  return 0;
}
