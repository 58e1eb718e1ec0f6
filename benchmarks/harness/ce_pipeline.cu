// Prototype of the pipelined copy-engine all-reduce (2 GPUs of one process, f16 sum, in
// place; events between the GPUs where the library uses barrier kernels): copy each peer's
// piece into its scratch, reduce locally, copy the reduced piece back, on three streams.
//   nvcc -O3 -arch=sm_90 -std=c++17 -o ce_pipeline benchmarks/harness/ce_pipeline.cu
//   ./ce_pipeline BYTES PIECES SLOTS(0: no reuse) [ITERS] [REDUCE_BLOCKS]
// Used for the fourth session's shape sweep in BENCHMARKS.md.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <chrono>
#include <algorithm>
#include <cuda_fp16.h>
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); exit(1);} } while (0)

__global__ void reduce_add(uint4* acc, const uint4* src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 a = acc[i], b = src[i];
    __half2* ha = (__half2*)&a; __half2* hb = (__half2*)&b;
    for (int k = 0; k < 4; k++) ha[k] = __hadd2(ha[k], hb[k]);
    acc[i] = a;
  }
}
__global__ void fill(__half* x, size_t n, int r) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = __float2half((float)((i * 7 + r * 3) % 17));
}

int main(int argc, char** argv) {
  size_t bytes = (size_t)atoll(argv[1]);
  int K = atoi(argv[2]);       // pieces per half
  int R = atoi(argv[3]);       // ring slots (0: no ring, scratch = half)
  int iters = argc > 4 ? atoi(argv[4]) : 10;
  int blocks = argc > 5 ? atoi(argv[5]) : 132;
  size_t half = bytes / 2, piece = half / K;
  int slots = R ? R : K;
  void *x[2], *s[2];
  cudaStream_t A[2], B[2], C[2], M[2];
  std::vector<cudaEvent_t> evin[2], evfree[2], evout[2];
  cudaEvent_t start[2], fin[2];
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&x[d], bytes));
    CK(cudaMalloc(&s[d], piece * slots));
    CK(cudaStreamCreateWithFlags(&A[d], cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&B[d], cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&C[d], cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&M[d], cudaStreamNonBlocking));
    for (int k = 0; k < K; k++) {
      cudaEvent_t e; 
      CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); evin[d].push_back(e);
      CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); evfree[d].push_back(e);
      CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); evout[d].push_back(e);
    }
    CK(cudaEventCreateWithFlags(&start[d], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&fin[d], cudaEventDisableTiming));
    fill<<<1024, 256>>>((__half*)x[d], bytes / 2, d);
    CK(cudaDeviceSynchronize());
  }
  auto one = [&]() {
    for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaEventRecord(start[d], M[d])); }
    for (int d = 0; d < 2; d++) {
      CK(cudaSetDevice(d));
      // join: every stream starts after both mains (peer's previous call done)
      for (cudaStream_t st : {A[d], B[d], C[d]}) { CK(cudaStreamWaitEvent(st, start[0], 0)); CK(cudaStreamWaitEvent(st, start[1], 0)); }
    }
    for (int k = 0; k < K; k++) {
      for (int d = 0; d < 2; d++) {
        int p = 1 - d;
        CK(cudaSetDevice(d));
        // A: my input's peer-half piece k into peer's slot
        if (R && k >= R) CK(cudaStreamWaitEvent(A[d], evfree[p][k - R], 0));
        char* src = (char*)x[d] + p * half + k * piece;
        char* dst = (char*)s[p] + (k % slots) * piece;
        CK(cudaMemcpyAsync(dst, src, piece, cudaMemcpyDeviceToDevice, A[d]));
        CK(cudaEventRecord(evin[d][k], A[d]));
      }
      for (int d = 0; d < 2; d++) {
        int p = 1 - d;
        CK(cudaSetDevice(d));
        CK(cudaStreamWaitEvent(B[d], evin[p][k], 0));
        char* acc = (char*)x[d] + d * half + k * piece;
        char* src = (char*)s[d] + (k % slots) * piece;
        reduce_add<<<blocks, 512, 0, B[d]>>>((uint4*)acc, (const uint4*)src, piece / 16);
        CK(cudaEventRecord(evfree[d][k], B[d]));
        CK(cudaStreamWaitEvent(C[d], evfree[d][k], 0));
        char* out = (char*)x[p] + d * half + k * piece;
        CK(cudaMemcpyAsync(out, acc, piece, cudaMemcpyDeviceToDevice, C[d]));
        CK(cudaEventRecord(evout[d][k], C[d]));
      }
    }
    for (int d = 0; d < 2; d++) {
      CK(cudaSetDevice(d));
      CK(cudaStreamWaitEvent(M[d], evin[d][K - 1], 0));
      CK(cudaStreamWaitEvent(M[d], evout[0][K - 1], 0));
      CK(cudaStreamWaitEvent(M[d], evout[1][K - 1], 0));
      CK(cudaEventRecord(fin[d], M[d]));
    }
  };
  one(); 
  for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaDeviceSynchronize()); }
  // check after one call: value = f(i,0)+f(i,1)
  {
    std::vector<__half> h(bytes / 2);
    for (int d = 0; d < 2; d++) {
      CK(cudaSetDevice(d));
      CK(cudaMemcpy(h.data(), x[d], bytes, cudaMemcpyDeviceToHost));
      size_t bad = 0;
      for (size_t i = 0; i < bytes / 2; i += 997) {
        float want = (float)((i * 7) % 17) + (float)((i * 7 + 3) % 17);
        if (__half2float(h[i]) != want) bad++;
      }
      printf("dev%d check: %zu bad\n", d, bad);
    }
  }
  std::vector<double> ts;
  for (int it = 0; it < iters; it++) {
    auto t0 = std::chrono::steady_clock::now();
    for (int j = 0; j < 5; j++) one();
    for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaStreamSynchronize(M[d])); }
    auto t1 = std::chrono::steady_clock::now();
    ts.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 5);
  }
  std::sort(ts.begin(), ts.end());
  double med = ts[ts.size() / 2];
  printf("bytes %zu K %d R %d blocks %d: median %.1f us busbw %.1f GB/s\n", bytes, K, R, blocks, med, bytes / med / 1e3);
  return 0;
}
