/*
 * mscclpp/device.cuh — the mscclpp-rs device API for CUDA C++ kernels.
 *
 * The same operations as the Rust crate mscclpp-device (device/src/{fifo,semaphore,
 * port_channel,memory_channel,packet,wait}.rs), over the C structs of mscclpp/layout.h, with the
 * same PTX instructions (device/src/arch/nvptx.rs), the same orderings and scopes, the same
 * spin/abort/timeout rules and the same error records. A CUDA C++ kernel written against this
 * header drives the Rust host proxy and talks to Rust kernels on the peer GPU: both sides obey
 * one protocol, written down once in shared/src (fifo.rs, semaphore.rs, status.rs, packet.rs).
 * The Rust code is the reference: change a protocol there first, then here.
 *
 * Shape of the API. Free `__device__ __forceinline__` functions in namespace mscclpp that take
 * the layout.h handles by reference, named after the handle they act on (the Rust trait method
 * `ch.put(..)` of a PortChannelDeviceHandle is `mscclpp::port_put(ch, ..)` here):
 *
 *   FifoDeviceHandle                          fifo_push, fifo_poll, fifo_sync, fifo_wait_flushed
 *   MemoryDevice2DeviceSemaphoreDeviceHandle  semaphore_signal, semaphore_relaxed_signal,
 *                                             semaphore_wait, semaphore_relaxed_wait, semaphore_poll
 *   Host2DeviceSemaphoreDeviceHandle          semaphore_wait, semaphore_relaxed_wait, semaphore_poll
 *   PortChannelDeviceHandle                   port_put, port_signal, port_put_with_signal,
 *                                             port_put_with_signal_and_flush, port_flush,
 *                                             port_wait, port_poll
 *   MemoryChannelDeviceHandle                 memory_put, memory_get, memory_read, memory_write,
 *                                             memory_put_packets<P>, memory_unpack_packets<P>,
 *                                             memory_signal, memory_relaxed_signal, memory_wait,
 *                                             memory_relaxed_wait, memory_poll
 *
 * Plain functions on the plain structs keep the kernel parameter structs of layout.h usable as
 * they are (a kernel takes one of them by value, as every Rust kernel does) and keep nothing
 * hidden between the two languages; there are no wrapper classes to keep in step.
 *
 * Return codes. Every operation that can wait returns a uint32_t: 0 (MSCCLPP_DEVICE_ERROR_NONE)
 * on success, else the MSCCLPP_DEVICE_ERROR_* code the wait gave up with (ABORTED when the host
 * set DeviceStatus.abort, TIMEOUT after DeviceStatus.spin_limit spins, INVALID_ARGUMENT when a
 * value cannot be expressed in a trigger). The first error of a launch is also recorded in the
 * handle's DeviceStatus, where the host reads it after the kernel and turns it into a typed
 * error (mscclpp_host::status). A kernel should return soon after a non-zero code: the host is
 * tearing the operation down. Functions that return a FIFO position write it to an optional
 * `uint64_t* pos` out-parameter.
 *
 * Threads. As in Rust: one GPU thread at a time uses a semaphore (its `expected` word is a plain
 * counter owned by the caller) or pushes through a PortChannel; collective MemoryChannel
 * operations (memory_put/get, memory_put_packets/unpack_packets) are called by every thread of a
 * group with its `tid` and the group's `nthreads`. Concurrent FIFO pushers must not outnumber
 * the FIFO's slots (see shared/src/fifo.rs).
 *
 * Requirements: nvcc (or clang in CUDA mode) targeting sm_70 or newer (the .acquire/.release/
 * .relaxed qualifiers and .sys scope); C++11 or newer. Include as <mscclpp/device.cuh> with
 * shared/include on the include path.
 */
#ifndef MSCCLPP_DEVICE_CUH_
#define MSCCLPP_DEVICE_CUH_

#if !defined(__CUDACC__)
#error "mscclpp/device.cuh is CUDA C++ (compile with nvcc); plain C/C++ code includes mscclpp/layout.h"
#endif

#include "layout.h"

#define MSCCLPP_DEVICE_INLINE __device__ __forceinline__

namespace mscclpp {

/* ---------------------------------------------------------------------------------------- */
/* PTX primitives (the twins of device/src/arch/nvptx.rs, same names and instructions)       */
/* ---------------------------------------------------------------------------------------- */

/* Every ordering asm is volatile with a "memory" clobber, so the compiler neither drops it nor
 * moves memory accesses across it (Rust: asm! without nomem/readonly/pure). Pointers are
 * generic addresses of global memory (local, peer-mapped or host-mapped), as in Rust. */
namespace ptx {

MSCCLPP_DEVICE_INLINE uint64_t ld_acquire_sys_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

MSCCLPP_DEVICE_INLINE uint64_t ld_relaxed_sys_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

MSCCLPP_DEVICE_INLINE uint32_t ld_relaxed_sys_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

MSCCLPP_DEVICE_INLINE void st_release_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

MSCCLPP_DEVICE_INLINE void st_relaxed_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* One 16-byte release store of (lo, hi); p is 16-byte aligned. */
MSCCLPP_DEVICE_INLINE void st_release_sys_v2_u64(uint64_t* p, uint64_t lo, uint64_t hi) {
  asm volatile("st.release.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi)
               : "memory");
}

MSCCLPP_DEVICE_INLINE void red_add_release_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

MSCCLPP_DEVICE_INLINE void red_add_relaxed_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* Returns the old value. */
MSCCLPP_DEVICE_INLINE uint64_t atom_add_relaxed_gpu_u64(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.add.relaxed.gpu.global.u64 %0, [%1], %2;"
               : "=l"(old)
               : "l"(p), "l"(v)
               : "memory");
  return old;
}

/* Returns the old value. */
MSCCLPP_DEVICE_INLINE uint32_t atom_cas_relaxed_sys_u32(uint32_t* p, uint32_t compare,
                                                        uint32_t desired) {
  uint32_t old;
  asm volatile("atom.cas.relaxed.sys.global.b32 %0, [%1], %2, %3;"
               : "=r"(old)
               : "l"(p), "r"(compare), "r"(desired)
               : "memory");
  return old;
}

MSCCLPP_DEVICE_INLINE void fence_sc_sys() { asm volatile("fence.sc.sys;" ::: "memory"); }

MSCCLPP_DEVICE_INLINE void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

/* LL16 packet read and write: one 16-byte volatile access; p is 16-byte aligned. */
MSCCLPP_DEVICE_INLINE void ld_volatile_v4_u32(const uint32_t* p, uint32_t v[4]) {
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(p)
               : "memory");
}

MSCCLPP_DEVICE_INLINE void st_volatile_v4_u32(uint32_t* p, uint32_t a, uint32_t b, uint32_t c,
                                              uint32_t d) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b),
               "r"(c), "r"(d)
               : "memory");
}

/* LL8 packet read and write: one 8-byte volatile access; p is 8-byte aligned. */
MSCCLPP_DEVICE_INLINE void ld_volatile_v2_u32(const uint32_t* p, uint32_t v[2]) {
  asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];"
               : "=r"(v[0]), "=r"(v[1])
               : "l"(p)
               : "memory");
}

MSCCLPP_DEVICE_INLINE void st_volatile_v2_u32(uint32_t* p, uint32_t a, uint32_t b) {
  asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(a), "r"(b) : "memory");
}

/* Plain 16-byte load and store (bulk copies); p is 16-byte aligned. The "memory" clobber keeps
 * them ordered with the thread's other accesses (Rust marks the load `readonly`). */
MSCCLPP_DEVICE_INLINE void ld_v4_u32(const uint32_t* p, uint32_t v[4]) {
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(p)
               : "memory");
}

MSCCLPP_DEVICE_INLINE void st_v4_u32(uint32_t* p, const uint32_t v[4]) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v[0]), "r"(v[1]),
               "r"(v[2]), "r"(v[3])
               : "memory");
}

}  // namespace ptx

/* A layout.h address field (uint64_t, 0 = null) as a typed pointer. */
template <typename T>
MSCCLPP_DEVICE_INLINE T* as_ptr(uint64_t addr) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(addr));
}

/* ---------------------------------------------------------------------------------------- */
/* Bounded, abortable spinning (device/src/wait.rs)                                          */
/* ---------------------------------------------------------------------------------------- */

/* Iterations between two reads of DeviceStatus.abort. */
constexpr uint64_t ABORT_CHECK_INTERVAL = 1024;
/* Spin limit of a wait whose handle carries no status (a caller bug, but never a hang). */
constexpr uint64_t FALLBACK_SPIN_LIMIT = 1ULL << 32;

/* Records `code` as the first error of the DeviceStatus at `status` (0: none, nothing is done):
 * error_code by compare-and-swap from 0, then error_detail (only by the winner of the CAS), then
 * a system-scope fence so the host sees both once it sees the code. Kept out of line (the cold
 * path of every wait), like Rust's #[inline(never)]; `inline` only gives it one definition
 * across translation units. */
inline __device__ __noinline__ void record_error(uint64_t status, uint32_t code, uint64_t detail) {
  if (status == 0) {
    return;
  }
  DeviceStatus* s = as_ptr<DeviceStatus>(status);
  if (ptx::atom_cas_relaxed_sys_u32(&s->error_code, 0u, code) == 0u) {
    ptx::st_relaxed_sys_u64(&s->error_detail, detail);
    ptx::fence_sc_sys();
  }
}

/* Whether the host asked every wait to stop (a relaxed system-scope load: it only needs to be
 * seen eventually). */
MSCCLPP_DEVICE_INLINE bool aborted(uint64_t status) {
  if (status == 0) {
    return false;
  }
  return ptx::ld_relaxed_sys_u32(&as_ptr<DeviceStatus>(status)->abort) != 0u;
}

/* Spins until ready() returns true; returns 0. Every ABORT_CHECK_INTERVAL iterations it reads
 * the abort flag, and after DeviceStatus.spin_limit iterations (0 = no limit) it gives up; either
 * way it records the error (naming the MSCCLPP_WAIT_SITE_* `site` and the watched address
 * `addr`) and returns MSCCLPP_DEVICE_ERROR_ABORTED or MSCCLPP_DEVICE_ERROR_TIMEOUT. */
template <typename Ready>
MSCCLPP_DEVICE_INLINE uint32_t spin_until(uint64_t status, uint32_t site, uint64_t addr,
                                          Ready ready) {
  if (ready()) {
    return MSCCLPP_DEVICE_ERROR_NONE;
  }
  const uint64_t limit =
      status == 0 ? FALLBACK_SPIN_LIMIT
                  : ptx::ld_relaxed_sys_u64(&as_ptr<DeviceStatus>(status)->spin_limit);
  uint64_t iteration = 0;
  for (;;) {
    if (ready()) {
      return MSCCLPP_DEVICE_ERROR_NONE;
    }
    iteration += 1;
    if (iteration % ABORT_CHECK_INTERVAL == 0 && aborted(status)) {
      record_error(status, MSCCLPP_DEVICE_ERROR_ABORTED, mscclpp_error_detail(site, addr));
      return MSCCLPP_DEVICE_ERROR_ABORTED;
    }
    if (limit != 0 && iteration >= limit) {
      record_error(status, MSCCLPP_DEVICE_ERROR_TIMEOUT, mscclpp_error_detail(site, addr));
      return MSCCLPP_DEVICE_ERROR_TIMEOUT;
    }
  }
}

/* ---------------------------------------------------------------------------------------- */
/* FIFO producer (device/src/fifo.rs; protocol in shared/src/fifo.rs)                        */
/* ---------------------------------------------------------------------------------------- */

/* Pushes `trigger` (its commit bit is overwritten) and stores its position in *pos (if pos is
 * not null). Takes a position with atom.add.relaxed.gpu on `head`; while the FIFO is full
 * (pos >= size + tail_cache) waits, bounded and abortable, on ld.acquire.sys of `tail` and
 * refreshes `tail_cache`; then publishes the whole slot with one st.release.sys.global.v2.u64
 * whose bit 63 of snd is the lap parity ((pos >> log2_size) & 1) ^ 1. */
MSCCLPP_DEVICE_INLINE uint32_t fifo_push(const FifoDeviceHandle& fifo, ProxyTrigger trigger,
                                         uint64_t* pos = nullptr) {
  const uint64_t n = fifo.size;
  const uint64_t p = ptx::atom_add_relaxed_gpu_u64(as_ptr<uint64_t>(fifo.head), 1);
  if (p >= n + ptx::ld_relaxed_sys_u64(as_ptr<const uint64_t>(fifo.tail_cache))) {
    const uint64_t* tail = as_ptr<const uint64_t>(fifo.tail);
    uint64_t* tail_cache = as_ptr<uint64_t>(fifo.tail_cache);
    const uint32_t rc =
        spin_until(fifo.status, MSCCLPP_WAIT_SITE_FIFO_PUSH, fifo.tail, [&]() -> bool {
          const uint64_t t = ptx::ld_acquire_sys_u64(tail);
          if (p < n + t) {
            ptx::st_relaxed_sys_u64(tail_cache, t);
            return true;
          }
          return false;
        });
    if (rc != MSCCLPP_DEVICE_ERROR_NONE) {
      return rc;
    }
  }
  mscclpp_trigger_set_commit_bit(&trigger, mscclpp_fifo_commit_parity(p, fifo.log2_size));
  uint64_t* slot = reinterpret_cast<uint64_t*>(as_ptr<ProxyTrigger>(fifo.triggers) + (p & (n - 1)));
  ptx::st_release_sys_v2_u64(slot, trigger.fst, trigger.snd);
  if (pos != nullptr) {
    *pos = p;
  }
  return MSCCLPP_DEVICE_ERROR_NONE;
}

/* Whether the proxy has popped the trigger at `pos`. */
MSCCLPP_DEVICE_INLINE bool fifo_poll(const FifoDeviceHandle& fifo, uint64_t pos) {
  return ptx::ld_acquire_sys_u64(as_ptr<const uint64_t>(fifo.tail)) > pos;
}

/* Waits (bounded, abortable) until the proxy has popped the trigger at `pos`. */
MSCCLPP_DEVICE_INLINE uint32_t fifo_sync(const FifoDeviceHandle& fifo, uint64_t pos) {
  return spin_until(fifo.status, MSCCLPP_WAIT_SITE_FIFO_SYNC, fifo.tail,
                    [&]() -> bool { return fifo_poll(fifo, pos); });
}

/* Waits (bounded, abortable) until the proxy has completed the SYNC trigger pushed at `pos` (and
 * so all work of its connection pushed before it): flush_done_pos > pos. */
MSCCLPP_DEVICE_INLINE uint32_t fifo_wait_flushed(const FifoDeviceHandle& fifo, uint64_t pos) {
  const uint64_t* done = as_ptr<const uint64_t>(fifo.flush_done_pos);
  return spin_until(fifo.status, MSCCLPP_WAIT_SITE_FIFO_SYNC, fifo.flush_done_pos,
                    [&]() -> bool { return ptx::ld_acquire_sys_u64(done) > pos; });
}

/* ---------------------------------------------------------------------------------------- */
/* Semaphores (device/src/semaphore.rs; words in shared/src/semaphore.rs)                    */
/* ---------------------------------------------------------------------------------------- */

namespace detail {

/* ++expected, then waits until inbound >= expected (acquire loads unless `relaxed`). */
MSCCLPP_DEVICE_INLINE uint32_t wait_inbound(uint64_t inbound, uint64_t expected, uint64_t status,
                                            bool relaxed) {
  volatile uint64_t* exp = as_ptr<volatile uint64_t>(expected);
  const uint64_t e = *exp + 1;
  *exp = e;
  const uint64_t* in = as_ptr<const uint64_t>(inbound);
  return spin_until(status, MSCCLPP_WAIT_SITE_SEMAPHORE, inbound, [&]() -> bool {
    const uint64_t v = relaxed ? ptx::ld_relaxed_sys_u64(in) : ptx::ld_acquire_sys_u64(in);
    return v >= e;
  });
}

/* Consumes one token if it has arrived. */
MSCCLPP_DEVICE_INLINE bool poll_inbound(uint64_t inbound, uint64_t expected) {
  volatile uint64_t* exp = as_ptr<volatile uint64_t>(expected);
  const uint64_t e = *exp + 1;
  if (ptx::ld_acquire_sys_u64(as_ptr<const uint64_t>(inbound)) >= e) {
    *exp = e;
    return true;
  }
  return false;
}

}  // namespace detail

/* Gives the peer one token; every earlier write of this thread (to any memory, the peer's
 * included) is visible to the peer before the token (red.release.sys on remote_inbound). */
MSCCLPP_DEVICE_INLINE void semaphore_signal(const MemoryDevice2DeviceSemaphoreDeviceHandle& s) {
  ptx::red_add_release_sys_u64(as_ptr<uint64_t>(s.remote_inbound), 1);
}

/* Gives the peer one token with no ordering (pair with a fence, or for pure counting). */
MSCCLPP_DEVICE_INLINE void semaphore_relaxed_signal(
    const MemoryDevice2DeviceSemaphoreDeviceHandle& s) {
  ptx::red_add_relaxed_sys_u64(as_ptr<uint64_t>(s.remote_inbound), 1);
}

/* Takes one token, waiting (bounded, abortable) until it arrives; acquire. */
MSCCLPP_DEVICE_INLINE uint32_t semaphore_wait(const MemoryDevice2DeviceSemaphoreDeviceHandle& s) {
  return detail::wait_inbound(s.inbound, s.expected, s.status, false);
}

/* As semaphore_wait, without acquire ordering. */
MSCCLPP_DEVICE_INLINE uint32_t
semaphore_relaxed_wait(const MemoryDevice2DeviceSemaphoreDeviceHandle& s) {
  return detail::wait_inbound(s.inbound, s.expected, s.status, true);
}

/* Takes one token if it has arrived. */
MSCCLPP_DEVICE_INLINE bool semaphore_poll(const MemoryDevice2DeviceSemaphoreDeviceHandle& s) {
  return detail::poll_inbound(s.inbound, s.expected);
}

/* Takes one token signalled by the peer's proxy, waiting (bounded, abortable); acquire. */
MSCCLPP_DEVICE_INLINE uint32_t semaphore_wait(const Host2DeviceSemaphoreDeviceHandle& s) {
  return detail::wait_inbound(s.inbound, s.expected, s.status, false);
}

/* As semaphore_wait, without acquire ordering. */
MSCCLPP_DEVICE_INLINE uint32_t semaphore_relaxed_wait(const Host2DeviceSemaphoreDeviceHandle& s) {
  return detail::wait_inbound(s.inbound, s.expected, s.status, true);
}

/* Takes one token if it has arrived. */
MSCCLPP_DEVICE_INLINE bool semaphore_poll(const Host2DeviceSemaphoreDeviceHandle& s) {
  return detail::poll_inbound(s.inbound, s.expected);
}

/* ---------------------------------------------------------------------------------------- */
/* PortChannel (device/src/port_channel.rs)                                                  */
/* ---------------------------------------------------------------------------------------- */

namespace detail {

/* The channel's trigger of `type` (MSCCLPP_TRIGGER_* bits), commit bit clear. Like Rust's
 * ProxyTrigger::pack_unchecked: the callers below only pass sizes and offsets that fit, and the
 * channel's ids were range-checked by the host that built the handle. */
MSCCLPP_DEVICE_INLINE ProxyTrigger port_trigger(const PortChannelDeviceHandle& ch, uint64_t type,
                                                uint64_t dst_off, uint64_t src_off,
                                                uint64_t size) {
  ProxyTrigger t;
  t.fst = size | (src_off << MSCCLPP_TRIGGER_SRC_OFFSET_SHIFT);
  t.snd = dst_off | (static_cast<uint64_t>(ch.src) << MSCCLPP_TRIGGER_SRC_MEMORY_ID_SHIFT) |
          (static_cast<uint64_t>(ch.dst) << MSCCLPP_TRIGGER_DST_MEMORY_ID_SHIFT) |
          (type << MSCCLPP_TRIGGER_TYPE_SHIFT) |
          (static_cast<uint64_t>(ch.semaphore_id) << MSCCLPP_TRIGGER_SEMAPHORE_ID_SHIFT);
  return t;
}

/* Pushes DATA triggers for the whole range, split at MSCCLPP_TRIGGER_MAX_SIZE bytes (at least
 * one trigger, so a zero-byte put with a signal still signals); the last carries `last_type`
 * too. An offset beyond 32 bits cannot be expressed: it is recorded as INVALID_ARGUMENT in the
 * FIFO's status (wait site UNKNOWN, the offset as address) and returned, never masked. */
MSCCLPP_DEVICE_INLINE uint32_t push_data(const PortChannelDeviceHandle& ch, uint64_t dst_off,
                                         uint64_t src_off, uint64_t bytes, uint64_t last_type,
                                         uint64_t* pos) {
  uint64_t done = 0;
  for (;;) {
    const uint64_t chunk =
        bytes - done > MSCCLPP_TRIGGER_MAX_SIZE ? MSCCLPP_TRIGGER_MAX_SIZE : bytes - done;
    const uint64_t d = dst_off + done;
    const uint64_t s = src_off + done;
    if (d > MSCCLPP_TRIGGER_MAX_OFFSET || s > MSCCLPP_TRIGGER_MAX_OFFSET) {
      record_error(ch.fifo.status, MSCCLPP_DEVICE_ERROR_INVALID_ARGUMENT,
                   mscclpp_error_detail(MSCCLPP_WAIT_SITE_UNKNOWN, d > s ? d : s));
      return MSCCLPP_DEVICE_ERROR_INVALID_ARGUMENT;
    }
    done += chunk;
    const uint64_t type =
        done == bytes ? (MSCCLPP_TRIGGER_DATA | last_type) : MSCCLPP_TRIGGER_DATA;
    uint64_t p = 0;
    const uint32_t rc = fifo_push(ch.fifo, port_trigger(ch, type, d, s, chunk), &p);
    if (rc != MSCCLPP_DEVICE_ERROR_NONE) {
      return rc;
    }
    if (done == bytes) {
      if (pos != nullptr) {
        *pos = p;
      }
      return MSCCLPP_DEVICE_ERROR_NONE;
    }
  }
}

}  // namespace detail

/* Asks the proxy to copy `bytes` from local memory `src` + src_off to the peer's memory `dst` +
 * dst_off. *pos (optional) gets the FIFO position of the last trigger. */
MSCCLPP_DEVICE_INLINE uint32_t port_put(const PortChannelDeviceHandle& ch, uint64_t dst_off,
                                        uint64_t src_off, uint64_t bytes,
                                        uint64_t* pos = nullptr) {
  return detail::push_data(ch, dst_off, src_off, bytes, MSCCLPP_TRIGGER_DATA, pos);
}

/* Asks the proxy to signal the peer's semaphore after the work pushed before. */
MSCCLPP_DEVICE_INLINE uint32_t port_signal(const PortChannelDeviceHandle& ch,
                                           uint64_t* pos = nullptr) {
  return fifo_push(ch.fifo, detail::port_trigger(ch, MSCCLPP_TRIGGER_FLAG, 0, 0, 0), pos);
}

/* port_put then port_signal, in one trigger where the size allows. */
MSCCLPP_DEVICE_INLINE uint32_t port_put_with_signal(const PortChannelDeviceHandle& ch,
                                                    uint64_t dst_off, uint64_t src_off,
                                                    uint64_t bytes, uint64_t* pos = nullptr) {
  return detail::push_data(ch, dst_off, src_off, bytes, MSCCLPP_TRIGGER_FLAG, pos);
}

/* port_put_with_signal (its last trigger also SYNC), then waits until the proxy completed it. */
MSCCLPP_DEVICE_INLINE uint32_t port_put_with_signal_and_flush(const PortChannelDeviceHandle& ch,
                                                              uint64_t dst_off, uint64_t src_off,
                                                              uint64_t bytes) {
  uint64_t p = 0;
  const uint32_t rc = detail::push_data(ch, dst_off, src_off, bytes,
                                        MSCCLPP_TRIGGER_FLAG | MSCCLPP_TRIGGER_SYNC, &p);
  if (rc != MSCCLPP_DEVICE_ERROR_NONE) {
    return rc;
  }
  return fifo_wait_flushed(ch.fifo, p);
}

/* Waits until the proxy has completed every trigger this channel pushed before. */
MSCCLPP_DEVICE_INLINE uint32_t port_flush(const PortChannelDeviceHandle& ch) {
  uint64_t p = 0;
  const uint32_t rc =
      fifo_push(ch.fifo, detail::port_trigger(ch, MSCCLPP_TRIGGER_SYNC, 0, 0, 0), &p);
  if (rc != MSCCLPP_DEVICE_ERROR_NONE) {
    return rc;
  }
  return fifo_wait_flushed(ch.fifo, p);
}

/* Takes one token signalled by the peer (bounded, abortable). */
MSCCLPP_DEVICE_INLINE uint32_t port_wait(const PortChannelDeviceHandle& ch) {
  return semaphore_wait(ch.semaphore);
}

/* Takes one token if it has arrived. */
MSCCLPP_DEVICE_INLINE bool port_poll(const PortChannelDeviceHandle& ch) {
  return semaphore_poll(ch.semaphore);
}

/* ---------------------------------------------------------------------------------------- */
/* Collective copy (device/src/copy.rs)                                                      */
/* ---------------------------------------------------------------------------------------- */

/* Thread `tid` of `nthreads` copies its strided share of `bytes` bytes from src to dst: 16-byte
 * vectors when both ends are 16-byte aligned, then the remaining bytes one by one. The ranges
 * must not overlap. */
MSCCLPP_DEVICE_INLINE void copy(uint8_t* dst, const uint8_t* src, uint64_t bytes, uint64_t tid,
                                uint64_t nthreads) {
  uint64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 16) == 0) {
    const uint64_t vecs = bytes / 16;
    for (uint64_t i = tid; i < vecs; i += nthreads) {
      uint32_t v[4];
      ptx::ld_v4_u32(reinterpret_cast<const uint32_t*>(src + i * 16), v);
      ptx::st_v4_u32(reinterpret_cast<uint32_t*>(dst + i * 16), v);
    }
    done = vecs * 16;
  }
  for (uint64_t i = done + tid; i < bytes; i += nthreads) {
    dst[i] = src[i];
  }
}

/* ---------------------------------------------------------------------------------------- */
/* LL packets (device/src/packet.rs; layouts in shared/src/packet.rs)                        */
/* ---------------------------------------------------------------------------------------- */

/* How a packet type P is written and read: PAYLOAD bytes per packet, a store of the payload (as
 * two little-endian u32 words, the second unused by LL8) with the flag in ONE store, and a load
 * that succeeds when every flag of the packet equals the expected flag. */
template <typename P>
struct PacketOps;

template <>
struct PacketOps<LL16Packet> {
  static constexpr uint64_t PAYLOAD = 8;
  static MSCCLPP_DEVICE_INLINE void store(LL16Packet* p, const uint32_t w[2], uint32_t flag) {
    ptx::st_volatile_v4_u32(reinterpret_cast<uint32_t*>(p), w[0], flag, w[1], flag);
  }
  static MSCCLPP_DEVICE_INLINE bool load(const LL16Packet* p, uint32_t flag, uint32_t w[2]) {
    uint32_t v[4];
    ptx::ld_volatile_v4_u32(reinterpret_cast<const uint32_t*>(p), v);
    if (v[1] == flag && v[3] == flag) {
      w[0] = v[0];
      w[1] = v[2];
      return true;
    }
    return false;
  }
};

template <>
struct PacketOps<LL8Packet> {
  static constexpr uint64_t PAYLOAD = 4;
  static MSCCLPP_DEVICE_INLINE void store(LL8Packet* p, const uint32_t w[2], uint32_t flag) {
    ptx::st_volatile_v2_u32(reinterpret_cast<uint32_t*>(p), w[0], flag);
  }
  static MSCCLPP_DEVICE_INLINE bool load(const LL8Packet* p, uint32_t flag, uint32_t w[2]) {
    uint32_t v[2];
    ptx::ld_volatile_v2_u32(reinterpret_cast<const uint32_t*>(p), v);
    if (v[1] == flag) {
      w[0] = v[0];
      w[1] = 0;
      return true;
    }
    return false;
  }
};

/* Number of packets of type P that carry `bytes` bytes. */
template <typename P>
MSCCLPP_DEVICE_INLINE uint64_t packets_for(uint64_t bytes) {
  return (bytes + PacketOps<P>::PAYLOAD - 1) / PacketOps<P>::PAYLOAD;
}

namespace detail {

/* Reads up to PAYLOAD bytes at src (fewer at the end of a buffer: len) as two u32 words. */
template <typename P>
MSCCLPP_DEVICE_INLINE void read_payload(const uint8_t* src, uint64_t len, uint32_t w[2]) {
  const uint64_t payload = PacketOps<P>::PAYLOAD;
  w[0] = 0;
  w[1] = 0;
  if (len >= payload && reinterpret_cast<uintptr_t>(src) % 4 == 0) {
    w[0] = reinterpret_cast<const uint32_t*>(src)[0];
    if (payload == 8) {
      w[1] = reinterpret_cast<const uint32_t*>(src)[1];
    }
  } else {
    const uint64_t n = len < payload ? len : payload;
    for (uint64_t i = 0; i < n; ++i) {
      w[i / 4] |= static_cast<uint32_t>(src[i]) << (8 * (i % 4));
    }
  }
}

/* Writes the first len (<= PAYLOAD) bytes of w to dst. */
template <typename P>
MSCCLPP_DEVICE_INLINE void write_payload(uint8_t* dst, const uint32_t w[2], uint64_t len) {
  const uint64_t payload = PacketOps<P>::PAYLOAD;
  if (len >= payload && reinterpret_cast<uintptr_t>(dst) % 4 == 0) {
    reinterpret_cast<uint32_t*>(dst)[0] = w[0];
    if (payload == 8) {
      reinterpret_cast<uint32_t*>(dst)[1] = w[1];
    }
  } else {
    const uint64_t n = len < payload ? len : payload;
    for (uint64_t i = 0; i < n; ++i) {
      dst[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
    }
  }
}

}  // namespace detail

/* Waits (bounded, abortable; wait site PACKET, the packet's address) until the packet at p
 * carries `flag` and copies its payload to w. Returns 0 or the error code. */
template <typename P>
MSCCLPP_DEVICE_INLINE uint32_t read_packet(const P* p, uint32_t flag, uint64_t status,
                                           uint32_t w[2]) {
  return spin_until(status, MSCCLPP_WAIT_SITE_PACKET, reinterpret_cast<uintptr_t>(p),
                    [&]() -> bool { return PacketOps<P>::load(p, flag, w); });
}

/* Collective: threads tid of nthreads turn `bytes` bytes at src into packets at dst (the
 * reader's packet buffer) carrying `flag`. Flags must differ for every use of a packet buffer
 * (count uses 1, 2, 3, ...; 0 never matches, buffers start zeroed). */
template <typename P>
MSCCLPP_DEVICE_INLINE void put_packets(P* dst, const uint8_t* src, uint64_t bytes, uint64_t tid,
                                       uint64_t nthreads, uint32_t flag) {
  const uint64_t n = packets_for<P>(bytes);
  for (uint64_t i = tid; i < n; i += nthreads) {
    const uint64_t off = i * PacketOps<P>::PAYLOAD;
    uint32_t w[2];
    detail::read_payload<P>(src + off, bytes - off, w);
    PacketOps<P>::store(dst + i, w, flag);
  }
}

/* Collective: threads wait for the packets at src (the local packet buffer) to carry `flag` and
 * write their payload, `bytes` bytes in all, to dst. Returns 0, or the code of the first wait
 * that gave up (this thread stops there). */
template <typename P>
MSCCLPP_DEVICE_INLINE uint32_t unpack_packets(uint8_t* dst, const P* src, uint64_t bytes,
                                              uint64_t tid, uint64_t nthreads, uint32_t flag,
                                              uint64_t status) {
  const uint64_t n = packets_for<P>(bytes);
  for (uint64_t i = tid; i < n; i += nthreads) {
    uint32_t w[2];
    const uint32_t rc = read_packet<P>(src + i, flag, status, w);
    if (rc != MSCCLPP_DEVICE_ERROR_NONE) {
      return rc;
    }
    const uint64_t off = i * PacketOps<P>::PAYLOAD;
    detail::write_payload<P>(dst + off, w, bytes - off);
  }
  return MSCCLPP_DEVICE_ERROR_NONE;
}

/* ---------------------------------------------------------------------------------------- */
/* MemoryChannel (device/src/memory_channel.rs; words in shared/src/memory_channel.rs)       */
/* ---------------------------------------------------------------------------------------- */

/* Collective: copies `bytes` from local `src` + src_off to the peer's `dst` + dst_off (16-byte
 * vectors when both ends are 16-byte aligned). Both ranges must lie inside the buffers. */
MSCCLPP_DEVICE_INLINE void memory_put(const MemoryChannelDeviceHandle& ch, uint64_t dst_off,
                                      uint64_t src_off, uint64_t bytes, uint32_t tid,
                                      uint32_t nthreads) {
  copy(as_ptr<uint8_t>(ch.dst) + dst_off, as_ptr<const uint8_t>(ch.src) + src_off, bytes, tid,
       nthreads);
}

/* Collective: copies `bytes` from the peer's `dst` + dst_off to local `src` + src_off. */
MSCCLPP_DEVICE_INLINE void memory_get(const MemoryChannelDeviceHandle& ch, uint64_t dst_off,
                                      uint64_t src_off, uint64_t bytes, uint32_t tid,
                                      uint32_t nthreads) {
  copy(as_ptr<uint8_t>(ch.src) + src_off, as_ptr<const uint8_t>(ch.dst) + dst_off, bytes, tid,
       nthreads);
}

/* Reads element `index` of type T of the peer's buffer (volatile; aligned, in range). T is a
 * scalar (integer, floating point, pointer): C++ has no volatile copy of a struct. */
template <typename T>
MSCCLPP_DEVICE_INLINE T memory_read(const MemoryChannelDeviceHandle& ch, uint64_t index) {
  return as_ptr<const volatile T>(ch.dst)[index];
}

/* Writes element `index` of type T (a scalar) of the peer's buffer (volatile; aligned, in
 * range). */
template <typename T>
MSCCLPP_DEVICE_INLINE void memory_write(const MemoryChannelDeviceHandle& ch, uint64_t index,
                                        T value) {
  as_ptr<volatile T>(ch.dst)[index] = value;
}

/* Collective: `bytes` of local `src` + src_off become packets of type P (LL16Packet or
 * LL8Packet) carrying `flag` at the peer's `dst` + dst_off (the peer's packet buffer). */
template <typename P>
MSCCLPP_DEVICE_INLINE void memory_put_packets(const MemoryChannelDeviceHandle& ch,
                                              uint64_t dst_off, uint64_t src_off, uint64_t bytes,
                                              uint32_t tid, uint32_t nthreads, uint32_t flag) {
  put_packets<P>(reinterpret_cast<P*>(as_ptr<uint8_t>(ch.dst) + dst_off),
                 as_ptr<const uint8_t>(ch.src) + src_off, bytes, tid, nthreads, flag);
}

/* Collective: waits for packets of type P carrying `flag` at local `packet_buffer` + pkt_off and
 * writes their `bytes` of payload to local `src` + local_off. Returns 0 or the error code. */
template <typename P>
MSCCLPP_DEVICE_INLINE uint32_t memory_unpack_packets(const MemoryChannelDeviceHandle& ch,
                                                     uint64_t local_off, uint64_t pkt_off,
                                                     uint64_t bytes, uint32_t tid,
                                                     uint32_t nthreads, uint32_t flag) {
  return unpack_packets<P>(as_ptr<uint8_t>(ch.src) + local_off,
                           reinterpret_cast<const P*>(as_ptr<uint8_t>(ch.packet_buffer) + pkt_off),
                           bytes, tid, nthreads, flag, ch.semaphore.status);
}

/* See semaphore_signal. */
MSCCLPP_DEVICE_INLINE void memory_signal(const MemoryChannelDeviceHandle& ch) {
  semaphore_signal(ch.semaphore);
}

/* See semaphore_relaxed_signal. */
MSCCLPP_DEVICE_INLINE void memory_relaxed_signal(const MemoryChannelDeviceHandle& ch) {
  semaphore_relaxed_signal(ch.semaphore);
}

/* See semaphore_wait. */
MSCCLPP_DEVICE_INLINE uint32_t memory_wait(const MemoryChannelDeviceHandle& ch) {
  return semaphore_wait(ch.semaphore);
}

/* See semaphore_relaxed_wait. */
MSCCLPP_DEVICE_INLINE uint32_t memory_relaxed_wait(const MemoryChannelDeviceHandle& ch) {
  return semaphore_relaxed_wait(ch.semaphore);
}

/* See semaphore_poll. */
MSCCLPP_DEVICE_INLINE bool memory_poll(const MemoryChannelDeviceHandle& ch) {
  return semaphore_poll(ch.semaphore);
}

}  // namespace mscclpp

#endif /* MSCCLPP_DEVICE_CUH_ */
