/* Prints the size and member offsets of each profiler event descriptor in
 * oxtest_profiler_abi.h and of recordEventState's arguments, one
 * "name value" a line, for the test that holds
 * oxccl's Rust descriptors against what a C compiler lays out.
 */
#include <stdio.h>

#include "oxtest_profiler_abi.h"

#define OFF(t, m) printf("%s.%s %zu\n", #t, #m, offsetof(t, m))
#define SIZE(t) printf("%s %zu\n", #t, sizeof(t))

#define HEAD(t) \
  SIZE(t);      \
  OFF(t, parentObj); \
  OFF(t, rank); \
  OFF(t, coll)

int main(void) {
  HEAD(descr_v1_t);
  OFF(descr_v1_t, coll.name);
  OFF(descr_v1_t, coll.commHash);
  OFF(descr_v1_t, coll.seqNumber);
  OFF(descr_v1_t, coll.func);
  OFF(descr_v1_t, coll.sendBuff);
  OFF(descr_v1_t, coll.recvBuff);
  OFF(descr_v1_t, coll.count);
  OFF(descr_v1_t, coll.root);
  OFF(descr_v1_t, coll.datatype);
  OFF(descr_v1_t, coll.op);
  OFF(descr_v1_t, coll.trafficBytes);
  OFF(descr_v1_t, coll.nMaxChannels);
  OFF(descr_v1_t, coll.nWarps);
  OFF(descr_v1_t, coll.algo);
  OFF(descr_v1_t, coll.proto);
  OFF(descr_v1_t, coll.isCollnet);
  OFF(descr_v1_t, coll.isNvls);
  OFF(descr_v1_t, p2p.name);
  OFF(descr_v1_t, p2p.commHash);
  OFF(descr_v1_t, p2p.func);
  OFF(descr_v1_t, p2p.buff);
  OFF(descr_v1_t, p2p.datatype);
  OFF(descr_v1_t, p2p.count);
  OFF(descr_v1_t, p2p.peer);
  OFF(descr_v1_t, proxyOp.pid);
  OFF(descr_v1_t, proxyOp.channelId);
  OFF(descr_v1_t, proxyOp.peer);
  OFF(descr_v1_t, proxyOp.nSteps);
  OFF(descr_v1_t, proxyOp.chunkSize);
  OFF(descr_v1_t, proxyOp.isSend);
  OFF(descr_v1_t, proxyStep.step);

  HEAD(descr_v2_t);
  OFF(descr_v2_t, coll.name);
  OFF(descr_v2_t, coll.commHash);
  OFF(descr_v2_t, coll.seqNumber);
  OFF(descr_v2_t, coll.func);
  OFF(descr_v2_t, coll.sendBuff);
  OFF(descr_v2_t, coll.recvBuff);
  OFF(descr_v2_t, coll.count);
  OFF(descr_v2_t, coll.root);
  OFF(descr_v2_t, coll.datatype);
  OFF(descr_v2_t, coll.trafficBytes);
  OFF(descr_v2_t, coll.nMaxChannels);
  OFF(descr_v2_t, coll.nWarps);
  OFF(descr_v2_t, coll.algo);
  OFF(descr_v2_t, coll.proto);
  OFF(descr_v2_t, p2p.name);
  OFF(descr_v2_t, p2p.commHash);
  OFF(descr_v2_t, p2p.func);
  OFF(descr_v2_t, p2p.buff);
  OFF(descr_v2_t, p2p.datatype);
  OFF(descr_v2_t, p2p.count);
  OFF(descr_v2_t, p2p.peer);

  HEAD(descr_v3_t);
  OFF(descr_v3_t, coll.name);
  OFF(descr_v3_t, coll.commHash);
  OFF(descr_v3_t, coll.seqNumber);
  OFF(descr_v3_t, coll.func);
  OFF(descr_v3_t, coll.sendBuff);
  OFF(descr_v3_t, coll.recvBuff);
  OFF(descr_v3_t, coll.count);
  OFF(descr_v3_t, coll.root);
  OFF(descr_v3_t, coll.datatype);
  OFF(descr_v3_t, coll.nMaxChannels);
  OFF(descr_v3_t, coll.nWarps);
  OFF(descr_v3_t, coll.algo);
  OFF(descr_v3_t, coll.proto);
  OFF(descr_v3_t, p2p.name);
  OFF(descr_v3_t, p2p.commHash);
  OFF(descr_v3_t, p2p.func);
  OFF(descr_v3_t, p2p.buff);
  OFF(descr_v3_t, p2p.datatype);
  OFF(descr_v3_t, p2p.count);
  OFF(descr_v3_t, p2p.peer);

  HEAD(descr_v4_t);
  OFF(descr_v4_t, coll.seqNumber);
  OFF(descr_v4_t, coll.func);
  OFF(descr_v4_t, coll.sendBuff);
  OFF(descr_v4_t, coll.recvBuff);
  OFF(descr_v4_t, coll.count);
  OFF(descr_v4_t, coll.root);
  OFF(descr_v4_t, coll.datatype);
  OFF(descr_v4_t, coll.nChannels);
  OFF(descr_v4_t, coll.nWarps);
  OFF(descr_v4_t, coll.algo);
  OFF(descr_v4_t, coll.proto);
  OFF(descr_v4_t, p2p.func);
  OFF(descr_v4_t, p2p.buff);
  OFF(descr_v4_t, p2p.datatype);
  OFF(descr_v4_t, p2p.count);
  OFF(descr_v4_t, p2p.peer);
  OFF(descr_v4_t, proxyOp.pid);
  OFF(descr_v4_t, proxyOp.channelId);
  OFF(descr_v4_t, proxyOp.peer);
  OFF(descr_v4_t, proxyOp.nSteps);
  OFF(descr_v4_t, proxyOp.chunkSize);
  OFF(descr_v4_t, proxyOp.isSend);
  OFF(descr_v4_t, proxyStep.step);
  OFF(descr_v4_t, p2p.nChannels);

  HEAD(descr_v6_t);
  OFF(descr_v6_t, groupApi.graphCaptured);
  OFF(descr_v6_t, groupApi.groupDepth);
  OFF(descr_v6_t, collApi.func);
  OFF(descr_v6_t, collApi.count);
  OFF(descr_v6_t, collApi.datatype);
  OFF(descr_v6_t, collApi.root);
  OFF(descr_v6_t, collApi.stream);
  OFF(descr_v6_t, collApi.graphCaptured);
  OFF(descr_v6_t, p2pApi.func);
  OFF(descr_v6_t, p2pApi.count);
  OFF(descr_v6_t, p2pApi.datatype);
  OFF(descr_v6_t, p2pApi.stream);
  OFF(descr_v6_t, p2pApi.graphCaptured);
  OFF(descr_v6_t, coll.seqNumber);
  OFF(descr_v6_t, coll.func);
  OFF(descr_v6_t, coll.sendBuff);
  OFF(descr_v6_t, coll.recvBuff);
  OFF(descr_v6_t, coll.count);
  OFF(descr_v6_t, coll.root);
  OFF(descr_v6_t, coll.datatype);
  OFF(descr_v6_t, coll.nChannels);
  OFF(descr_v6_t, coll.nWarps);
  OFF(descr_v6_t, coll.algo);
  OFF(descr_v6_t, coll.proto);
  OFF(descr_v6_t, coll.parentGroup);
  OFF(descr_v6_t, p2p.func);
  OFF(descr_v6_t, p2p.buff);
  OFF(descr_v6_t, p2p.datatype);
  OFF(descr_v6_t, p2p.count);
  OFF(descr_v6_t, p2p.peer);
  OFF(descr_v6_t, proxyOp.pid);
  OFF(descr_v6_t, proxyOp.channelId);
  OFF(descr_v6_t, proxyOp.peer);
  OFF(descr_v6_t, proxyOp.nSteps);
  OFF(descr_v6_t, proxyOp.chunkSize);
  OFF(descr_v6_t, proxyOp.isSend);
  OFF(descr_v6_t, proxyStep.step);
  OFF(descr_v6_t, p2p.nChannels);
  OFF(descr_v6_t, p2p.parentGroup);
  OFF(descr_v6_t, ceColl.seqNumber);
  OFF(descr_v6_t, ceColl.func);
  OFF(descr_v6_t, ceColl.sendBuff);
  OFF(descr_v6_t, ceColl.recvBuff);
  OFF(descr_v6_t, ceColl.count);
  OFF(descr_v6_t, ceColl.root);
  OFF(descr_v6_t, ceColl.datatype);
  OFF(descr_v6_t, ceColl.syncStrategy);
  OFF(descr_v6_t, ceColl.intraBatchSync);
  OFF(descr_v6_t, ceColl.batchSize);
  OFF(descr_v6_t, ceColl.numBatches);
  OFF(descr_v6_t, ceColl.ceSeqNum);
  OFF(descr_v6_t, ceColl.stream);

  SIZE(state_args_v1_t);
  OFF(state_args_v1_t, proxyOp.transSize);
  OFF(state_args_v1_t, proxyOp.steps);
  OFF(state_args_v1_t, proxyCtrl.appendedProxyOps);
  SIZE(state_args_v4_t);
  OFF(state_args_v4_t, proxyStep.transSize);
  OFF(state_args_v4_t, proxyCtrl.appendedProxyOps);
  OFF(state_args_v4_t, netPlugin.data);
  OFF(state_args_v4_t, kernelCh.pTimer);
  return 0;
}
