/* The event descriptors of NCCL's profiler ABI, v1 to v6, written from
 * the member lists NCCL's headers give (types, order, names), for the test
 * profiler and for the layout check that prints their offsets. Only the
 * members oxccl fills are spelled out, with v6's copy-engine collective
 * for the union's size; the other members are smaller.
 */
#ifndef OXTEST_PROFILER_ABI_H
#define OXTEST_PROFILER_ABI_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef int ncclResult_t;

/* The proxy members, the same in every version. */
#define PROXY_MEMBERS      \
  struct {                 \
    pid_t pid;             \
    uint8_t channelId;     \
    int peer;              \
    int nSteps;            \
    int chunkSize;         \
    int isSend;            \
  } proxyOp;               \
  struct {                 \
    int step;              \
  } proxyStep;
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

/* v1: function, datatype, algorithm and protocol as numbers. */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name;
      uint64_t commHash;
      uint64_t seqNumber;
      uint8_t func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      uint8_t datatype;
      uint32_t op;
      size_t trafficBytes;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      uint8_t algo;
      uint8_t proto;
      int isCollnet;
      int isNvls;
    } coll;
    struct {
      const char* name;
      uint64_t commHash;
      uint8_t func;
      void* buff;
      uint8_t datatype;
      size_t count;
      int peer;
    } p2p;
    PROXY_MEMBERS
  };
} descr_v1_t;

/* v2: names as strings, op dropped. */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name;
      uint64_t commHash;
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      size_t trafficBytes;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* name;
      uint64_t commHash;
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
    } p2p;
    PROXY_MEMBERS
  };
} descr_v2_t;

/* v3: trafficBytes dropped (kernel-channel and net-plugin members added,
 * smaller than coll). */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name;
      uint64_t commHash;
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* name;
      uint64_t commHash;
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
    } p2p;
    PROXY_MEMBERS
  };
} descr_v3_t;

/* v4: name and commHash dropped; nChannels; p2p gains nChannels. */
typedef struct {
  uint8_t type;
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
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    PROXY_MEMBERS
  };
} descr_v4_t;

/* v5: a 64-bit type, API events, parentGroup; v6 adds copy-engine members
 * (ceColl the largest, 88 bytes). */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
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
    PROXY_MEMBERS
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
    } ceColl;
  };
} descr_v6_t;

/* v5's union ends before v6's ceColl; oxccl passes v6's size to both, a
 * v5 plugin reads the prefix. */
typedef descr_v6_t descr_v5_t;

/* recordEventState's arguments: v1 to v3, then v4 to v6. */
typedef union {
  struct {
    size_t transSize;
    int steps;
  } proxyOp;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
} state_args_v1_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} state_args_v4_t;

#endif
