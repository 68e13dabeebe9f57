/* A first oxccl program: four ranks in one process all-reduce (sum) host
 * buffers and check the result. No GPU is needed: oxccl runs collectives on
 * host memory itself.
 *
 *   cargo xtask build
 *   cc examples/c/allreduce.c -I crates/oxccl-nccl/include -L target/release -lnccl -o allreduce
 *   LD_LIBRARY_PATH=target/release ./allreduce
 *
 * Prints one line ending in OK and exits 0, or names what failed and exits 1. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define NRANKS 4
#define COUNT 1024

#define NCCL_OK(call)                                                            \
  do {                                                                           \
    ncclResult_t r_ = (call);                                                    \
    if (r_ != ncclSuccess) {                                                     \
      fprintf(stderr, "allreduce: %s failed: %s (%s)\n", #call,                  \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                   \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int main(void) {
  ncclComm_t comms[NRANKS];
  float* send[NRANKS];
  float* recv[NRANKS];
  int version = 0, rank, i, wrong = 0;

  NCCL_OK(ncclGetVersion(&version));
  /* One communicator per rank, all in this process (devlist NULL: no GPUs). */
  NCCL_OK(ncclCommInitAll(comms, NRANKS, NULL));

  for (rank = 0; rank < NRANKS; rank++) {
    send[rank] = malloc(COUNT * sizeof(float));
    recv[rank] = malloc(COUNT * sizeof(float));
    if (!send[rank] || !recv[rank]) {
      fprintf(stderr, "allreduce: out of memory\n");
      return 1;
    }
    for (i = 0; i < COUNT; i++) send[rank][i] = (float)(rank + 1) * (float)i;
  }

  /* One thread drives every rank, so the calls go in one group: each rank's
   * call would otherwise wait for the others'. */
  NCCL_OK(ncclGroupStart());
  for (rank = 0; rank < NRANKS; rank++)
    NCCL_OK(ncclAllReduce(send[rank], recv[rank], COUNT, ncclFloat, ncclSum, comms[rank], NULL));
  NCCL_OK(ncclGroupEnd());

  /* Element i is the sum over ranks of (rank + 1) * i = 10 * i for 4 ranks. */
  for (rank = 0; rank < NRANKS; rank++)
    for (i = 0; i < COUNT; i++)
      if (recv[rank][i] != (float)(NRANKS * (NRANKS + 1) / 2) * (float)i) wrong++;

  for (rank = 0; rank < NRANKS; rank++) {
    NCCL_OK(ncclCommDestroy(comms[rank]));
    free(send[rank]);
    free(recv[rank]);
  }
  if (wrong) {
    fprintf(stderr, "allreduce: %d of %d elements wrong\n", wrong, NRANKS * COUNT);
    return 1;
  }
  printf("allreduce: %d ranks x %d floats summed, NCCL version code %d: OK\n", NRANKS, COUNT,
         version);
  return 0;
}
