/*
 * Compiled by nccl/tests/abi.rs against NVIDIA's nccl.h and against ours, linked with
 * mscclpp-rs's libnccl.so.2, and run on its CPU backend:
 *   1. prints every constant, size and field offset of the header, one `value|size|offset NAME N`
 *      line each (the test compares the two builds' lines);
 *   2. takes the address of every pnccl* alias (so linking fails if one is missing);
 *   3. calls every function of the header on one- and two-rank communicators and checks the
 *      code (and, where data moves, the data), one `ok CALL` or `FAIL CALL …` line each.
 * Exits 0 only if every call returned what it should.
 */
#define NCCL_OS_LINUX 1
#include <nccl.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define V(name) printf("value %s %lld\n", #name, (long long)(name))
#define SIZE(t) printf("size %s %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offset %s.%s %zu\n", #t, #f, offsetof(t, f))
#define EXPECT(call, code)                                                                  \
  do {                                                                                      \
    ncclResult_t r_ = (call);                                                               \
    if (r_ != (code)) {                                                                     \
      printf("FAIL %s: returned %d, expected %d (%s)\n", #call, (int)r_, (int)(code),       \
             ncclGetLastError(NULL));                                                       \
      failures++;                                                                           \
    } else {                                                                                \
      printf("ok %s\n", #call);                                                             \
    }                                                                                       \
  } while (0)
#define CHECK(cond)                                   \
  do {                                                \
    if (!(cond)) {                                    \
      printf("FAIL %s (line %d)\n", #cond, __LINE__); \
      failures++;                                     \
    }                                                 \
  } while (0)

static void values(void) {
  V(NCCL_MAJOR); V(NCCL_MINOR); V(NCCL_PATCH); V(NCCL_VERSION_CODE);
  V(NCCL_VERSION(2, 32, 3)); V(NCCL_VERSION(2, 8, 4));
  V(NCCL_UNIQUE_ID_BYTES); V(NCCL_API_MAGIC); V(NCCL_CONFIG_UNDEF_INT); V(NCCL_SPLIT_NOCOLOR);
  V(NCCL_WIN_DEFAULT); V(NCCL_WIN_COLL_SYMMETRIC); V(NCCL_WIN_STRICT_ORDERING);
  V(NCCL_WIN_GIN_ONLY); V(NCCL_WIN_CFT_COUNTED); V(NCCL_WIN_REQUIRED_ALIGNMENT);
  V(NCCL_CTA_POLICY_DEFAULT); V(NCCL_CTA_POLICY_EFFICIENCY); V(NCCL_CTA_POLICY_ZERO);
  V(NCCL_SHRINK_DEFAULT); V(NCCL_SHRINK_ABORT); V(NCCL_REVOKE_DEFAULT); V(NCCL_SUSPEND_MEM);
  V(ncclSuccess); V(ncclUnhandledCudaError); V(ncclSystemError); V(ncclInternalError);
  V(ncclInvalidArgument); V(ncclInvalidUsage); V(ncclRemoteError); V(ncclInProgress);
  V(ncclTimeout); V(ncclNumResults);
  V(ncclSum); V(ncclProd); V(ncclMax); V(ncclMin); V(ncclAvg); V(ncclNumOps); V(ncclMaxRedOp);
  V(ncclInt8); V(ncclChar); V(ncclUint8); V(ncclInt32); V(ncclInt); V(ncclUint32);
  V(ncclInt64); V(ncclUint64); V(ncclFloat16); V(ncclHalf); V(ncclFloat32); V(ncclFloat);
  V(ncclFloat64); V(ncclDouble); V(ncclBfloat16); V(ncclFloat8e4m3); V(ncclFloat8e5m2);
  V(ncclNumTypes);
  V(ncclScalarDevice); V(ncclScalarHostImmediate);
  V(ncclStatGpuMemSuspend); V(ncclStatGpuMemSuspended); V(ncclStatGpuMemPersist);
  V(ncclStatGpuMemTotal);
  V(ncclHostCftDefault); V(ncclHostCftEnable); V(ncclHostCftDisable); V(ncclHostCftFallback);
  V(ncclNvlsHostModeDefault); V(ncclNvlsHostModeEnable); V(ncclNvlsHostModeDisableTransport);
  V(ncclNvlsHostModeDisableSymmetricMultimem); V(ncclNvlsHostModeDisable);
  V(NCCL_ENCRYPTION_MODE_NONE); V(NCCL_ENCRYPTION_MODE_PSK);

  SIZE(ncclUniqueId); SIZE(ncclResult_t); SIZE(ncclRedOp_t); SIZE(ncclDataType_t);
  SIZE(ncclScalarResidence_t); SIZE(ncclCommMemStat_t); SIZE(ncclComm_t); SIZE(ncclWindow_t);
  SIZE(ncclConfig_t);
  OFF(ncclConfig_t, size); OFF(ncclConfig_t, magic); OFF(ncclConfig_t, version);
  OFF(ncclConfig_t, blocking); OFF(ncclConfig_t, cgaClusterSize); OFF(ncclConfig_t, minCTAs);
  OFF(ncclConfig_t, maxCTAs); OFF(ncclConfig_t, netName); OFF(ncclConfig_t, splitShare);
  OFF(ncclConfig_t, trafficClass); OFF(ncclConfig_t, commName);
  OFF(ncclConfig_t, collnetEnable); OFF(ncclConfig_t, CTAPolicy); OFF(ncclConfig_t, shrinkShare);
  OFF(ncclConfig_t, nvlsCTAs); OFF(ncclConfig_t, nChannelsPerNetPeer);
  OFF(ncclConfig_t, nvlinkCentricSched); OFF(ncclConfig_t, graphUsageMode);
  OFF(ncclConfig_t, numRmaCtx); OFF(ncclConfig_t, maxP2pPeers);
  OFF(ncclConfig_t, graphStreamOrdering); OFF(ncclConfig_t, launchOrderImplicit);
  OFF(ncclConfig_t, numRmaSig); OFF(ncclConfig_t, rmaEagerInit); OFF(ncclConfig_t, hostCftMode);
  OFF(ncclConfig_t, nvlsHostMode);
  SIZE(ncclConfigExt_t); OFF(ncclConfigExt_t, next); OFF(ncclConfigExt_t, key);
  OFF(ncclConfigExt_t, val);
  SIZE(ncclCollConfig_t);
  OFF(ncclCollConfig_t, size); OFF(ncclCollConfig_t, magic); OFF(ncclCollConfig_t, version);
  OFF(ncclCollConfig_t, ext); OFF(ncclCollConfig_t, minCTAs); OFF(ncclCollConfig_t, maxCTAs);
  OFF(ncclCollConfig_t, nvlsCTAs); OFF(ncclCollConfig_t, cgaClusterSize);
  OFF(ncclCollConfig_t, algSelection); OFF(ncclCollConfig_t, forceAlgSelection);
  OFF(ncclCollConfig_t, CTAPolicy); OFF(ncclCollConfig_t, userProfilerTag);
  OFF(ncclCollConfig_t, launchCompletionEvent);
  SIZE(ncclSimInfo_t); OFF(ncclSimInfo_t, estimatedTime);
  SIZE(ncclWaitSignalDesc_t); OFF(ncclWaitSignalDesc_t, peer); OFF(ncclWaitSignalDesc_t, ctx);
  SIZE(ncclEncryptionConfig_t); OFF(ncclEncryptionConfig_t, mode); OFF(ncclEncryptionConfig_t, psk);

  {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    V(c.size); V(c.magic); V(c.version); V(c.blocking); V(c.commName == NULL);
    V(c.nvlsHostMode);
    ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
    V(cc.size); V(cc.magic); V(cc.forceAlgSelection); V(cc.userProfilerTag); V(cc.CTAPolicy);
    ncclSimInfo_t si = NCCL_SIM_INFO_INITIALIZER;
    V(si.size); V(si.magic); V((int)si.estimatedTime);
    ncclEncryptionConfig_t ec = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
    V(ec.size); V(ec.mode);
  }
}

/* Every pnccl* alias of the header (linking fails if the library lacks one). */
static void* const aliases[] = {
    (void*)&pncclMemAlloc, (void*)&pncclMemFree, (void*)&pncclGetVersion,
    (void*)&pncclGetUniqueId, (void*)&pncclCommInitRankConfig, (void*)&pncclCommInitRank,
    (void*)&pncclCommInitAll, (void*)&pncclCommFinalize, (void*)&pncclCommDestroy,
    (void*)&pncclCommAbort, (void*)&pncclCommRevoke, (void*)&pncclCommSplit,
    (void*)&pncclCommShrink, (void*)&pncclCommGetUniqueId, (void*)&pncclCommGrow,
    (void*)&pncclCommInitRankScalable, (void*)&pncclGetErrorString, (void*)&pncclGetLastError,
    (void*)&pncclResetDebugInit, (void*)&pncclCommGetAsyncError, (void*)&pncclCommCount,
    (void*)&pncclCommCuDevice, (void*)&pncclCommUserRank, (void*)&pncclCommRegister,
    (void*)&pncclCommDeregister, (void*)&pncclCommSuspend, (void*)&pncclCommResume,
    (void*)&pncclCommMemStats, (void*)&pncclCommWindowRegister,
    (void*)&pncclCommWindowDeregister, (void*)&pncclWinGetUserPtr,
    (void*)&pncclRedOpCreatePreMulSum, (void*)&pncclRedOpDestroy, (void*)&pncclReduce,
    (void*)&pncclBcast, (void*)&pncclBroadcast, (void*)&pncclAllReduce,
    (void*)&pncclReduceScatter, (void*)&pncclAllGather, (void*)&pncclAlltoAll,
    (void*)&pncclGather, (void*)&pncclScatter, (void*)&pncclAllReduceConfig,
    (void*)&pncclBroadcastConfig, (void*)&pncclReduceConfig, (void*)&pncclAllGatherConfig,
    (void*)&pncclReduceScatterConfig, (void*)&pncclAlltoAllConfig, (void*)&pncclGatherConfig,
    (void*)&pncclScatterConfig, (void*)&pncclSend, (void*)&pncclRecv, (void*)&pncclPutSignal,
    (void*)&pncclSignal, (void*)&pncclWaitSignal, (void*)&pncclGroupStart,
    (void*)&pncclGroupEnd, (void*)&pncclGroupSimulateEnd, (void*)&pncclSetEncryption,
    (void*)&pncclParamBind, (void*)&pncclParamGetI8, (void*)&pncclParamGetI16,
    (void*)&pncclParamGetI32, (void*)&pncclParamGetI64, (void*)&pncclParamGetU8,
    (void*)&pncclParamGetU16, (void*)&pncclParamGetU32, (void*)&pncclParamGetU64,
    (void*)&pncclParamGetStr, (void*)&pncclParamGet, (void*)&pncclParamGetParameter,
    (void*)&pncclParamGetAllParameterKeys, (void*)&pncclParamDumpAll,
};

static void calls(void) {
  int v = 0, count = -1, dev = -1, rank = -1;
  ncclUniqueId id, ids[2];
  ncclComm_t comm = NULL, comm2 = NULL, comm3 = NULL, nc = NULL, all[2] = {NULL, NULL};
  ncclResult_t async = ncclInternalError;
  cudaStream_t s = NULL;
  void *buf = NULL, *h = NULL, *up = NULL;
  ncclWindow_t w = NULL;
  ncclRedOp_t op;
  float scalar = 2.0f;
  int i;

  EXPECT(ncclGetVersion(&v), ncclSuccess);
  CHECK(v == NCCL_VERSION_CODE);
  CHECK(strlen(ncclGetErrorString(ncclInvalidUsage)) > 0);
  EXPECT(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "abi-check";
    cfg.blocking = 1;
    EXPECT(ncclGetUniqueId(&id), ncclSuccess);
    EXPECT(ncclCommInitRankConfig(&comm2, 1, id, 0, &cfg), ncclSuccess);
  }
  EXPECT(ncclGetUniqueId(&ids[0]), ncclSuccess);
  EXPECT(ncclGetUniqueId(&ids[1]), ncclSuccess);
  EXPECT(ncclCommInitRankScalable(&comm3, 1, 0, 2, ids, NULL), ncclSuccess);
  EXPECT(ncclCommInitAll(all, 2, NULL), ncclSuccess);
  EXPECT(ncclCommCount(comm, &count), ncclSuccess);
  EXPECT(ncclCommCuDevice(comm, &dev), ncclSuccess);
  EXPECT(ncclCommUserRank(all[1], &rank), ncclSuccess);
  CHECK(count == 1 && dev == 0 && rank == 1);
  EXPECT(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  CHECK(async == ncclSuccess);

  EXPECT(ncclMemAlloc(&buf, 4096), ncclSuccess);
  /* The CPU backend's device memory is host memory. */
  float* a = (float*)buf;
  float* b = a + 256;
  for (i = 0; i < 256; i++) a[i] = (float)(i % 13) - 4.0f;
  EXPECT(ncclCommRegister(comm, buf, 4096, &h), ncclSuccess);
  EXPECT(ncclCommDeregister(comm, h), ncclSuccess);
  EXPECT(ncclCommWindowRegister(comm, buf, 4096, &w, NCCL_WIN_COLL_SYMMETRIC), ncclSuccess);
  EXPECT(ncclWinGetUserPtr(comm, w, &up), ncclSuccess);
  CHECK(up == buf);
  EXPECT(ncclCommWindowDeregister(comm, w), ncclSuccess);
  EXPECT(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm),
         ncclSuccess);
  CHECK(op == ncclNumOps);
  EXPECT(ncclRedOpDestroy(op, comm), ncclSuccess);

  /* Collectives on one rank: copies of the input. */
#define SAME(n) CHECK(memcmp(a, b, (n) * sizeof(float)) == 0); memset(b, 0, (n) * sizeof(float))
  EXPECT(ncclAllReduce(a, b, 16, ncclFloat, ncclSum, comm, s), ncclSuccess); SAME(16);
  EXPECT(ncclBroadcast(a, b, 16, ncclFloat, 0, comm, s), ncclSuccess); SAME(16);
  memcpy(b, a, 16 * sizeof(float));
  EXPECT(ncclBcast(b, 16, ncclFloat, 0, comm, s), ncclSuccess); SAME(16);
  EXPECT(ncclReduceScatter(a, b, 16, ncclFloat, ncclMax, comm, s), ncclSuccess); SAME(16);
  EXPECT(ncclAllGather(a, b, 16, ncclFloat, comm, s), ncclSuccess); SAME(16);
  EXPECT(ncclAlltoAll(a, b, 16, ncclFloat, comm, s), ncclSuccess); SAME(16);
  {
    ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
    EXPECT(ncclAllReduceConfig(a, b, 16, ncclFloat, ncclMin, comm, s, &cc), ncclSuccess); SAME(16);
    EXPECT(ncclBroadcastConfig(a, b, 16, ncclFloat, 0, comm, s, &cc), ncclSuccess); SAME(16);
    EXPECT(ncclAllGatherConfig(a, b, 16, ncclFloat, comm, s, &cc), ncclSuccess); SAME(16);
    EXPECT(ncclReduceScatterConfig(a, b, 16, ncclFloat, ncclSum, comm, s, NULL), ncclSuccess); SAME(16);
    EXPECT(ncclAlltoAllConfig(a, b, 16, ncclFloat, comm, s, &cc), ncclSuccess); SAME(16);
    EXPECT(ncclReduceConfig(a, b, 16, ncclFloat, ncclSum, 0, comm, s, &cc), ncclSuccess); SAME(16);
    EXPECT(ncclGatherConfig(a, b, 16, ncclFloat, 0, comm, s, &cc), ncclSuccess); SAME(16);
    EXPECT(ncclScatterConfig(a, b, 16, ncclFloat, 0, comm, s, &cc), ncclSuccess); SAME(16);
  }
  EXPECT(ncclGroupStart(), ncclSuccess);
  EXPECT(ncclSend(a, 16, ncclFloat, 0, comm, s), ncclSuccess);
  EXPECT(ncclRecv(b, 16, ncclFloat, 0, comm, s), ncclSuccess);
  EXPECT(ncclGroupEnd(), ncclSuccess);
  SAME(16);
  /* Two ranks of one process, one group. */
  {
    float* c0 = a + 512;
    float* c1 = a + 768;
    for (i = 0; i < 32; i++) { c0[i] = (float)i; c1[i] = (float)(100 - i); }
    EXPECT(ncclGroupStart(), ncclSuccess);
    EXPECT(ncclAllReduce(c0, c0, 32, ncclFloat32, ncclSum, all[0], s), ncclSuccess);
    EXPECT(ncclAllReduce(c1, c1, 32, ncclFloat32, ncclSum, all[1], s), ncclSuccess);
    EXPECT(ncclGroupEnd(), ncclSuccess);
    for (i = 0; i < 32; i++) CHECK(c0[i] == 100.0f && c1[i] == 100.0f);
  }

  EXPECT(ncclReduce(a, b, 16, ncclFloat, ncclSum, 0, comm, s), ncclSuccess); SAME(16);
  EXPECT(ncclGather(a, b, 16, ncclFloat, 0, comm, s), ncclSuccess); SAME(16);
  EXPECT(ncclScatter(a, b, 16, ncclFloat, 0, comm, s), ncclSuccess); SAME(16);
  /* ncclProd, ncclAvg and a pre-multiplied sum on one rank: x, x and 2x. */
  EXPECT(ncclAllReduce(a, b, 16, ncclFloat, ncclProd, comm, s), ncclSuccess); SAME(16);
  EXPECT(ncclAllReduce(a, b, 16, ncclFloat, ncclAvg, comm, s), ncclSuccess); SAME(16);
  {
    float two = 2.0f;
    ncclRedOp_t twice;
    EXPECT(ncclRedOpCreatePreMulSum(&twice, &two, ncclFloat32, ncclScalarHostImmediate, comm),
           ncclSuccess);
    EXPECT(ncclAllReduce(a, b, 16, ncclFloat, twice, comm, s), ncclSuccess);
    for (i = 0; i < 16; i++) CHECK(b[i] == 2.0f * a[i]);
    memset(b, 0, 16 * sizeof(float));
    EXPECT(ncclRedOpDestroy(twice, comm), ncclSuccess);
  }

  /* Split: one color (a communicator of one rank) and no color (none). */
  EXPECT(ncclCommSplit(comm, 0, 0, &nc, NULL), ncclSuccess);
  CHECK(nc != NULL);
  EXPECT(ncclCommCount(nc, &count), ncclSuccess);
  CHECK(count == 1);
  EXPECT(ncclAllReduce(a, b, 16, ncclFloat, ncclSum, nc, s), ncclSuccess); SAME(16);
  EXPECT(ncclCommDestroy(nc), ncclSuccess);
  EXPECT(ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &nc, NULL), ncclSuccess);
  CHECK(nc == NULL);

  /* Shrink (by nobody: one rank), revoke, grow's refusals. */
  {
    int none[1] = {0};
    ncclComm_t shrunk = NULL, grown = NULL;
    EXPECT(ncclCommShrink(comm, none, 0, &shrunk, NULL, NCCL_SHRINK_DEFAULT), ncclSuccess);
    CHECK(shrunk != NULL);
    EXPECT(ncclCommCount(shrunk, &count), ncclSuccess);
    CHECK(count == 1);
    EXPECT(ncclAllReduce(a, b, 16, ncclFloat, ncclSum, shrunk, s), ncclSuccess); SAME(16);
    EXPECT(ncclCommShrink(comm, none, 0, &nc, NULL, 2), ncclInvalidArgument);
    none[0] = 1;
    EXPECT(ncclCommShrink(comm, none, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
    /* Excluding itself: no part, no communicator. */
    none[0] = 0;
    EXPECT(ncclCommShrink(shrunk, none, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), ncclSuccess);
    CHECK(nc == NULL);
    /* A grow needs the id its rank 0 made, and more ranks. */
    EXPECT(ncclCommGrow(shrunk, 2, &id, -1, &grown, NULL), ncclInvalidUsage);
    EXPECT(ncclCommGetUniqueId(shrunk, &id), ncclSuccess);
    EXPECT(ncclCommGetUniqueId(shrunk, &id), ncclInvalidUsage);
    EXPECT(ncclCommGrow(shrunk, 1, &id, -1, &grown, NULL), ncclInvalidArgument);
    EXPECT(ncclCommGrow(shrunk, 2, &id, 0, &grown, NULL), ncclInvalidArgument);
    /* Revoke: later calls refused; NCCL_SHRINK_ABORT revokes first. */
    EXPECT(ncclCommRevoke(shrunk, 1), ncclInvalidArgument);
    EXPECT(ncclCommRevoke(shrunk, NCCL_REVOKE_DEFAULT), ncclSuccess);
    EXPECT(ncclAllReduce(a, b, 16, ncclFloat, ncclSum, shrunk, s), ncclInvalidUsage);
    CHECK(strstr(ncclGetLastError(shrunk), "revoked") != NULL);
    EXPECT(ncclCommShrink(shrunk, none, 0, &nc, NULL, NCCL_SHRINK_ABORT), ncclSuccess);
    EXPECT(ncclAllReduce(a, b, 16, ncclFloat, ncclSum, nc, s), ncclSuccess); SAME(16);
    EXPECT(ncclCommDestroy(nc), ncclSuccess);
    EXPECT(ncclCommDestroy(shrunk), ncclSuccess);
  }

  /* Not implemented: ncclInvalidUsage. */
  {
    int len = 0;
    uint64_t u64 = 0;
    int8_t i8; int16_t i16; int32_t i32; int64_t i64; uint8_t u8; uint16_t u16; uint32_t u32;
    const char* str = NULL;
    const char** table = NULL;
    ncclParamHandle_t ph = NULL;
    ncclWaitSignalDesc_t d = {1, 0, 0, 0};
    ncclEncryptionConfig_t ec = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
    ncclSimInfo_t si = NCCL_SIM_INFO_INITIALIZER;
    EXPECT(ncclCommSuspend(comm, NCCL_SUSPEND_MEM), ncclInvalidUsage);
    /* NVIDIA's library would accept it: its refusal shows that mscclpp-rs's library answered. */
    CHECK(strstr(ncclGetLastError(comm), "mscclpp-rs") != NULL);
    EXPECT(ncclCommResume(comm), ncclInvalidUsage);
    EXPECT(ncclCommMemStats(comm, ncclStatGpuMemTotal, &u64), ncclInvalidUsage);
    /* One-sided calls (served, see tests/one_sided.rs): a window taken back, this rank as the
       peer, a signal index out of range are refused. */
    EXPECT(ncclPutSignal(a, 1, ncclFloat, 0, w, 0, 0, 0, 0, comm, s), ncclInvalidArgument);
    EXPECT(ncclSignal(0, 0, 0, 0, comm, s), ncclInvalidUsage);
    EXPECT(ncclWaitSignal(1, &d, comm, s), ncclInvalidUsage);
    d.sigIdx = 1000;
    EXPECT(ncclWaitSignal(1, &d, comm, s), ncclInvalidArgument);
    EXPECT(ncclSetEncryption(&ec), ncclInvalidUsage);
    EXPECT(ncclParamBind(&ph, "NCCL_PROTO"), ncclInvalidUsage);
    EXPECT(ncclParamGetI8(ph, &i8), ncclInvalidUsage);
    EXPECT(ncclParamGetI16(ph, &i16), ncclInvalidUsage);
    EXPECT(ncclParamGetI32(ph, &i32), ncclInvalidUsage);
    EXPECT(ncclParamGetI64(ph, &i64), ncclInvalidUsage);
    EXPECT(ncclParamGetU8(ph, &u8), ncclInvalidUsage);
    EXPECT(ncclParamGetU16(ph, &u16), ncclInvalidUsage);
    EXPECT(ncclParamGetU32(ph, &u32), ncclInvalidUsage);
    EXPECT(ncclParamGetU64(ph, &u64), ncclInvalidUsage);
    EXPECT(ncclParamGetStr(ph, &str), ncclInvalidUsage);
    EXPECT(ncclParamGet(ph, &u64, 8, &len), ncclInvalidUsage);
    EXPECT(ncclParamGetParameter("NCCL_PROTO", &str, &len), ncclInvalidUsage);
    EXPECT(ncclParamGetAllParameterKeys(&table, &len), ncclInvalidUsage);
    ncclParamDumpAll();
    ncclResetDebugInit();
    EXPECT(ncclGroupStart(), ncclSuccess);
    EXPECT(ncclGroupSimulateEnd(&si), ncclInvalidUsage);
  }

  EXPECT(ncclCommFinalize(comm), ncclSuccess);
  EXPECT(ncclCommDestroy(comm), ncclSuccess);
  EXPECT(ncclCommAbort(comm2), ncclSuccess);
  EXPECT(ncclCommDestroy(comm3), ncclSuccess);
  EXPECT(ncclCommDestroy(all[0]), ncclSuccess);
  EXPECT(ncclCommDestroy(all[1]), ncclSuccess);
  EXPECT(ncclMemFree(buf), ncclSuccess);
#undef SAME
}

int main(void) {
  size_t n = sizeof(aliases) / sizeof(aliases[0]), i, present = 0;
  values();
  for (i = 0; i < n; i++) present += aliases[i] != NULL;
  printf("aliases %zu of %zu\n", present, n);
  calls();
  printf("failures %d\n", failures);
  return failures == 0 && present == n ? 0 : 1;
}
