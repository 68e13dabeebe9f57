/* Compiles nccl.h (-c, no link) and uses its types and macros. */
#ifdef WITH_FAKE_CUDA
#include <cuda_runtime_api.h>
#endif
#include <nccl.h>

#ifdef WITH_FAKE_CUDA
#ifndef CUDART_VERSION
#error "fake CUDA header not seen"
#endif
#ifdef OXCCL_HAVE_CUDA_STREAM_T
#error "nccl.h declared cudaStream_t although CUDA's headers came first"
#endif
#endif

#if NCCL_VERSION_CODE != NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)
#error "NCCL_VERSION_CODE does not match NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)"
#endif
#if NCCL_VERSION(2, 8, 4) != 2804 || NCCL_VERSION(2, 30, 7) != 23007
#error "NCCL_VERSION encodes wrongly"
#endif

#define STATIC_CHECK(name, cond) typedef char name[(cond) ? 1 : -1]
STATIC_CHECK(check_magic, NCCL_API_MAGIC == 0xcafebeef);
STATIC_CHECK(check_maxop, ncclMaxRedOp == 0x7fffffff);
STATIC_CHECK(check_undef, NCCL_CONFIG_UNDEF_INT == INT_MIN);
STATIC_CHECK(check_id, sizeof(ncclUniqueId) == 128);
STATIC_CHECK(check_types, ncclNumTypes == 12 && ncclFloat8e5m2 == 11 && ncclHalf == 6);

typedef ncclResult_t (*allreduce_fn)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                     ncclComm_t, cudaStream_t);

int main(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ncclUniqueId id;
  ncclComm_t comm = NCCL_COMM_NULL;
  cudaStream_t stream = 0;
  ncclTeam_t team;
  allreduce_fn f = ncclAllReduce;
  allreduce_fn pf = pncclAllReduce;
  int s = (int)sizeof(id) + (int)sizeof(config) + (int)sizeof(sim) + (int)sizeof(team);
  s += ncclSum + ncclAvg + ncclNumOps + ncclFloat + ncclBfloat16 + ncclFloat8e5m2 + ncclNumTypes;
  s += ncclScalarDevice + ncclScalarHostImmediate + ncclInProgress + ncclTimeout;
  s += NCCL_SPLIT_NOCOLOR + NCCL_CTA_POLICY_ZERO + NCCL_WIN_COLL_SYMMETRIC;
  (void)comm;
  (void)stream;
  (void)f;
  (void)pf;
  return (s > 0 && config.magic == NCCL_API_MAGIC && config.blocking == NCCL_CONFIG_UNDEF_INT &&
          ncclMaxRedOp == 0x7fffffff)
             ? 0
             : 1;
}
