// CUDA C++ kernels over mscclpp-rs channels: the twins of the Rust kernels
// port_ping_pong_kernel, memory_ping_pong_kernel and packet_ping_pong_kernel
// (device/src/kernels.rs), written against <mscclpp/device.cuh>.
//
// Each kernel is `extern "C"` (so its PTX entry point is its plain name) and takes ONE parameter
// struct from <mscclpp/layout.h> by value, exactly as the Rust kernels do: the Rust host program
// examples/04-cuda-c-kernel.rs fills PortPingPongParams / PingPongParams with handles built by
// the Rust host library and launches these kernels from the PTX this file compiles to:
//
//   nvcc -arch=sm_90 -ptx -I shared/include -o examples/cuda_c/port_and_memory.ptx
//        examples/cuda_c/port_and_memory.cu
//
// A kernel returns early when a wait gives up (abort or timeout); the device API has already
// recorded why in the DeviceStatus, where the host finds it.
#include <mscclpp/device.cuh>

// PortChannel ping-pong (launch 1 block of 1 thread or more; thread 0 works): each side puts
// `bytes` with a signal through its host proxy, flushing every put when `flush` is set, and
// waits for the peer's signal; role 0 starts. Ends with a flush, so every put has landed at the
// peer by the time the kernel returns.
extern "C" __global__ void cuda_c_port_ping_pong(PortPingPongParams p) {
  if (blockIdx.x != 0 || threadIdx.x != 0) {
    return;
  }
  const PortChannelDeviceHandle& ch = p.channel;
  for (uint32_t i = 0; i < p.iterations; ++i) {
    if (p.role != 0 && mscclpp::port_wait(ch) != MSCCLPP_DEVICE_ERROR_NONE) {
      return;
    }
    const uint32_t rc = p.flush != 0
                            ? mscclpp::port_put_with_signal_and_flush(ch, 0, 0, p.bytes)
                            : mscclpp::port_put_with_signal(ch, 0, 0, p.bytes);
    if (rc != MSCCLPP_DEVICE_ERROR_NONE) {
      return;
    }
    if (p.role == 0 && mscclpp::port_wait(ch) != MSCCLPP_DEVICE_ERROR_NONE) {
      return;
    }
  }
  (void)mscclpp::port_flush(ch);
}

// One direction of a MemoryChannel round: every thread of the block copies its share into the
// peer's buffer, then thread 0 signals (release: the block's writes are ordered before it by the
// barrier, and before the token by the red.release.sys).
__device__ __forceinline__ void memory_send(const PingPongParams& p) {
  mscclpp::memory_put(p.channel, 0, 0, p.bytes, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    mscclpp::memory_signal(p.channel);
  }
}

// Thread 0 waits for the peer's token; the block follows. False when the wait gave up.
__device__ __forceinline__ bool memory_recv(const PingPongParams& p) {
  __shared__ uint32_t ok;
  if (threadIdx.x == 0) {
    ok = mscclpp::memory_wait(p.channel) == MSCCLPP_DEVICE_ERROR_NONE ? 1u : 0u;
  }
  __syncthreads();
  const bool result = ok != 0u;
  __syncthreads();
  return result;
}

// MemoryChannel ping-pong (launch 1 block): role 0 puts `bytes` into the peer's buffer and
// signals; role 1 waits and answers the same way; `iterations` round trips.
extern "C" __global__ void cuda_c_memory_ping_pong(PingPongParams p) {
  for (uint32_t i = 0; i < p.iterations; ++i) {
    if (p.role == 0) {
      memory_send(p);
      if (!memory_recv(p)) {
        return;
      }
    } else {
      if (!memory_recv(p)) {
        return;
      }
      memory_send(p);
    }
  }
}

// LL-packet ping-pong (launch 1 block): role 0 writes `bytes` of its buffer as packets of type P
// into the peer's packet buffer (the channel's dst) and waits for the answer in its own packet
// buffer; role 1 unpacks what it receives into its buffer and sends it back. Round i uses the
// flag flag_base + i + 1, so every use of a packet buffer has a fresh flag and no signal is
// needed: a packet with the expected flag carries its data. Both ranks end with role 0's bytes.
template <typename P>
__device__ __forceinline__ void packet_ping_pong(const PingPongParams& p) {
  const uint32_t t = threadIdx.x;
  const uint32_t n = blockDim.x;
  for (uint32_t i = 0; i < p.iterations; ++i) {
    const uint32_t flag = p.flag_base + i + 1;
    if (p.role == 0) {
      mscclpp::memory_put_packets<P>(p.channel, 0, 0, p.bytes, t, n, flag);
      if (mscclpp::memory_unpack_packets<P>(p.channel, 0, 0, p.bytes, t, n, flag) !=
          MSCCLPP_DEVICE_ERROR_NONE) {
        return;
      }
    } else {
      if (mscclpp::memory_unpack_packets<P>(p.channel, 0, 0, p.bytes, t, n, flag) !=
          MSCCLPP_DEVICE_ERROR_NONE) {
        return;
      }
      __syncthreads();
      mscclpp::memory_put_packets<P>(p.channel, 0, 0, p.bytes, t, n, flag);
    }
    __syncthreads();
  }
}

// 16-byte packets: two 4-byte payloads, each with its flag, in one 16-byte store.
extern "C" __global__ void cuda_c_ll16_ping_pong(PingPongParams p) {
  packet_ping_pong<LL16Packet>(p);
}

// 8-byte packets: one 4-byte payload and its flag in one 8-byte store.
extern "C" __global__ void cuda_c_ll8_ping_pong(PingPongParams p) {
  packet_ping_pong<LL8Packet>(p);
}
