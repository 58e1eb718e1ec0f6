// Where an LL16 all-reduce's time goes, by size (2 GPUs of one process, f16 sum, CUDA-graph replay
// of 50 launches): a minimal LL16 kernel whose blocks record, per launch, when they start, when
// they have issued their packets, when their packets from the peer have all arrived, and when
// they end (thread 0, after a block barrier each time; %clock64 for spans inside a block,
// %globaltimer across blocks and launches). Prints medians over launches and blocks: the spans
// inside a block, the launch's span (first start to last end over its blocks) and the gap
// from one launch's last end to the next launch's first start; and the same for four ways of
// advancing the launch's flag (`scheme` below).
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 -o ll_timeline benchmarks/harness/ll_timeline.cu
//   ./ll_timeline
// Used for the fifth session's all-gather/all-reduce 8 vs 16 KiB question in BENCHMARKS.md.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_fp16.h>
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); exit(1);} } while (0)

constexpr int ITERS = 50, MAXB = 128;

__device__ __forceinline__ uint32_t add2(uint32_t a, uint32_t b) {
  __half2 x = *(__half2*)&a, y = *(__half2*)&b; __half2 z = __hadd2(x, y); return *(uint32_t*)&z;
}
__device__ __forceinline__ void st_v4(uint4* p, uint4 v) { asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory"); }
__device__ __forceinline__ uint4 ld_v4(const uint4* p) { uint4 v; asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ unsigned long long gtime() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

struct Args { const uint2* in; uint2* out; uint4* peer; const uint4* mine; unsigned long long* counter; size_t npk; size_t cap_pk; unsigned long long* ts; int sleep_ns; int scheme; };

// How a launch advances the flag (counter[0]: flag of the last launch, counter[1]: a count):
//   0 end-count: every block fences and counts itself at its end; the last one stores the flag.
//   1 start-count (the library's LL kernels): every block counts itself after reading the flag
//     (thread 0: fence, atomicAdd whose result waits for the end); at the end the block that
//     counted last fences and stores the flag.
//   2 keeper: one extra block (the last) only waits until every other block has counted itself
//     (red.release at their start) and stores the flag; the working blocks do nothing at the end.
//   3 start-red: blocks count with red.release at their start; at the end each block's thread 0
//     loads the count with acquire and, if every block has counted, stores the flag.
__device__ __forceinline__ void red_release(unsigned long long* p) { asm volatile("red.release.gpu.global.add.u64 [%0], 1;" :: "l"(p) : "memory"); }
__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long* p) { unsigned long long v; asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }

// ts[(iter * MAXB + block) * 8 + k]: k 0..3 clock64 at start / sent / received / end, 4..7 the same in globaltimer ns.
__global__ void ll16_timed(Args a) {
  unsigned long long c0 = clock64(), g0 = gtime();
  uint32_t flag = (uint32_t)*(volatile unsigned long long*)a.counter + 1;
  unsigned workers = a.scheme == 2 && gridDim.x > 1 ? gridDim.x - 1 : gridDim.x;
  unsigned long long place = 0;
  if (gridDim.x > 1 && a.scheme != 0) {
    __syncthreads();
    if (a.scheme == 2 && blockIdx.x == workers) {
      if (threadIdx.x == 0) {
        while (ld_acquire(&a.counter[1]) != workers) {}
        a.counter[1] = 0; *(volatile unsigned long long*)&a.counter[0] = flag;
      }
      return;
    }
    if (threadIdx.x == 0) {
      if (a.scheme == 1) { __threadfence(); place = atomicAdd(&a.counter[1], 1ull); }
      else red_release(&a.counter[1]);
    }
  }
  size_t half = (flag & 1) * a.cap_pk;
  size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, nt = (size_t)workers * blockDim.x;
  for (size_t i = tid; i < a.npk; i += nt) { uint2 w = a.in[i]; st_v4(a.peer + half + i, make_uint4(w.x, flag, w.y, flag)); }
  __syncthreads();
  unsigned long long c1 = clock64(), g1 = gtime();
  for (size_t i = tid; i < a.npk; i += nt) {
    uint4 v;
    for (;;) { v = ld_v4(a.mine + half + i); if (v.y == flag && v.w == flag) break; if (a.sleep_ns) __nanosleep(a.sleep_ns); }
    uint2 w = a.in[i];
    a.out[i] = make_uint2(add2(w.x, v.x), add2(w.y, v.z));
  }
  __syncthreads();
  unsigned long long c2 = clock64(), g2 = gtime();
  if (threadIdx.x == 0) {
    if (gridDim.x == 1) { a.counter[0] = flag; }
    else if (a.scheme == 0) {
      __threadfence();
      unsigned long long d = atomicAdd(&a.counter[1], 1ull);
      if (d + 1 == gridDim.x) { a.counter[1] = 0; *(volatile unsigned long long*)&a.counter[0] = flag; }
    } else if (a.scheme == 1) {
      if (place + 1 == gridDim.x) { __threadfence(); a.counter[1] = 0; *(volatile unsigned long long*)&a.counter[0] = flag; }
    } else if (a.scheme == 3) {
      if (ld_acquire(&a.counter[1]) == gridDim.x) { a.counter[1] = 0; *(volatile unsigned long long*)&a.counter[0] = flag; }
    }
    unsigned long long c3 = clock64(), g3 = gtime();
    if (blockIdx.x < MAXB) {
      unsigned long long* t = a.ts + ((flag % ITERS) * MAXB + blockIdx.x) * 8;
      t[0] = c0; t[1] = c1; t[2] = c2; t[3] = c3; t[4] = g0; t[5] = g1; t[6] = g2; t[7] = g3;
    }
  }
}

static double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v.empty() ? 0 : v[v.size() / 2]; }

int main() {
  size_t cap = 1 << 20;
  void *in[2], *out[2], *scr[2]; unsigned long long *ctr[2], *ts[2];
  cudaStream_t st[2];
  int clk_khz = 0; CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0));
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d)); CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&in[d], cap)); CK(cudaMalloc(&out[d], cap)); CK(cudaMalloc(&scr[d], 4 * cap));
    CK(cudaMalloc(&ctr[d], 16)); CK(cudaMalloc(&ts[d], ITERS * MAXB * 8 * 8));
    CK(cudaMemset(scr[d], 0, 4 * cap)); CK(cudaMemset(ctr[d], 0, 16));
    std::vector<__half> h(cap / 2); for (size_t i = 0; i < h.size(); i++) h[i] = __float2half((float)((i * 3 + d) % 11));
    CK(cudaMemcpy(in[d], h.data(), cap, cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
  }
  printf("# clock rate attribute %d kHz; spans in ns (clock64 spans converted at that rate; g = globaltimer)\n", clk_khz);
  printf("# %6s %7s %6s %7s %5s | %8s %8s %8s | %8s %8s %8s | %9s %8s | %8s\n", "scheme", "bytes", "blocks", "threads", "sleep",
         "send", "recv", "finish", "g_send", "g_recv", "g_fin", "launch", "gap", "per_iter");
  struct Shape { size_t bytes; int threads; int sleep; int scheme; };
  std::vector<Shape> shapes;
  for (size_t b : {4096ul, 8192ul, 16384ul, 32768ul, 65536ul, 262144ul}) for (int sc : {0, 1, 2, 3}) shapes.push_back({b, 256, 0, sc});
  for (size_t b : {4096ul}) shapes.push_back({b, 512, 0, 0});
  for (auto sh : shapes) {
    size_t npk = sh.bytes / 8;
    int threads = sh.threads;
    int blocks = (int)std::max<size_t>(1, (npk + threads - 1) / threads);
    if (sh.scheme == 2 && blocks > 1) blocks += 1;  // the keeper
    if (blocks > MAXB) continue;
    Args a[2];
    for (int d = 0; d < 2; d++) a[d] = Args{(const uint2*)in[d], (uint2*)out[d], (uint4*)scr[1 - d], (const uint4*)scr[d], ctr[d], npk, cap / 8, ts[d], sh.sleep, sh.scheme};
    cudaGraphExec_t ge[2];
    for (int d = 0; d < 2; d++) {
      CK(cudaSetDevice(d));
      cudaGraph_t g;
      CK(cudaStreamBeginCapture(st[d], cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < ITERS; i++) ll16_timed<<<blocks, threads, 0, st[d]>>>(a[d]);
      CK(cudaStreamEndCapture(st[d], &g));
      CK(cudaGraphInstantiate(&ge[d], g, 0));
    }
    double per_iter = 0;
    for (int rep = 0; rep < 6; rep++) {
      cudaEvent_t e0, e1; CK(cudaSetDevice(0)); CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
      CK(cudaEventRecord(e0, st[0]));
      for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaGraphLaunch(ge[d], st[d])); }
      CK(cudaSetDevice(0)); CK(cudaEventRecord(e1, st[0]));
      for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaStreamSynchronize(st[d])); }
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); per_iter = ms * 1e3 / ITERS;
    }
    // Rank 0's timestamps of the last replay.
    std::vector<unsigned long long> h(ITERS * MAXB * 8);
    CK(cudaSetDevice(0)); CK(cudaMemcpy(h.data(), ts[0], h.size() * 8, cudaMemcpyDeviceToHost));
    unsigned long long f; CK(cudaMemcpy(&f, ctr[0], 8, cudaMemcpyDeviceToHost));
    double ns_per_clk = 1e6 / clk_khz;
    std::vector<double> send, recv, fin, gs, gr, gf, span, gap;
    std::vector<std::pair<unsigned long long, unsigned long long>> it;  // (first start, last end) per launch, in flag order
    for (unsigned long long fl = f - ITERS + 1; fl <= f; fl++) {
      unsigned long long lo = ~0ull, hi = 0;
      int tb = sh.scheme == 2 && blocks > 1 ? blocks - 1 : blocks;
      for (int b = 0; b < tb; b++) {
        unsigned long long* t = &h[((fl % ITERS) * MAXB + b) * 8];
        send.push_back((t[1] - t[0]) * ns_per_clk); recv.push_back((t[2] - t[1]) * ns_per_clk); fin.push_back((t[3] - t[2]) * ns_per_clk);
        gs.push_back((double)(t[5] - t[4])); gr.push_back((double)(t[6] - t[5])); gf.push_back((double)(t[7] - t[6]));
        lo = std::min(lo, t[4]); hi = std::max(hi, t[7]);
      }
      it.push_back({lo, hi});
    }
    for (size_t i = 0; i < it.size(); i++) { span.push_back((double)(it[i].second - it[i].first)); if (i + 1 < it.size()) gap.push_back((double)it[i + 1].first - (double)it[i].second); }
    printf("  %6d %7zu %6d %7d %5d | %8.0f %8.0f %8.0f | %8.0f %8.0f %8.0f | %9.0f %8.0f | %8.0f\n", sh.scheme, sh.bytes, blocks, threads, sh.sleep,
           med(send), med(recv), med(fin), med(gs), med(gr), med(gf), med(span), med(gap), per_iter * 1e3);
    // check rank 0's output
    std::vector<__half> o(sh.bytes / 2); CK(cudaMemcpy(o.data(), out[0], sh.bytes, cudaMemcpyDeviceToHost));
    size_t bad = 0; for (size_t i = 0; i < o.size(); i++) if (__half2float(o[i]) != (float)((i * 3) % 11 + (i * 3 + 1) % 11)) bad++;
    if (bad) printf("    ^ %zu wrong\n", bad);
  }
  return 0;
}
