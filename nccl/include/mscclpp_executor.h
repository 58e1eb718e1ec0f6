/*
 * mscclpp_executor.h — MSCCL++ execution plans from C, in mscclpp-rs's drop-in libnccl.so.2
 * (nccl/src/executor.rs; the Rust API is mscclpp::executor).
 *
 * A plan is the JSON file MSCCL++'s DSL (mscclpp.language) writes. mscclppExecutionPlanCreate
 * parses it and verifies it across ranks before anything runs: a malformed plan, one that needs
 * NVLink multicast (switch channels), and one that would hang or race are refused with
 * ncclInvalidUsage, and ncclGetLastError() says which field, or which rank, threadblock and op,
 * and why. An executor runs plans on one communicator; every rank makes the same calls in the
 * same order, and the first call with new buffers or sizes sets them up with the peers (not
 * inside ncclGroupStart / ncclGroupEnd, and not under CUDA graph capture; later calls may be
 * captured).
 *
 *   mscclppExecutionPlan_t plan;  mscclppExecutor_t exec;
 *   mscclppExecutionPlanCreate(&plan, "allreduce.json");
 *   mscclppExecutorCreate(&exec, comm);
 *   mscclppExecutorExecute(exec, plan, buf, bytes, buf, bytes, ncclFloat16,
 *                          MSCCLPP_PACKET_LL16, stream);        // an in-place all-reduce
 *   mscclppExecutorDestroy(exec);  mscclppExecutionPlanDestroy(plan);
 *
 * Handles are opaque values from the library's table of live objects: a destroyed or forged
 * one is ncclInvalidArgument. Buffers used by an executor stay registered with the peers until
 * the executor is destroyed.
 */
#ifndef MSCCLPP_EXECUTOR_H_
#define MSCCLPP_EXECUTOR_H_

#include <stddef.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void* mscclppExecutionPlan_t;
typedef void* mscclppExecutor_t;

/* Packet formats of a plan's LL ops (MSCCL++'s PacketType). */
#define MSCCLPP_PACKET_LL16 0 /* 8 payload bytes in 16 (MSCCL++'s default) */
#define MSCCLPP_PACKET_LL8 1  /* 4 payload bytes in 8 */

/* Reads, parses and verifies the plan in the file `path`. */
ncclResult_t mscclppExecutionPlanCreate(mscclppExecutionPlan_t* plan, const char* path);
ncclResult_t mscclppExecutionPlanDestroy(mscclppExecutionPlan_t plan);

/* An executor on the ready communicator `comm` (keeps it alive until destroyed). */
ncclResult_t mscclppExecutorCreate(mscclppExecutor_t* executor, ncclComm_t comm);
/* Waits for the communicator's queued work, then releases the executor's resources. */
ncclResult_t mscclppExecutorDestroy(mscclppExecutor_t executor);

/* Queues one launch of `plan` on `stream`: `send_bytes` at `sendbuff` and `recv_bytes` at
 * `recvbuff` (in place as the plan says: the same buffer for an all-reduce, NCCL's in-place
 * offsets otherwise), elements of `datatype` (reductions: the plan's sum, min or max). */
ncclResult_t mscclppExecutorExecute(mscclppExecutor_t executor, mscclppExecutionPlan_t plan,
                                    const void* sendbuff, size_t send_bytes, void* recvbuff,
                                    size_t recv_bytes, ncclDataType_t datatype, int packet_type,
                                    cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MSCCLPP_EXECUTOR_H_ */
