// LL all-reduce harness (2 GPUs of one process, f16 sum, out of place, CUDA-graph replay of 50
// launches, median of 10): a minimal LL16 kernel, a put + system fence + per-block flag kernel,
// a minimal LL128 kernel (shapes: steps per warp x threads per block),
// and any kernel of ours taking CollectiveParams, loaded from PTX files given as
// `file.ptx[:kernel]` (default kernel ll_all_reduce_kernel), e.g. the PTX the build embeds
// (target/release/build/mscclpp-*/out/mscclpp_device.ptx), or `:ll_collective_any_kernel`
// (`ll_collective_kernel` leaves its all-reduce to those two since the `_any` kernels came,
// and records InvalidArgument for one).
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 -I shared/include -o ll_harness benchmarks/harness/ll_harness.cu -lcuda
//   ./ll_harness mscclpp_device.ptx:ll_all_reduce_kernel
// Used for the fourth session's LL measurements in BENCHMARKS.md.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <chrono>
#include <cuda_fp16.h>
#include <cuda.h>
#include "mscclpp/layout.h"
#include <fstream>
#include <sstream>
#include <string>
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); exit(1);} } while (0)

__device__ __forceinline__ uint32_t add2(uint32_t a, uint32_t b) {
  __half2 x = *(__half2*)&a, y = *(__half2*)&b; __half2 z = __hadd2(x, y); return *(uint32_t*)&z;
}
__device__ __forceinline__ void st_v4(uint4* p, uint4 v) { asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory"); }
__device__ __forceinline__ uint4 ld_v4(const uint4* p) { uint4 v; asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory"); return v; }

struct Args { const uint4* in; uint4* out; uint4* peer; const uint4* mine; uint64_t* peer_flags; uint64_t* my_flags; unsigned long long* counter; size_t nvec; size_t cap_vec; };

__device__ __forceinline__ void finish(unsigned long long* counter, uint32_t flag) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (gridDim.x == 1) { counter[0] = flag; return; }
    __threadfence();
    unsigned long long d = atomicAdd(&counter[1], 1ull);
    if (d + 1 == gridDim.x) { counter[1] = 0; *(volatile unsigned long long*)&counter[0] = flag; }
  }
}

// LL16: 8 bytes of payload per 16-byte packet, one packet per thread-iteration.
__global__ void ll16(Args a) {
  uint32_t flag = (uint32_t)*(volatile unsigned long long*)a.counter + 1;
  size_t half = (flag & 1) * a.cap_vec * 2;  // packets
  size_t npk = a.nvec * 2;
  const uint2* in2 = (const uint2*)a.in;
  size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, nt = (size_t)gridDim.x * blockDim.x;
  for (size_t i = tid; i < npk; i += nt) { uint2 w = in2[i]; st_v4(a.peer + half + i, make_uint4(w.x, flag, w.y, flag)); }
  for (size_t i = tid; i < npk; i += nt) {
    uint4 v; 
    do { v = ld_v4(a.mine + half + i); } while (v.y != flag || v.w != flag);
    uint2 w = in2[i];
    ((uint2*)a.out)[i] = make_uint2(add2(w.x, v.x), add2(w.y, v.z));
  }
  finish(a.counter, flag);
}

// put + flag: each block copies its slice, fences (system), raises its flag in the peer, waits for the peer's flag, reduces.
__global__ void putflag(Args a) {
  uint32_t flag = (uint32_t)*(volatile unsigned long long*)a.counter + 1;
  size_t half = (flag & 1) * a.cap_vec;
  size_t per = (a.nvec + gridDim.x - 1) / gridDim.x;
  size_t s = blockIdx.x * per, e = min(a.nvec, s + per);
  uint4 keep[4]; int nk = 0;
  for (size_t i = s + threadIdx.x; i < e; i += blockDim.x) { uint4 v = a.in[i]; if (nk < 4) keep[nk++] = v; a.peer[half + i] = v; }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    *(volatile uint64_t*)&a.peer_flags[(flag & 1) * 1024 + blockIdx.x] = flag;
    while (*(volatile uint64_t*)&a.my_flags[(flag & 1) * 1024 + blockIdx.x] != flag) {}
    __threadfence_system();
  }
  __syncthreads();
  int k = 0;
  for (size_t i = s + threadIdx.x; i < e; i += blockDim.x) {
    uint4 v = k < 4 ? keep[k] : a.in[i]; k++;
    uint4 w = ld_v4(a.mine + half + i);
    a.out[i] = make_uint4(add2(v.x, w.x), add2(v.y, w.y), add2(v.z, w.z), add2(v.w, w.w));
  }
  finish(a.counter, flag);
}

// LL128: 128-byte lines, each written by 8 lanes with one 16-byte store apiece; the last 8 bytes
// of a line are the flag, so a line carries 120 data bytes and a warp moves 4 lines (480 data
// bytes) per step. Relies on a warp's 128-byte-aligned store reaching the peer whole (as NCCL's
// LL128 does on NVLink). Data lanes take 16 contiguous bytes of the step's 480, flag lanes 8 of
// the last 32. Every warp first sends U steps, then receives them.
template <int U>
__global__ void ll128(Args a, size_t bytes) {
  uint32_t flag = (uint32_t)*(volatile unsigned long long*)a.counter + 1;
  size_t half = (flag & 1) * 2 * a.cap_vec;  // uint4 units; a half holds 2 MiB of lines
  size_t steps = (bytes + 479) / 480;
  int lane = threadIdx.x & 31; bool fl = (lane & 7) == 7;
  size_t off = fl ? 448 + 8 * (lane >> 3) : 16 * (lane - (lane >> 3));
  size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5, nw = ((size_t)gridDim.x * blockDim.x) >> 5;
  const char* in = (const char*)a.in;
  for (size_t g0 = w; g0 < steps; g0 += nw * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      size_t g = g0 + u * nw;
      if (g < steps) {
        if (fl) { uint2 d = *(const uint2*)(in + g * 480 + off); v[u] = make_uint4(d.x, d.y, flag, flag); }
        else v[u] = *(const uint4*)(in + g * 480 + off);
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) { size_t g = g0 + u * nw; if (g < steps) st_v4(a.peer + half + g * 32 + lane, v[u]); }
  }
  for (size_t g = w; g < steps; g += nw) {
    uint4 v;
    for (;;) { v = ld_v4(a.mine + half + g * 32 + lane); bool ok = !fl || (v.z == flag && v.w == flag); if (__all_sync(0xffffffffu, ok)) break; }
    char* out = (char*)a.out;
    if (fl) { uint2 d = *(const uint2*)(in + g * 480 + off); *(uint2*)(out + g * 480 + off) = make_uint2(add2(d.x, v.x), add2(d.y, v.y)); }
    else { uint4 d = *(const uint4*)(in + g * 480 + off); *(uint4*)(out + g * 480 + off) = make_uint4(add2(d.x, v.x), add2(d.y, v.y), add2(d.z, v.z), add2(d.w, v.w)); }
  }
  finish(a.counter, flag);
}

int main(int argc, char** argv) {
  size_t cap = 1 << 20;
  std::vector<std::string> ptxs; for (int i = 1; i < argc; i++) ptxs.push_back(argv[i]);
  void *in[2], *out[2], *scr[2]; uint64_t* flags[2]; unsigned long long* ctr[2];
  cudaStream_t st[2];
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d)); CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&in[d], cap + 4096)); CK(cudaMalloc(&out[d], cap + 4096)); CK(cudaMalloc(&scr[d], 4 * cap));
    CK(cudaMalloc(&flags[d], 2 * 1024 * 8)); CK(cudaMalloc(&ctr[d], 16));
    CK(cudaMemset(scr[d], 0, 4 * cap)); CK(cudaMemset(flags[d], 0, 2 * 1024 * 8)); CK(cudaMemset(ctr[d], 0, 16));
    std::vector<__half> h(cap / 2); for (size_t i = 0; i < h.size(); i++) h[i] = __float2half((float)((i * 3 + d) % 11));
    CK(cudaMemcpy(in[d], h.data(), cap, cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
  }
  // ours: one module per PTX file per device, LL scratch of 2 halves x 2 slots x 2 MiB, channel table row 0.
  size_t slot = 2 << 20;
  void* oscr[2]; void* otab[2]; void* oflags[2]; std::vector<CUfunction> ofn[2];
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d)); CK(cudaMalloc(&oscr[d], 4 * slot)); CK(cudaMemset(oscr[d], 0, 4 * slot)); CK(cudaMalloc(&otab[d], 2 * sizeof(MemoryChannelDeviceHandle))); CK(cudaMalloc(&oflags[d], 16)); CK(cudaMemset(oflags[d], 0, 16));
    for (auto& spec : ptxs) {
      std::string f = spec, kn = "ll_all_reduce_kernel";
      auto c = spec.find(':'); if (c != std::string::npos) { f = spec.substr(0, c); kn = spec.substr(c + 1); }
      std::ifstream in(f); std::stringstream ss; ss << in.rdbuf(); std::string src = ss.str();
      CUmodule m; CUresult r = cuModuleLoadData(&m, src.c_str()); if (r) { printf("load %s: %d\n", f.c_str(), r); exit(1); }
      CUfunction fn; if (cuModuleGetFunction(&fn, m, kn.c_str())) { printf("no fn\n"); exit(1); }
      ofn[d].push_back(fn);
    }
  }
  for (int d = 0; d < 2; d++) {
    MemoryChannelDeviceHandle tab[2] = {}; tab[1 - d].dst = (uint64_t)oscr[1 - d];
    CK(cudaSetDevice(d)); CK(cudaMemcpy(otab[d], tab, sizeof tab, cudaMemcpyHostToDevice));
  }
  const int K = 3;  // built-in kernels: ll16, putflag, ll128
  for (int kind = 0; kind < K + (int)ptxs.size(); kind++)
  for (size_t bytes : {16384ul, 65536ul, 262144ul, 1048576ul}) {
    std::vector<std::pair<int,int>> shapes;
    if (kind == 0) shapes = {{0,256}}; else if (kind >= K) shapes = {{0,256},{0,512},{0,128}}; else if (kind == 2) shapes = {{1,256},{2,256},{4,256},{1,512},{2,512},{1,1024}}; else shapes = {{16,512},{64,512}};
    for (auto sh : shapes) {
      int threads = sh.second;
      int blocks = kind == 2 ? (int)std::max<size_t>(1, std::min<size_t>(132 * 4, ((bytes + 479) / 480 + (threads / 32) * sh.first - 1) / ((threads / 32) * sh.first)))
                 : kind != 1 ? (int)std::min<size_t>(512, (bytes / 8 + threads - 1) / threads) : sh.first;
      CollectiveParams op[2];
      for (int d = 0; d < 2; d++) {
        op[d] = CollectiveParams{};
        op[d].channels = (uint64_t)otab[d]; op[d].input = (uint64_t)in[d]; op[d].output = (uint64_t)out[d];
        op[d].scratch = (uint64_t)oscr[d]; op[d].bytes = bytes; op[d].ll_flags = (uint64_t)oflags[d];
        op[d].ll_slot_bytes = slot; op[d].stage_offset = 4 * slot; op[d].stride = bytes;
        op[d].dtype = 1; op[d].op = 0; op[d].mode = MSCCLPP_MODE_ALL_REDUCE; op[d].rank = d; op[d].nranks = 2; op[d].max_blocks = 1;
      }
      if (kind == 1 && (size_t)blocks * 16 > bytes) continue;
      Args a[2];
      for (int d = 0; d < 2; d++) a[d] = Args{(const uint4*)in[d], (uint4*)out[d], (uint4*)scr[1 - d], (const uint4*)scr[d], flags[1 - d], flags[d], ctr[d], bytes / 16, cap / 16};
      cudaGraphExec_t ge[2];
      int per_graph = 50;
      for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st[d], cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < per_graph; i++) {
          if (kind == 0) ll16<<<blocks, threads, 0, st[d]>>>(a[d]);
          else if (kind == 1) putflag<<<blocks, threads, 0, st[d]>>>(a[d]);
          else if (kind == 2 && sh.first == 1) ll128<1><<<blocks, threads, 0, st[d]>>>(a[d], bytes);
          else if (kind == 2 && sh.first == 2) ll128<2><<<blocks, threads, 0, st[d]>>>(a[d], bytes);
          else if (kind == 2) ll128<4><<<blocks, threads, 0, st[d]>>>(a[d], bytes);
          else { void* args[] = {&op[d]}; if (cuLaunchKernel(ofn[d][kind - K], blocks, 1, 1, threads, 1, 1, 0, st[d], args, nullptr)) { printf("launch failed\n"); exit(1); } }
        }
        CK(cudaStreamEndCapture(st[d], &g));
        CK(cudaGraphInstantiate(&ge[d], g, 0));
      }
      std::vector<double> ts;
      for (int rep = 0; rep < 12; rep++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaGraphLaunch(ge[d], st[d])); }
        for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaStreamSynchronize(st[d])); }
        auto t1 = std::chrono::steady_clock::now();
        if (rep >= 2) ts.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / per_graph);
      }
      std::sort(ts.begin(), ts.end());
      // check
      std::vector<__half> h(bytes / 2); CK(cudaSetDevice(0)); CK(cudaMemcpy(h.data(), out[0], bytes, cudaMemcpyDeviceToHost));
      size_t bad = 0; for (size_t i = 0; i < h.size(); i++) if (__half2float(h[i]) != (float)((i * 3) % 11 + (i * 3 + 1) % 11)) bad++;
      printf("%s %8zu B  blocks %4d threads %4d: %7.2f us (min %7.2f) bad %zu\n", kind == 0 ? "ll16   " : kind == 1 ? "putflag" : kind == 2 ? "ll128  " : ptxs[kind - K].c_str(), bytes, blocks, threads, ts[ts.size() / 2], ts[0], bad);
    }
  }
  return 0;
}
