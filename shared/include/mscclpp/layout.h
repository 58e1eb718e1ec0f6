/*
 * mscclpp/layout.h — the C view of every layout mscclpp-rs shares between host and device.
 *
 * This header mirrors the Rust crate mscclpp-shared (the modules in shared/src) struct for
 * struct and field for field, with the same type names, so that kernels written in CUDA C++
 * (or plain C host code) can read and build the same handles and FIFO elements as the Rust
 * code. The Rust crate is the source of truth: change a struct there first, then here. Two
 * checks keep the two sides equal:
 *   - the _Static_asserts after every struct pin its size, alignment and field offsets;
 *   - shared/tests/c_header.rs compiles a program against this header (as C11 and as C++17)
 *     and compares every size, alignment, offset, constant and helper result with Rust's
 *     `mscclpp_shared::layout` tables.
 *
 * Addresses. Every pointer-like field is a `uint64_t` holding a device virtual address (Rust:
 * `DevicePtr<T>`), with 0 meaning null. The comment on each field says what it points at and
 * where that memory lives. On a GPU the address is valid in the device's (unified) address
 * space; on the CPU backend device addresses are ordinary addresses of the process. The
 * host-to-host semaphore is the one exception: its words are host memory.
 *
 * ProxyTrigger bit layout (the 16-byte element a GPU thread pushes to the host proxy). Two
 * little-endian 64-bit words, `fst` then `snd`; bit 0 is the least significant bit:
 *
 *   word  bits     field           meaning
 *   fst   0..32    size            bytes to copy (DATA)
 *   fst   32..64   src_offset      byte offset into the source memory
 *   snd   0..32    dst_offset      byte offset into the destination memory
 *   snd   32..41   src_memory_id   proxy-local id of a registered memory (9 bits, < 512)
 *   snd   41..50   dst_memory_id   same, for the destination
 *   snd   50..53   type            a set of DATA (1), FLAG (2, signal), SYNC (4, flush)
 *   snd   53..63   semaphore_id    proxy-local semaphore/channel id (10 bits, < 1024)
 *   snd   63       commit bit      FIFO lap parity; set by the FIFO push, never by the caller
 *
 * This is the bit layout MSCCL++ uses. What differs is that nothing is ever masked to fit: a
 * transfer larger than 32 bits of size is split into several triggers before packing,
 * mscclpp_trigger_pack() below refuses values that do not fit, and the host proxy checks
 * every field again and rejects (with a sticky error) any trigger naming memory, offsets or
 * semaphores that were not registered.
 *
 * The commit bit of the trigger pushed at FIFO position `pos` is ((pos >> log2(N)) & 1) ^ 1
 * for a FIFO of N slots, so an all-zero slot never looks committed and slots never need to be
 * cleared; the whole trigger is published with one 16-byte store, so a reader never sees half
 * of it. See shared/src/fifo.rs for the full protocol.
 */
#ifndef MSCCLPP_LAYOUT_H_
#define MSCCLPP_LAYOUT_H_

#ifdef __cplusplus
#include <cstddef>
#include <cstdint>
#define MSCCLPP_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#define MSCCLPP_ALIGNAS(n) alignas(n)
#define MSCCLPP_ALIGNOF(type) alignof(type)
#else
#include <stddef.h>
#include <stdint.h>
#define MSCCLPP_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#define MSCCLPP_ALIGNAS(n) _Alignas(n)
#define MSCCLPP_ALIGNOF(type) _Alignof(type)
#endif

/* Helpers below are callable from host code and, under nvcc or hipcc, from device code. */
#if defined(__CUDACC__) || defined(__HIPCC__)
#define MSCCLPP_INLINE static inline __host__ __device__
#else
#define MSCCLPP_INLINE static inline
#endif

/* Layout checks used after every struct (the expected numbers are Rust's). */
#define MSCCLPP_CHECK_LAYOUT(type, size, align)                                        \
  MSCCLPP_STATIC_ASSERT(sizeof(type) == (size), "sizeof(" #type ") differs from Rust");   \
  MSCCLPP_STATIC_ASSERT(MSCCLPP_ALIGNOF(type) == (align),                               \
                        "alignof(" #type ") differs from Rust")
#define MSCCLPP_CHECK_OFFSET(type, field, offset)            \
  MSCCLPP_STATIC_ASSERT(offsetof(type, field) == (offset), \
                        "offsetof(" #type ", " #field ") differs from Rust")

/* ---------------------------------------------------------------------------------------- */
/* Constants                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* Widths of the trigger fields, in bits. */
#define MSCCLPP_TRIGGER_SIZE_BITS 32
#define MSCCLPP_TRIGGER_OFFSET_BITS 32
#define MSCCLPP_TRIGGER_MEMORY_ID_BITS 9
#define MSCCLPP_TRIGGER_TYPE_BITS 3
#define MSCCLPP_TRIGGER_SEMAPHORE_ID_BITS 10

/* Bit positions of the trigger fields inside their word (size and dst_offset start at bit 0). */
#define MSCCLPP_TRIGGER_SRC_OFFSET_SHIFT 32    /* in fst */
#define MSCCLPP_TRIGGER_SRC_MEMORY_ID_SHIFT 32 /* in snd */
#define MSCCLPP_TRIGGER_DST_MEMORY_ID_SHIFT 41 /* in snd */
#define MSCCLPP_TRIGGER_TYPE_SHIFT 50          /* in snd */
#define MSCCLPP_TRIGGER_SEMAPHORE_ID_SHIFT 53  /* in snd */
#define MSCCLPP_TRIGGER_COMMIT_SHIFT 63        /* in snd */

/* Largest value each field holds. */
#define MSCCLPP_TRIGGER_MAX_SIZE ((1ULL << MSCCLPP_TRIGGER_SIZE_BITS) - 1)
#define MSCCLPP_TRIGGER_MAX_OFFSET ((1ULL << MSCCLPP_TRIGGER_OFFSET_BITS) - 1)
#define MSCCLPP_TRIGGER_MAX_MEMORY_ID ((1ULL << MSCCLPP_TRIGGER_MEMORY_ID_BITS) - 1)
#define MSCCLPP_TRIGGER_MAX_TYPE ((1ULL << MSCCLPP_TRIGGER_TYPE_BITS) - 1)
#define MSCCLPP_TRIGGER_MAX_SEMAPHORE_ID ((1ULL << MSCCLPP_TRIGGER_SEMAPHORE_ID_BITS) - 1)

/* Trigger type bits; combine with `|`. */
#define MSCCLPP_TRIGGER_DATA 1ULL /* copy size bytes from src to dst */
#define MSCCLPP_TRIGGER_FLAG 2ULL /* signal semaphore_id after earlier work */
#define MSCCLPP_TRIGGER_SYNC 4ULL /* flush: complete the flush position after earlier work */

/* Number of FIFO slots unless the host asks for another power of two. */
#define MSCCLPP_DEFAULT_FIFO_SIZE 512u

/* DeviceStatus.error_code values (the first error any device thread recorded). */
#define MSCCLPP_DEVICE_ERROR_NONE 0u
#define MSCCLPP_DEVICE_ERROR_ABORTED 1u          /* the host set the abort flag */
#define MSCCLPP_DEVICE_ERROR_TIMEOUT 2u          /* a wait spun more than spin_limit times */
#define MSCCLPP_DEVICE_ERROR_INVALID_ARGUMENT 3u /* a device API call got a value it cannot serve */
#define MSCCLPP_DEVICE_ERROR_COUNT_MISMATCH 4u    /* a p2p receive got another byte count */
/* COUNT_MISMATCH's error_detail: sending peer in bits 44..56, its byte count in bits 0..44. */
#define MSCCLPP_COUNT_MISMATCH_BYTES_BITS 44

/* CollectiveParams.dtype, .op and .mode (shared/src/kernel_params.rs). */
#define MSCCLPP_DTYPE_F32 0u
#define MSCCLPP_DTYPE_F16 1u
#define MSCCLPP_DTYPE_BF16 2u
#define MSCCLPP_DTYPE_I32 3u
#define MSCCLPP_DTYPE_U32 4u
#define MSCCLPP_DTYPE_I8 5u
#define MSCCLPP_DTYPE_U8 6u
#define MSCCLPP_DTYPE_I64 7u
#define MSCCLPP_DTYPE_U64 8u
#define MSCCLPP_DTYPE_F64 9u
#define MSCCLPP_DTYPE_F8E4M3 10u /* __nv_fp8_e4m3 */
#define MSCCLPP_DTYPE_F8E5M2 11u /* __nv_fp8_e5m2 */
#define MSCCLPP_OP_SUM 0u
#define MSCCLPP_OP_MIN 1u
#define MSCCLPP_OP_MAX 2u
#define MSCCLPP_OP_PROD 3u
#define MSCCLPP_OP_PRE_MUL_SUM 4u  /* each contribution times the scalar, then summed */
#define MSCCLPP_OP_SUM_POST_DIV 5u /* integers: summed, then divided by the scalar */
#define MSCCLPP_MODE_ALL_REDUCE 0u
#define MSCCLPP_MODE_ALL_GATHER 1u
#define MSCCLPP_MODE_REDUCE_SCATTER 2u
#define MSCCLPP_MODE_BROADCAST 3u
#define MSCCLPP_MODE_ALL_TO_ALL 4u
#define MSCCLPP_MODE_SEND 5u
#define MSCCLPP_MODE_RECV 6u
#define MSCCLPP_MODE_ALL_REDUCE_PUT 7u
#define MSCCLPP_MODE_BARRIER 8u
/* 9 (reduce-chunk) is retired and not reused. */
#define MSCCLPP_MODE_REDUCE_LOCAL 10u
#define MSCCLPP_MODE_REDUCE 11u /* reduce into the root's output only */
#define MSCCLPP_MAX_DIRECT_RANKS 8u
#define MSCCLPP_REGISTRY_SLOTS 256u
#define MSCCLPP_WINDOW_SLOTS 64u
#define MSCCLPP_MAX_PORT_RANKS 64u

/* The point-to-point engine (shared/src/p2p.rs). */
#define MSCCLPP_P2P_MAX_OPS 16u
#define MSCCLPP_P2P_MAX_LANES 8u
#define MSCCLPP_P2P_SEND 0u
#define MSCCLPP_P2P_RECV 1u

/* The plan interpreter (shared/src/executor.rs). */
#define MSCCLPP_EXEC_MAX_OPS 64u
#define MSCCLPP_EXEC_MAX_CHANNELS 16u
#define MSCCLPP_EXEC_MAX_REMOTE_BUFFERS 16u
#define MSCCLPP_EXEC_MAX_OP_BUFFERS 10u
#define MSCCLPP_EXEC_MAX_OP_IDS 16u
#define MSCCLPP_EXEC_PLAN_BARRIERS 16u
#define MSCCLPP_EXEC_MAX_GROUPS 16u
#define MSCCLPP_EXEC_MAX_BARRIERS 32u /* the plan's, then the threadblock groups' */
#define MSCCLPP_EXEC_MAX_SEMAPHORES 16u
#define MSCCLPP_EXEC_BUF_INPUT 0u
#define MSCCLPP_EXEC_BUF_OUTPUT 1u
#define MSCCLPP_EXEC_BUF_SCRATCH 2u
#define MSCCLPP_EXEC_BUF_MEMORY 3u /* a peer's buffer reached through memory */
#define MSCCLPP_EXEC_BUF_PORT 4u   /* a peer's buffer reached through the proxy */
#define MSCCLPP_EXEC_CHANNEL_NONE 0u
#define MSCCLPP_EXEC_CHANNEL_MEMORY 1u
#define MSCCLPP_EXEC_CHANNEL_PORT 2u
#define MSCCLPP_EXEC_PACKET_LL16 0u
#define MSCCLPP_EXEC_PACKET_LL8 1u

/* DeviceStatus.error_detail: the wait site in the top byte, the watched address below it. */
#define MSCCLPP_ERROR_DETAIL_SITE_SHIFT 56
#define MSCCLPP_WAIT_SITE_UNKNOWN 0u
#define MSCCLPP_WAIT_SITE_FIFO_PUSH 1u    /* FIFO push waiting for a free slot */
#define MSCCLPP_WAIT_SITE_FIFO_SYNC 2u    /* FIFO flush waiting for the proxy */
#define MSCCLPP_WAIT_SITE_SEMAPHORE 3u    /* semaphore wait */
#define MSCCLPP_WAIT_SITE_PACKET 4u       /* LL packet flag wait */
#define MSCCLPP_WAIT_SITE_GRID_BARRIER 5u /* grid-wide barrier */

/* IpcMemHandle.kind values. */
#define MSCCLPP_IPC_KIND_CUDA 1u /* cuda holds a CUipcMemHandle of the whole allocation */
#define MSCCLPP_IPC_KIND_CPU 2u  /* CPU backend: a memfd of the owner process */

/* ---------------------------------------------------------------------------------------- */
/* FIFO element                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* One FIFO slot (shared/src/trigger.rs). Bit fields are described at the top of this file. */
typedef struct ProxyTrigger {
  MSCCLPP_ALIGNAS(16) uint64_t fst; /* size | src_offset << 32 */
  uint64_t snd; /* dst_offset | src_memory_id << 32 | dst_memory_id << 41 | type << 50
                   | semaphore_id << 53 | commit << 63 */
} ProxyTrigger;
MSCCLPP_CHECK_LAYOUT(ProxyTrigger, 16, 16);
MSCCLPP_CHECK_OFFSET(ProxyTrigger, fst, 0);
MSCCLPP_CHECK_OFFSET(ProxyTrigger, snd, 8);

/* ---------------------------------------------------------------------------------------- */
/* Status                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Abort flag and first-error record (shared/src/status.rs); host-pinned, device-mapped. */
typedef struct DeviceStatus {
  MSCCLPP_ALIGNAS(8) uint32_t abort; /* non-zero: every device wait stops (host writes) */
  uint32_t error_code;               /* first MSCCLPP_DEVICE_ERROR_* recorded, by CAS from 0 */
  uint64_t error_detail;             /* see mscclpp_error_detail() */
  uint64_t spin_limit;               /* spins before a wait records TIMEOUT; 0 = abort only */
  uint64_t reserved;                 /* zero */
} DeviceStatus;
MSCCLPP_CHECK_LAYOUT(DeviceStatus, 32, 8);
MSCCLPP_CHECK_OFFSET(DeviceStatus, abort, 0);
MSCCLPP_CHECK_OFFSET(DeviceStatus, error_code, 4);
MSCCLPP_CHECK_OFFSET(DeviceStatus, error_detail, 8);
MSCCLPP_CHECK_OFFSET(DeviceStatus, spin_limit, 16);
MSCCLPP_CHECK_OFFSET(DeviceStatus, reserved, 24);

/* ---------------------------------------------------------------------------------------- */
/* FIFO                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* The device's view of one proxy FIFO (shared/src/fifo.rs). */
typedef struct FifoDeviceHandle {
  MSCCLPP_ALIGNAS(8) uint64_t triggers; /* ProxyTrigger[size]; host-pinned, device-mapped */
  uint64_t tail;                        /* uint64_t consumer position; host-pinned, device-mapped */
  uint64_t head;                        /* uint64_t producer position counter; device memory */
  uint64_t tail_cache;                  /* uint64_t producers' last seen tail; device memory */
  uint64_t flush_done_pos;              /* uint64_t completed flush position; host-pinned, mapped */
  uint64_t status;                      /* DeviceStatus for waits on this FIFO */
  uint32_t size;                        /* N, a power of two */
  uint32_t log2_size;                   /* log2(N) */
} FifoDeviceHandle;
MSCCLPP_CHECK_LAYOUT(FifoDeviceHandle, 56, 8);
MSCCLPP_CHECK_OFFSET(FifoDeviceHandle, triggers, 0);
MSCCLPP_CHECK_OFFSET(FifoDeviceHandle, tail, 8);
MSCCLPP_CHECK_OFFSET(FifoDeviceHandle, head, 16);
MSCCLPP_CHECK_OFFSET(FifoDeviceHandle, tail_cache, 24);
MSCCLPP_CHECK_OFFSET(FifoDeviceHandle, flush_done_pos, 32);
MSCCLPP_CHECK_OFFSET(FifoDeviceHandle, status, 40);
MSCCLPP_CHECK_OFFSET(FifoDeviceHandle, size, 48);
MSCCLPP_CHECK_OFFSET(FifoDeviceHandle, log2_size, 52);

/* ---------------------------------------------------------------------------------------- */
/* Semaphores (shared/src/semaphore.rs): monotonic uint64_t tokens, never reset               */
/* ---------------------------------------------------------------------------------------- */

/* Between two GPUs that map each other's memory (MemoryChannel). */
typedef struct MemoryDevice2DeviceSemaphoreDeviceHandle {
  MSCCLPP_ALIGNAS(8) uint64_t inbound; /* uint64_t tokens the peer adds to; local device memory */
  uint64_t remote_inbound;             /* the peer's inbound, mapped into this GPU */
  uint64_t expected;                   /* uint64_t tokens consumed here; local device memory */
  uint64_t status;                     /* DeviceStatus for this side's waits */
} MemoryDevice2DeviceSemaphoreDeviceHandle;
MSCCLPP_CHECK_LAYOUT(MemoryDevice2DeviceSemaphoreDeviceHandle, 32, 8);
MSCCLPP_CHECK_OFFSET(MemoryDevice2DeviceSemaphoreDeviceHandle, inbound, 0);
MSCCLPP_CHECK_OFFSET(MemoryDevice2DeviceSemaphoreDeviceHandle, remote_inbound, 8);
MSCCLPP_CHECK_OFFSET(MemoryDevice2DeviceSemaphoreDeviceHandle, expected, 16);
MSCCLPP_CHECK_OFFSET(MemoryDevice2DeviceSemaphoreDeviceHandle, status, 24);

/* Signalled by a host proxy through a connection, waited on by a GPU (PortChannel). */
typedef struct Host2DeviceSemaphoreDeviceHandle {
  MSCCLPP_ALIGNAS(8) uint64_t inbound; /* uint64_t tokens the peer's proxy writes; device memory */
  uint64_t expected;                   /* uint64_t tokens consumed by this GPU; device memory */
  uint64_t status;                     /* DeviceStatus for this side's waits */
} Host2DeviceSemaphoreDeviceHandle;
MSCCLPP_CHECK_LAYOUT(Host2DeviceSemaphoreDeviceHandle, 24, 8);
MSCCLPP_CHECK_OFFSET(Host2DeviceSemaphoreDeviceHandle, inbound, 0);
MSCCLPP_CHECK_OFFSET(Host2DeviceSemaphoreDeviceHandle, expected, 8);
MSCCLPP_CHECK_OFFSET(Host2DeviceSemaphoreDeviceHandle, status, 16);

/* Between two host threads or processes; both words are host memory. */
typedef struct Host2HostSemaphoreHandle {
  MSCCLPP_ALIGNAS(8) uint64_t inbound; /* uint64_t tokens the peer writes */
  uint64_t expected;                   /* uint64_t tokens consumed here */
} Host2HostSemaphoreHandle;
MSCCLPP_CHECK_LAYOUT(Host2HostSemaphoreHandle, 16, 8);
MSCCLPP_CHECK_OFFSET(Host2HostSemaphoreHandle, inbound, 0);
MSCCLPP_CHECK_OFFSET(Host2HostSemaphoreHandle, expected, 8);

/* ---------------------------------------------------------------------------------------- */
/* Channels                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* One GPU thread drives a proxy-backed channel (shared/src/port_channel.rs). */
typedef struct PortChannelDeviceHandle {
  MSCCLPP_ALIGNAS(8) uint32_t semaphore_id;   /* proxy-local semaphore/connection id, < 1024 */
  uint32_t dst;                               /* proxy-local id of the remote memory, < 512 */
  uint32_t src;                               /* proxy-local id of the local memory, < 512 */
  uint32_t reserved;                          /* zero */
  Host2DeviceSemaphoreDeviceHandle semaphore; /* the peer's proxy signals, this GPU waits */
  FifoDeviceHandle fifo;                      /* the FIFO to the local proxy */
} PortChannelDeviceHandle;
MSCCLPP_CHECK_LAYOUT(PortChannelDeviceHandle, 96, 8);
MSCCLPP_CHECK_OFFSET(PortChannelDeviceHandle, semaphore_id, 0);
MSCCLPP_CHECK_OFFSET(PortChannelDeviceHandle, dst, 4);
MSCCLPP_CHECK_OFFSET(PortChannelDeviceHandle, src, 8);
MSCCLPP_CHECK_OFFSET(PortChannelDeviceHandle, reserved, 12);
MSCCLPP_CHECK_OFFSET(PortChannelDeviceHandle, semaphore, 16);
MSCCLPP_CHECK_OFFSET(PortChannelDeviceHandle, fifo, 40);

/* GPU threads load and store the peer's memory directly (shared/src/memory_channel.rs). */
typedef struct MemoryChannelDeviceHandle {
  /* Signal/wait with the peer. */
  MSCCLPP_ALIGNAS(8) MemoryDevice2DeviceSemaphoreDeviceHandle semaphore;
  uint64_t dst;           /* the peer's registered memory, mapped here */
  uint64_t src;           /* local registered memory */
  uint64_t packet_buffer; /* local buffer the peer writes LL packets into; may be 0 */
} MemoryChannelDeviceHandle;
MSCCLPP_CHECK_LAYOUT(MemoryChannelDeviceHandle, 56, 8);
MSCCLPP_CHECK_OFFSET(MemoryChannelDeviceHandle, semaphore, 0);
MSCCLPP_CHECK_OFFSET(MemoryChannelDeviceHandle, dst, 32);
MSCCLPP_CHECK_OFFSET(MemoryChannelDeviceHandle, src, 40);
MSCCLPP_CHECK_OFFSET(MemoryChannelDeviceHandle, packet_buffer, 48);

/* ---------------------------------------------------------------------------------------- */
/* LL packets (shared/src/packet.rs): data and flag written by one store                    */
/* ---------------------------------------------------------------------------------------- */

/* Valid when flag1 and flag2 both equal the expected flag; written with one 16-byte store. */
typedef struct LL16Packet {
  MSCCLPP_ALIGNAS(16) uint32_t data1;
  uint32_t flag1;
  uint32_t data2;
  uint32_t flag2;
} LL16Packet;
MSCCLPP_CHECK_LAYOUT(LL16Packet, 16, 16);
MSCCLPP_CHECK_OFFSET(LL16Packet, data1, 0);
MSCCLPP_CHECK_OFFSET(LL16Packet, flag1, 4);
MSCCLPP_CHECK_OFFSET(LL16Packet, data2, 8);
MSCCLPP_CHECK_OFFSET(LL16Packet, flag2, 12);

/* Valid when flag equals the expected flag; written with one 8-byte store. */
typedef struct LL8Packet {
  MSCCLPP_ALIGNAS(8) uint32_t data;
  uint32_t flag;
} LL8Packet;
MSCCLPP_CHECK_LAYOUT(LL8Packet, 8, 8);
MSCCLPP_CHECK_OFFSET(LL8Packet, data, 0);
MSCCLPP_CHECK_OFFSET(LL8Packet, flag, 4);

/* LL128 lines (packet::ll128): 128 bytes, 120 data + an 8-byte flag (two u32 equal to the
 * expected flag), written by 8 lanes of a warp with one 16-byte store each. A warp step is 4
 * lines carrying 480 data bytes: lane l writes bytes 16*(l%8) of line l/8; data lanes take 16
 * contiguous bytes of the step each (in lane order), flag lanes (l%8 == 7) 8 bytes of the last 32. */
#define MSCCLPP_LL128_LINE_BYTES 128u
#define MSCCLPP_LL128_LINE_DATA_BYTES 120u
#define MSCCLPP_LL128_LANES_PER_LINE 8u
#define MSCCLPP_LL128_WARP_DATA_BYTES 480u

/* ---------------------------------------------------------------------------------------- */
/* Trace (shared/src/trace.rs)                                                              */
/* ---------------------------------------------------------------------------------------- */

/* Block events: slot MSCCLPP_TRACE_EVENT_* of a launch record (one record per launch in each
 * block's ring; mscclpp_trace_event_slot gives the index). Thread 0 of the block writes
 * time_ns, then the tag word, with plain stores; the host reads them after the launch. */
#define MSCCLPP_TRACE_EVENTS_PER_LAUNCH 4u
#define MSCCLPP_TRACE_EVENT_START 0u /* thread 0 entered the kernel */
#define MSCCLPP_TRACE_EVENT_SEND 1u  /* thread 0 starts moving data to a peer */
#define MSCCLPP_TRACE_EVENT_RECV 2u  /* thread 0's last wait for peer data completed */
#define MSCCLPP_TRACE_EVENT_END 3u   /* thread 0 left the kernel */

typedef struct TraceEvent {
  MSCCLPP_ALIGNAS(8) uint64_t time_ns; /* %globaltimer (CPU backend: CLOCK_MONOTONIC) */
  uint32_t launch;                     /* TraceDeviceHandle.launch; 0: never written */
  uint16_t kind;                       /* MSCCLPP_TRACE_EVENT_* */
  uint16_t block;                      /* blockIdx.x */
} TraceEvent;
MSCCLPP_CHECK_LAYOUT(TraceEvent, 16, 8);
MSCCLPP_CHECK_OFFSET(TraceEvent, time_ns, 0);
MSCCLPP_CHECK_OFFSET(TraceEvent, launch, 8);
MSCCLPP_CHECK_OFFSET(TraceEvent, kind, 12);
MSCCLPP_CHECK_OFFSET(TraceEvent, block, 14);

/* Where a traced kernel writes its block events; events == 0: tracing off (check it first and
 * do nothing else). Blocks >= rings record nothing. */
typedef struct TraceDeviceHandle {
  MSCCLPP_ALIGNAS(8) uint64_t events; /* TraceEvent[rings << log2_records][4] */
  uint32_t launch;                    /* this launch's id, from 1 */
  uint32_t log2_records;              /* launch records per ring, log2 */
  uint32_t rings;
  uint32_t reserved; /* zero */
} TraceDeviceHandle;
MSCCLPP_CHECK_LAYOUT(TraceDeviceHandle, 24, 8);
MSCCLPP_CHECK_OFFSET(TraceDeviceHandle, events, 0);
MSCCLPP_CHECK_OFFSET(TraceDeviceHandle, launch, 8);
MSCCLPP_CHECK_OFFSET(TraceDeviceHandle, log2_records, 12);
MSCCLPP_CHECK_OFFSET(TraceDeviceHandle, rings, 16);
MSCCLPP_CHECK_OFFSET(TraceDeviceHandle, reserved, 20);

/* The index into TraceDeviceHandle.events of event `kind` of launch `launch` of block `block`. */
MSCCLPP_INLINE uint64_t mscclpp_trace_event_slot(uint32_t block, uint32_t launch, uint32_t kind,
                                                 uint32_t log2_records) {
  uint64_t record = (uint64_t)launch & ((1ull << log2_records) - 1);
  return (((uint64_t)block << log2_records) + record) * MSCCLPP_TRACE_EVENTS_PER_LAUNCH + kind;
}

/* trace_clock_kernel: one thread answers `rounds` host pings with its clock. words (host-mapped,
 * 2 + rounds u64): [0] pings (host), [1] answers (device, release), [2 + i] device time of i. */
typedef struct TraceClockParams {
  MSCCLPP_ALIGNAS(8) uint64_t status; /* DeviceStatus */
  uint64_t words;
  uint32_t rounds;
  uint32_t reserved; /* zero */
} TraceClockParams;
MSCCLPP_CHECK_LAYOUT(TraceClockParams, 24, 8);
MSCCLPP_CHECK_OFFSET(TraceClockParams, status, 0);
MSCCLPP_CHECK_OFFSET(TraceClockParams, words, 8);
MSCCLPP_CHECK_OFFSET(TraceClockParams, rounds, 16);
MSCCLPP_CHECK_OFFSET(TraceClockParams, reserved, 20);

/* ---------------------------------------------------------------------------------------- */
/* Kernel parameters (shared/src/kernel_params.rs): each kernel takes one of these by value  */
/* ---------------------------------------------------------------------------------------- */

/* copy_kernel: grid-stride copy of `bytes` bytes. */
typedef struct CopyParams {
  MSCCLPP_ALIGNAS(8) uint64_t status; /* DeviceStatus */
  uint64_t dst;                       /* uint8_t[bytes], local or peer-mapped */
  uint64_t src;                       /* uint8_t[bytes] */
  uint64_t bytes;
} CopyParams;
MSCCLPP_CHECK_LAYOUT(CopyParams, 32, 8);
MSCCLPP_CHECK_OFFSET(CopyParams, status, 0);
MSCCLPP_CHECK_OFFSET(CopyParams, dst, 8);
MSCCLPP_CHECK_OFFSET(CopyParams, src, 16);
MSCCLPP_CHECK_OFFSET(CopyParams, bytes, 24);

/* block_sum_kernel: block b writes output[b] = sum of input[b*n .. (b+1)*n]. */
typedef struct BlockSumParams {
  MSCCLPP_ALIGNAS(8) uint64_t status; /* DeviceStatus */
  uint64_t input;                     /* uint32_t[grid_dim * n_per_block] */
  uint64_t output;                    /* uint32_t[grid_dim] */
  uint32_t n_per_block;
  uint32_t reserved; /* zero */
} BlockSumParams;
MSCCLPP_CHECK_LAYOUT(BlockSumParams, 32, 8);
MSCCLPP_CHECK_OFFSET(BlockSumParams, status, 0);
MSCCLPP_CHECK_OFFSET(BlockSumParams, input, 8);
MSCCLPP_CHECK_OFFSET(BlockSumParams, output, 16);
MSCCLPP_CHECK_OFFSET(BlockSumParams, n_per_block, 24);
MSCCLPP_CHECK_OFFSET(BlockSumParams, reserved, 28);

/* block_vote_kernel: thread g = b * block_dim + t votes input[g] != 0 and writes
 * output[4g .. 4g + 4] = (or, and, count, dynamic shared memory size). */
typedef struct BlockVoteParams {
  MSCCLPP_ALIGNAS(8) uint64_t status; /* DeviceStatus */
  uint64_t input;                     /* uint32_t[grid_dim * block_dim] */
  uint64_t output;                    /* uint32_t[4 * grid_dim * block_dim] */
} BlockVoteParams;
MSCCLPP_CHECK_LAYOUT(BlockVoteParams, 24, 8);
MSCCLPP_CHECK_OFFSET(BlockVoteParams, status, 0);
MSCCLPP_CHECK_OFFSET(BlockVoteParams, input, 8);
MSCCLPP_CHECK_OFFSET(BlockVoteParams, output, 16);

/* fifo_push_kernel: every thread pushes per_thread DATA triggers. */
typedef struct FifoPushParams {
  MSCCLPP_ALIGNAS(8) uint64_t status; /* DeviceStatus */
  FifoDeviceHandle fifo;
  uint32_t per_thread;
  uint32_t reserved; /* zero */
} FifoPushParams;
MSCCLPP_CHECK_LAYOUT(FifoPushParams, 72, 8);
MSCCLPP_CHECK_OFFSET(FifoPushParams, status, 0);
MSCCLPP_CHECK_OFFSET(FifoPushParams, fifo, 8);
MSCCLPP_CHECK_OFFSET(FifoPushParams, per_thread, 64);
MSCCLPP_CHECK_OFFSET(FifoPushParams, reserved, 68);

/* Ping-pong test and benchmark kernels (memory_ping_pong_kernel, packet_ping_pong_kernel). */
typedef struct PingPongParams {
  MSCCLPP_ALIGNAS(8) uint64_t status; /* DeviceStatus */
  MemoryChannelDeviceHandle channel;
  uint64_t bytes;
  uint32_t iterations;
  uint32_t role;      /* 0: send first; 1: answer */
  uint32_t flag_base; /* added to every packet flag */
  uint32_t reserved;  /* zero */
} PingPongParams;
MSCCLPP_CHECK_LAYOUT(PingPongParams, 88, 8);
MSCCLPP_CHECK_OFFSET(PingPongParams, status, 0);
MSCCLPP_CHECK_OFFSET(PingPongParams, channel, 8);
MSCCLPP_CHECK_OFFSET(PingPongParams, bytes, 64);
MSCCLPP_CHECK_OFFSET(PingPongParams, iterations, 72);
MSCCLPP_CHECK_OFFSET(PingPongParams, role, 76);
MSCCLPP_CHECK_OFFSET(PingPongParams, flag_base, 80);
MSCCLPP_CHECK_OFFSET(PingPongParams, reserved, 84);

/* PortChannel ping-pong (port_ping_pong_kernel). */
typedef struct PortPingPongParams {
  MSCCLPP_ALIGNAS(8) uint64_t status; /* DeviceStatus */
  PortChannelDeviceHandle channel;
  uint64_t bytes;
  uint32_t iterations;
  uint32_t role;     /* 0: send first; 1: answer */
  uint32_t flush;    /* non-zero: flush after every put */
  uint32_t reserved; /* zero */
  TraceDeviceHandle trace; /* events == 0: not traced */
} PortPingPongParams;
MSCCLPP_CHECK_LAYOUT(PortPingPongParams, 152, 8);
MSCCLPP_CHECK_OFFSET(PortPingPongParams, status, 0);
MSCCLPP_CHECK_OFFSET(PortPingPongParams, channel, 8);
MSCCLPP_CHECK_OFFSET(PortPingPongParams, bytes, 104);
MSCCLPP_CHECK_OFFSET(PortPingPongParams, iterations, 112);
MSCCLPP_CHECK_OFFSET(PortPingPongParams, role, 116);
MSCCLPP_CHECK_OFFSET(PortPingPongParams, flush, 120);
MSCCLPP_CHECK_OFFSET(PortPingPongParams, reserved, 124);
MSCCLPP_CHECK_OFFSET(PortPingPongParams, trace, 128);

/* Collective kernels (ll_collective_kernel, staged_collective_kernel). */
typedef struct CollectiveParams {
  MSCCLPP_ALIGNAS(8) uint64_t status; /* DeviceStatus */
  uint64_t channels;      /* max_blocks * nranks MemoryChannelDeviceHandle */
  uint64_t input;
  uint64_t output;
  uint64_t scratch;
  uint64_t bytes;
  uint64_t ll_flags;      /* u64[4]: last completed LL flag, blocks that read it, gate word */
  uint64_t ll_slot_bytes;
  uint64_t stage_offset;
  uint64_t stride;
  uint32_t gate;          /* 0, or run only if ll_flags[2] holds it */
  uint32_t dtype;         /* MSCCLPP_DTYPE_* */
  uint32_t op;            /* MSCCLPP_OP_* */
  uint32_t mode;          /* CollectiveMode */
  uint32_t rank;
  uint32_t nranks;
  uint32_t root;
  uint32_t max_blocks;
  uint64_t ll128_offset;     /* LL128 region in every scratch buffer: 2 x nranks slots */
  uint64_t ll128_slot_bytes;
  uint64_t scalar;           /* PRE_MUL_SUM: one element of dtype (if !scalar_ptr); SUM_POST_DIV: divisor */
  uint64_t scalar_ptr;       /* PRE_MUL_SUM: the scalar in device memory, or 0 */
  TraceDeviceHandle trace;   /* events == 0: not traced */
} CollectiveParams;
MSCCLPP_CHECK_LAYOUT(CollectiveParams, 168, 8);
MSCCLPP_CHECK_OFFSET(CollectiveParams, status, 0);
MSCCLPP_CHECK_OFFSET(CollectiveParams, channels, 8);
MSCCLPP_CHECK_OFFSET(CollectiveParams, input, 16);
MSCCLPP_CHECK_OFFSET(CollectiveParams, output, 24);
MSCCLPP_CHECK_OFFSET(CollectiveParams, scratch, 32);
MSCCLPP_CHECK_OFFSET(CollectiveParams, bytes, 40);
MSCCLPP_CHECK_OFFSET(CollectiveParams, ll_flags, 48);
MSCCLPP_CHECK_OFFSET(CollectiveParams, ll_slot_bytes, 56);
MSCCLPP_CHECK_OFFSET(CollectiveParams, stage_offset, 64);
MSCCLPP_CHECK_OFFSET(CollectiveParams, stride, 72);
MSCCLPP_CHECK_OFFSET(CollectiveParams, gate, 80);
MSCCLPP_CHECK_OFFSET(CollectiveParams, dtype, 84);
MSCCLPP_CHECK_OFFSET(CollectiveParams, op, 88);
MSCCLPP_CHECK_OFFSET(CollectiveParams, mode, 92);
MSCCLPP_CHECK_OFFSET(CollectiveParams, rank, 96);
MSCCLPP_CHECK_OFFSET(CollectiveParams, nranks, 100);
MSCCLPP_CHECK_OFFSET(CollectiveParams, root, 104);
MSCCLPP_CHECK_OFFSET(CollectiveParams, max_blocks, 108);
MSCCLPP_CHECK_OFFSET(CollectiveParams, ll128_offset, 112);
MSCCLPP_CHECK_OFFSET(CollectiveParams, ll128_slot_bytes, 120);
MSCCLPP_CHECK_OFFSET(CollectiveParams, scalar, 128);
MSCCLPP_CHECK_OFFSET(CollectiveParams, scalar_ptr, 136);
MSCCLPP_CHECK_OFFSET(CollectiveParams, trace, 144);

/* Registered buffers (shared/src/registry.rs). */

/* One of a peer's registrations as mapped here (generation 0: none). */
typedef struct RegistrySlot {
  MSCCLPP_ALIGNAS(8) uint64_t base;
  uint64_t len;
  uint32_t generation;
  uint32_t reserved;
  uint64_t reserved2;
} RegistrySlot;
MSCCLPP_CHECK_LAYOUT(RegistrySlot, 32, 8);
MSCCLPP_CHECK_OFFSET(RegistrySlot, base, 0);
MSCCLPP_CHECK_OFFSET(RegistrySlot, len, 8);
MSCCLPP_CHECK_OFFSET(RegistrySlot, generation, 16);
MSCCLPP_CHECK_OFFSET(RegistrySlot, reserved, 20);
MSCCLPP_CHECK_OFFSET(RegistrySlot, reserved2, 24);

/* A buffer of a call on registered buffers: its owner's slot, generation and offset. */
typedef struct BufferRef {
  MSCCLPP_ALIGNAS(8) uint32_t slot;
  uint32_t generation;
  uint64_t offset;
} BufferRef;
MSCCLPP_CHECK_LAYOUT(BufferRef, 16, 8);
MSCCLPP_CHECK_OFFSET(BufferRef, slot, 0);
MSCCLPP_CHECK_OFFSET(BufferRef, generation, 4);
MSCCLPP_CHECK_OFFSET(BufferRef, offset, 8);

/* What a rank hands each peer at the start of a direct kernel on registered buffers. */
typedef struct RegisteredCall {
  BufferRef input;
  BufferRef output;
  uint64_t call;       /* digest of the call; a peer's that differs refuses the launch */
  uint32_t ok;         /* 0: this rank's buffers do not suit the kernel */
  uint32_t reserved;
  uint64_t reserved2[2];
} RegisteredCall;
MSCCLPP_CHECK_LAYOUT(RegisteredCall, 64, 8);
MSCCLPP_CHECK_OFFSET(RegisteredCall, input, 0);
MSCCLPP_CHECK_OFFSET(RegisteredCall, output, 16);
MSCCLPP_CHECK_OFFSET(RegisteredCall, call, 32);
MSCCLPP_CHECK_OFFSET(RegisteredCall, ok, 40);
MSCCLPP_CHECK_OFFSET(RegisteredCall, reserved, 44);
MSCCLPP_CHECK_OFFSET(RegisteredCall, reserved2, 48);

/* direct_collective_kernel: the callers' own buffers of every rank, mapped here: exchanged by
 * the host (registry null), or registered ahead and resolved by the kernel from the peers'
 * descriptors (registry set; entries q != rank of inputs/outputs ignored). */
typedef struct DirectCollectiveParams {
  CollectiveParams common;                   /* common.scratch: the descriptor area's buffer */
  uint64_t inputs[MSCCLPP_MAX_DIRECT_RANKS];  /* rank q's input as addressed here; null past nranks */
  uint64_t outputs[MSCCLPP_MAX_DIRECT_RANKS]; /* rank q's output as addressed here */
  uint64_t registry;                          /* RegistrySlot[MAX_DIRECT_RANKS][REGISTRY_SLOTS] or 0 */
  uint64_t desc_offset;                       /* descriptor area in every scratch */
  uint64_t need[2];                           /* bytes every input / output must hold */
  uint32_t meet;                              /* send mode, registered: ranks met (bit q) */
  uint32_t decline;                           /* registered: 0, or the gate stored on a decline */
  RegisteredCall mine;                        /* this rank's descriptor */
} DirectCollectiveParams;
MSCCLPP_CHECK_LAYOUT(DirectCollectiveParams, 400, 8);
MSCCLPP_CHECK_OFFSET(DirectCollectiveParams, common, 0);
MSCCLPP_CHECK_OFFSET(DirectCollectiveParams, inputs, 168);
MSCCLPP_CHECK_OFFSET(DirectCollectiveParams, outputs, 232);
MSCCLPP_CHECK_OFFSET(DirectCollectiveParams, registry, 296);
MSCCLPP_CHECK_OFFSET(DirectCollectiveParams, desc_offset, 304);
MSCCLPP_CHECK_OFFSET(DirectCollectiveParams, need, 312);
MSCCLPP_CHECK_OFFSET(DirectCollectiveParams, meet, 328);
MSCCLPP_CHECK_OFFSET(DirectCollectiveParams, decline, 332);
MSCCLPP_CHECK_OFFSET(DirectCollectiveParams, mine, 336);

/* port_collective_kernel: every piece of a collective through PortChannels, in one block. */
typedef struct PortCollectiveParams {
  CollectiveParams common; /* common.channels and the LL fields unused */
  uint64_t port_channels;  /* 2 x nranks PortChannelDeviceHandle: [2q] data, [2q+1] acknowledgement */
  uint64_t counters;       /* 2 x nranks u64: [2q] pieces sent to q, [2q+1] received from q */
  uint64_t send_mask;      /* bit q: this rank sends to q */
  uint64_t recv_mask;      /* bit q: this rank receives from q */
  uint64_t port_offset;    /* nranks send slots, 2 x nranks receive slots, 1 accumulator slot */
  uint64_t slot_bytes;     /* bytes of one slot (a multiple of 16) */
} PortCollectiveParams;
MSCCLPP_CHECK_LAYOUT(PortCollectiveParams, 216, 8);
MSCCLPP_CHECK_OFFSET(PortCollectiveParams, common, 0);
MSCCLPP_CHECK_OFFSET(PortCollectiveParams, port_channels, 168);
MSCCLPP_CHECK_OFFSET(PortCollectiveParams, counters, 176);
MSCCLPP_CHECK_OFFSET(PortCollectiveParams, send_mask, 184);
MSCCLPP_CHECK_OFFSET(PortCollectiveParams, recv_mask, 192);
MSCCLPP_CHECK_OFFSET(PortCollectiveParams, port_offset, 200);
MSCCLPP_CHECK_OFFSET(PortCollectiveParams, slot_bytes, 208);
/* p2p_kernel: sends and receives to any peers, run together. The scratch layout they use is
 * P2pLayout in shared/src/p2p.rs. */
typedef struct P2pOp {
  MSCCLPP_ALIGNAS(8) uint64_t buf; /* input (send) or output (receive); may be 0 if bytes is 0 */
  uint64_t bytes;                  /* this side's byte count */
  uint32_t peer;                   /* never this rank */
  uint32_t kind;                   /* MSCCLPP_P2P_SEND or MSCCLPP_P2P_RECV */
  uint32_t first_block;            /* first block serving it */
  uint32_t blocks;                 /* blocks serving it (lanes i, i + blocks, ...) */
} P2pOp;
MSCCLPP_CHECK_LAYOUT(P2pOp, 32, 8);
MSCCLPP_CHECK_OFFSET(P2pOp, buf, 0);
MSCCLPP_CHECK_OFFSET(P2pOp, bytes, 8);
MSCCLPP_CHECK_OFFSET(P2pOp, peer, 16);
MSCCLPP_CHECK_OFFSET(P2pOp, kind, 20);
MSCCLPP_CHECK_OFFSET(P2pOp, first_block, 24);
MSCCLPP_CHECK_OFFSET(P2pOp, blocks, 28);

typedef struct P2pParams {
  MSCCLPP_ALIGNAS(8) uint64_t status; /* DeviceStatus */
  uint64_t channels;      /* the collectives' channel table (row 0: the peers' scratch) */
  uint64_t scratch;       /* this rank's scratch */
  uint64_t region_offset; /* the point-to-point region in every scratch */
  uint64_t ll_bytes;      /* largest message sent as LL16 packets */
  uint64_t chunk_bytes;   /* chunk of a larger message */
  uint32_t rank;
  uint32_t nranks;
  uint32_t lanes;         /* 1 .. MSCCLPP_P2P_MAX_LANES */
  uint32_t nops;          /* entries of ops in use */
  P2pOp ops[MSCCLPP_P2P_MAX_OPS];
  TraceDeviceHandle trace; /* where the blocks' trace events go; all zero: not traced */
} P2pParams;
MSCCLPP_CHECK_LAYOUT(P2pParams, 600, 8);
MSCCLPP_CHECK_OFFSET(P2pParams, status, 0);
MSCCLPP_CHECK_OFFSET(P2pParams, channels, 8);
MSCCLPP_CHECK_OFFSET(P2pParams, scratch, 16);
MSCCLPP_CHECK_OFFSET(P2pParams, region_offset, 24);
MSCCLPP_CHECK_OFFSET(P2pParams, ll_bytes, 32);
MSCCLPP_CHECK_OFFSET(P2pParams, chunk_bytes, 40);
MSCCLPP_CHECK_OFFSET(P2pParams, rank, 48);
MSCCLPP_CHECK_OFFSET(P2pParams, nranks, 52);
MSCCLPP_CHECK_OFFSET(P2pParams, lanes, 56);
MSCCLPP_CHECK_OFFSET(P2pParams, nops, 60);
MSCCLPP_CHECK_OFFSET(P2pParams, ops, 64);
MSCCLPP_CHECK_OFFSET(P2pParams, trace, 576);

/* The plan interpreter (shared/src/executor.rs): executor_kernel's parameters and the program
 * of one of its blocks, a plan threadblock lowered by the host for one pair of message sizes.
 * The op kinds (ExecOp.kind) are ExecOpKind in that file. */
typedef struct ExecBufRef {
  MSCCLPP_ALIGNAS(8) uint64_t offset; /* bytes into the buffer (packets: where they start) */
  uint8_t kind;                       /* MSCCLPP_EXEC_BUF_* */
  uint8_t slot;                       /* remote buffer slot of the block (MEMORY, PORT) */
  uint8_t packet;                     /* 1: LL packets (in a scratch buffer) */
  uint8_t reserved[5];
} ExecBufRef;
MSCCLPP_CHECK_LAYOUT(ExecBufRef, 16, 8);
MSCCLPP_CHECK_OFFSET(ExecBufRef, offset, 0);
MSCCLPP_CHECK_OFFSET(ExecBufRef, kind, 8);
MSCCLPP_CHECK_OFFSET(ExecBufRef, slot, 9);
MSCCLPP_CHECK_OFFSET(ExecBufRef, packet, 10);
MSCCLPP_CHECK_OFFSET(ExecBufRef, reserved, 11);

typedef struct ExecOp {
  MSCCLPP_ALIGNAS(8) uint8_t kind; /* ExecOpKind */
  uint8_t channel_type;            /* MSCCLPP_EXEC_CHANNEL_* */
  uint8_t n_src;
  uint8_t n_dst;
  uint8_t n_ids;
  uint8_t reduce_op; /* MSCCLPP_OP_SUM / _MIN / _MAX */
  uint16_t reserved;
  uint8_t ids[MSCCLPP_EXEC_MAX_OP_IDS]; /* channel indexes of the block, or semaphore ids */
  uint64_t size;                        /* data bytes per reference; pipeline: per iteration */
  uint64_t count; /* barrier, a group's share: blocks that meet; pipeline: iterations */
  uint64_t aux;   /* barrier, a group's share: its counter; pipeline: ops it repeats */
  ExecBufRef src[MSCCLPP_EXEC_MAX_OP_BUFFERS];
  ExecBufRef dst[MSCCLPP_EXEC_MAX_OP_BUFFERS];
} ExecOp;
MSCCLPP_CHECK_LAYOUT(ExecOp, 368, 8);
MSCCLPP_CHECK_OFFSET(ExecOp, kind, 0);
MSCCLPP_CHECK_OFFSET(ExecOp, channel_type, 1);
MSCCLPP_CHECK_OFFSET(ExecOp, n_src, 2);
MSCCLPP_CHECK_OFFSET(ExecOp, n_dst, 3);
MSCCLPP_CHECK_OFFSET(ExecOp, n_ids, 4);
MSCCLPP_CHECK_OFFSET(ExecOp, reduce_op, 5);
MSCCLPP_CHECK_OFFSET(ExecOp, reserved, 6);
MSCCLPP_CHECK_OFFSET(ExecOp, ids, 8);
MSCCLPP_CHECK_OFFSET(ExecOp, size, 24);
MSCCLPP_CHECK_OFFSET(ExecOp, count, 32);
MSCCLPP_CHECK_OFFSET(ExecOp, aux, 40);
MSCCLPP_CHECK_OFFSET(ExecOp, src, 48);
MSCCLPP_CHECK_OFFSET(ExecOp, dst, 208);

typedef struct ExecBlock {
  MSCCLPP_ALIGNAS(16) uint32_t n_ops; /* ops in use */
  uint32_t reserved;
  uint64_t reserved2;
  MemoryChannelDeviceHandle memory_channels[MSCCLPP_EXEC_MAX_CHANNELS]; /* signal / wait only */
  PortChannelDeviceHandle port_channels[MSCCLPP_EXEC_MAX_CHANNELS];     /* memory ids set per put */
  uint64_t memory_buffers[MSCCLPP_EXEC_MAX_REMOTE_BUFFERS];      /* peers' buffers, mapped here */
  uint64_t port_buffer_offsets[MSCCLPP_EXEC_MAX_REMOTE_BUFFERS]; /* in their registered memory */
  uint32_t port_buffer_ids[MSCCLPP_EXEC_MAX_REMOTE_BUFFERS];     /* the proxy's memory ids */
  uint8_t memory_buffer_kinds[MSCCLPP_EXEC_MAX_REMOTE_BUFFERS];  /* MSCCLPP_EXEC_BUF_INPUT.. */
  uint8_t port_buffer_kinds[MSCCLPP_EXEC_MAX_REMOTE_BUFFERS];
  ExecOp ops[MSCCLPP_EXEC_MAX_OPS];
} ExecBlock;
MSCCLPP_CHECK_LAYOUT(ExecBlock, 26352, 16);
MSCCLPP_CHECK_OFFSET(ExecBlock, n_ops, 0);
MSCCLPP_CHECK_OFFSET(ExecBlock, reserved, 4);
MSCCLPP_CHECK_OFFSET(ExecBlock, reserved2, 8);
MSCCLPP_CHECK_OFFSET(ExecBlock, memory_channels, 16);
MSCCLPP_CHECK_OFFSET(ExecBlock, port_channels, 912);
MSCCLPP_CHECK_OFFSET(ExecBlock, memory_buffers, 2448);
MSCCLPP_CHECK_OFFSET(ExecBlock, port_buffer_offsets, 2576);
MSCCLPP_CHECK_OFFSET(ExecBlock, port_buffer_ids, 2704);
MSCCLPP_CHECK_OFFSET(ExecBlock, memory_buffer_kinds, 2768);
MSCCLPP_CHECK_OFFSET(ExecBlock, port_buffer_kinds, 2784);
MSCCLPP_CHECK_OFFSET(ExecBlock, ops, 2800);

typedef struct ExecutorParams {
  MSCCLPP_ALIGNAS(8) uint64_t status; /* DeviceStatus */
  uint64_t blocks;                    /* one ExecBlock per block */
  uint64_t buffers[3];                /* this rank's input, output, scratch */
  uint32_t local_memory_ids[3];       /* the proxy's ids of their registered memories */
  uint32_t dtype;                     /* MSCCLPP_DTYPE_* */
  uint64_t local_offsets[3];          /* where each starts in its registered memory */
  uint64_t scratch_half;              /* 0, or the bytes of each half of a double scratch */
  uint64_t flags;                     /* 2 u64: last launch's flag, blocks counted */
  uint64_t barriers;                  /* MSCCLPP_EXEC_MAX_BARRIERS u64 counters */
  uint64_t semaphores;                /* MSCCLPP_EXEC_MAX_SEMAPHORES x 3 u64 */
  uint32_t packet;                    /* MSCCLPP_EXEC_PACKET_* */
  uint32_t reserved;
} ExecutorParams;
MSCCLPP_CHECK_LAYOUT(ExecutorParams, 120, 8);
MSCCLPP_CHECK_OFFSET(ExecutorParams, status, 0);
MSCCLPP_CHECK_OFFSET(ExecutorParams, blocks, 8);
MSCCLPP_CHECK_OFFSET(ExecutorParams, buffers, 16);
MSCCLPP_CHECK_OFFSET(ExecutorParams, local_memory_ids, 40);
MSCCLPP_CHECK_OFFSET(ExecutorParams, dtype, 52);
MSCCLPP_CHECK_OFFSET(ExecutorParams, local_offsets, 56);
MSCCLPP_CHECK_OFFSET(ExecutorParams, scratch_half, 80);
MSCCLPP_CHECK_OFFSET(ExecutorParams, flags, 88);
MSCCLPP_CHECK_OFFSET(ExecutorParams, barriers, 96);
MSCCLPP_CHECK_OFFSET(ExecutorParams, semaphores, 104);
MSCCLPP_CHECK_OFFSET(ExecutorParams, packet, 112);
MSCCLPP_CHECK_OFFSET(ExecutorParams, reserved, 116);

/* ---------------------------------------------------------------------------------------- */
/* Inter-process (shared/src/ipc.rs)                                                        */
/* ---------------------------------------------------------------------------------------- */

/* What one process sends another so that it can map a buffer of its device memory. The
 * receiver trusts nothing in it: it checks the kind and that offset + size <= alloc_size. */
typedef struct IpcMemHandle {
  MSCCLPP_ALIGNAS(8) uint32_t kind; /* MSCCLPP_IPC_KIND_* */
  uint32_t device;                  /* owner's device ordinal */
  uint32_t owner_pid;               /* owner's process id (CPU backend) */
  uint32_t owner_fd;                /* owner's memfd descriptor (CPU backend) */
  uint64_t token;                   /* random per-allocation token (CPU backend) */
  uint64_t alloc_size;              /* bytes in the whole allocation */
  uint64_t offset;                  /* the buffer's offset in the allocation */
  uint64_t size;                    /* bytes in the buffer */
  uint8_t cuda[64];                 /* CUipcMemHandle of the allocation (CUDA), else zero */
} IpcMemHandle;
MSCCLPP_CHECK_LAYOUT(IpcMemHandle, 112, 8);
MSCCLPP_CHECK_OFFSET(IpcMemHandle, kind, 0);
MSCCLPP_CHECK_OFFSET(IpcMemHandle, device, 4);
MSCCLPP_CHECK_OFFSET(IpcMemHandle, owner_pid, 8);
MSCCLPP_CHECK_OFFSET(IpcMemHandle, owner_fd, 12);
MSCCLPP_CHECK_OFFSET(IpcMemHandle, token, 16);
MSCCLPP_CHECK_OFFSET(IpcMemHandle, alloc_size, 24);
MSCCLPP_CHECK_OFFSET(IpcMemHandle, offset, 32);
MSCCLPP_CHECK_OFFSET(IpcMemHandle, size, 40);
MSCCLPP_CHECK_OFFSET(IpcMemHandle, cuda, 48);

/* Test kernels (device/src/test_kernels.rs): reduce_words_test_kernel writes
 * out[i] = reduce(a[i], b[i]) for count 32-bit words of dtype with op; ll128_blocks_test_kernel
 * sends count bytes of a as LL128 lines with flag through the line buffer b from block 0 to
 * block 1, which writes them to out. */
typedef struct TestKernelParams {
  MSCCLPP_ALIGNAS(8) uint64_t status; /* DeviceStatus */
  uint64_t a;
  uint64_t b;
  uint64_t out;
  uint64_t count; /* words (reduce) or bytes (LL128) */
  uint32_t dtype; /* MSCCLPP_DTYPE_* (reduce) */
  uint32_t op;    /* MSCCLPP_OP_* (reduce) */
  uint32_t flag;  /* LL128 line flag, never 0 */
  uint32_t reserved; /* zero */
} TestKernelParams;
MSCCLPP_CHECK_LAYOUT(TestKernelParams, 56, 8);
MSCCLPP_CHECK_OFFSET(TestKernelParams, status, 0);
MSCCLPP_CHECK_OFFSET(TestKernelParams, a, 8);
MSCCLPP_CHECK_OFFSET(TestKernelParams, b, 16);
MSCCLPP_CHECK_OFFSET(TestKernelParams, out, 24);
MSCCLPP_CHECK_OFFSET(TestKernelParams, count, 32);
MSCCLPP_CHECK_OFFSET(TestKernelParams, dtype, 40);
MSCCLPP_CHECK_OFFSET(TestKernelParams, op, 44);
MSCCLPP_CHECK_OFFSET(TestKernelParams, flag, 48);
MSCCLPP_CHECK_OFFSET(TestKernelParams, reserved, 52);

/* ---------------------------------------------------------------------------------------- */
/* Trigger helpers                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* Packs a trigger into *out with the commit bit clear (the FIFO push sets it). Returns 1 on
 * success. Returns 0, leaving *out untouched, when a value does not fit its field or `type` is
 * empty or has a bit outside DATA | FLAG | SYNC: nothing is ever masked. */
MSCCLPP_INLINE int mscclpp_trigger_pack(ProxyTrigger* out, uint64_t size, uint64_t src_offset,
                                        uint64_t dst_offset, uint32_t src_memory_id,
                                        uint32_t dst_memory_id, uint32_t type,
                                        uint32_t semaphore_id) {
  if (size > MSCCLPP_TRIGGER_MAX_SIZE || src_offset > MSCCLPP_TRIGGER_MAX_OFFSET ||
      dst_offset > MSCCLPP_TRIGGER_MAX_OFFSET || src_memory_id > MSCCLPP_TRIGGER_MAX_MEMORY_ID ||
      dst_memory_id > MSCCLPP_TRIGGER_MAX_MEMORY_ID || type == 0 ||
      type > MSCCLPP_TRIGGER_MAX_TYPE || semaphore_id > MSCCLPP_TRIGGER_MAX_SEMAPHORE_ID) {
    return 0;
  }
  out->fst = size | (src_offset << MSCCLPP_TRIGGER_SRC_OFFSET_SHIFT);
  out->snd = dst_offset | ((uint64_t)src_memory_id << MSCCLPP_TRIGGER_SRC_MEMORY_ID_SHIFT) |
             ((uint64_t)dst_memory_id << MSCCLPP_TRIGGER_DST_MEMORY_ID_SHIFT) |
             ((uint64_t)type << MSCCLPP_TRIGGER_TYPE_SHIFT) |
             ((uint64_t)semaphore_id << MSCCLPP_TRIGGER_SEMAPHORE_ID_SHIFT);
  return 1;
}

MSCCLPP_INLINE uint64_t mscclpp_trigger_size(const ProxyTrigger* t) {
  return t->fst & MSCCLPP_TRIGGER_MAX_SIZE;
}

MSCCLPP_INLINE uint64_t mscclpp_trigger_src_offset(const ProxyTrigger* t) {
  return t->fst >> MSCCLPP_TRIGGER_SRC_OFFSET_SHIFT;
}

MSCCLPP_INLINE uint64_t mscclpp_trigger_dst_offset(const ProxyTrigger* t) {
  return t->snd & MSCCLPP_TRIGGER_MAX_OFFSET;
}

MSCCLPP_INLINE uint32_t mscclpp_trigger_src_memory_id(const ProxyTrigger* t) {
  return (uint32_t)((t->snd >> MSCCLPP_TRIGGER_SRC_MEMORY_ID_SHIFT) &
                    MSCCLPP_TRIGGER_MAX_MEMORY_ID);
}

MSCCLPP_INLINE uint32_t mscclpp_trigger_dst_memory_id(const ProxyTrigger* t) {
  return (uint32_t)((t->snd >> MSCCLPP_TRIGGER_DST_MEMORY_ID_SHIFT) &
                    MSCCLPP_TRIGGER_MAX_MEMORY_ID);
}

/* The type bits; 0 in a trigger that was never filled in. */
MSCCLPP_INLINE uint32_t mscclpp_trigger_type(const ProxyTrigger* t) {
  return (uint32_t)((t->snd >> MSCCLPP_TRIGGER_TYPE_SHIFT) & MSCCLPP_TRIGGER_MAX_TYPE);
}

MSCCLPP_INLINE uint32_t mscclpp_trigger_semaphore_id(const ProxyTrigger* t) {
  return (uint32_t)((t->snd >> MSCCLPP_TRIGGER_SEMAPHORE_ID_SHIFT) &
                    MSCCLPP_TRIGGER_MAX_SEMAPHORE_ID);
}

MSCCLPP_INLINE uint32_t mscclpp_trigger_commit_bit(const ProxyTrigger* t) {
  return (uint32_t)(t->snd >> MSCCLPP_TRIGGER_COMMIT_SHIFT);
}

/* Sets the commit bit to parity & 1, keeping every other bit. */
MSCCLPP_INLINE void mscclpp_trigger_set_commit_bit(ProxyTrigger* t, uint64_t parity) {
  t->snd = (t->snd & ~(1ULL << MSCCLPP_TRIGGER_COMMIT_SHIFT)) |
           ((parity & 1) << MSCCLPP_TRIGGER_COMMIT_SHIFT);
}

/* The commit bit of the trigger pushed at FIFO position pos, for a FIFO of 2^log2_size slots. */
MSCCLPP_INLINE uint64_t mscclpp_fifo_commit_parity(uint64_t pos, uint32_t log2_size) {
  return ((pos >> log2_size) & 1) ^ 1;
}

/* Packs a MSCCLPP_WAIT_SITE_* and the address a wait watched into DeviceStatus.error_detail. */
MSCCLPP_INLINE uint64_t mscclpp_error_detail(uint32_t site, uint64_t addr) {
  return ((uint64_t)(site & 0xffu) << MSCCLPP_ERROR_DETAIL_SITE_SHIFT) |
         (addr & ((1ULL << MSCCLPP_ERROR_DETAIL_SITE_SHIFT) - 1));
}

#endif /* MSCCLPP_LAYOUT_H_ */
