/* Prints sizeof and offsetof for every field of ncclConfig_t. */
#include <stddef.h>
#include <stdio.h>
#include <nccl.h>

#define F(field) printf(#field " %zu\n", offsetof(ncclConfig_t, field))

int main(void) {
  printf("sizeof %zu\n", sizeof(ncclConfig_t));
  F(size); F(magic); F(version); F(blocking); F(cgaClusterSize); F(minCTAs); F(maxCTAs);
  F(netName); F(splitShare); F(trafficClass); F(commName); F(collnetEnable); F(CTAPolicy);
  F(shrinkShare); F(nvlsCTAs);
  printf("ncclUniqueId %zu\n", sizeof(ncclUniqueId));
  printf("ncclSimInfo_t %zu\n", sizeof(ncclSimInfo_t));
  printf("ncclTeam_t %zu\n", sizeof(ncclTeam_t));
  return 0;
}
