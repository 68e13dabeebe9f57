/* A stand-in for CUDA's cuda_runtime_api.h: just enough to prove that nccl.h
 * takes cudaStream_t from CUDA when CUDA's headers come first. */
#ifndef __CUDA_RUNTIME_API_H__
#define __CUDA_RUNTIME_API_H__
#define CUDART_VERSION 12080
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
typedef int cudaError_t;
#endif
