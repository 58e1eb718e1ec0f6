// What one GPU does when several ranks share it (issue 29): a probe, not part of the library.
//
// Every experiment launches kernels that spin on a word another kernel writes, with a device
// time budget (so nothing hangs: a kernel that gives up records it), and times what the host
// does meanwhile. Build and run on the GPU machine:
//
//   nvcc -O2 -arch=sm_90 -o /tmp/probe scripts/gpu-probe/shared_gpu.cu -lcuda -lpthread
//   /tmp/probe threads            # host calls made while another thread's kernel spins
//   /tmp/probe queues N           # N streams, two kernels each, a barrier across the first ones
//   /tmp/probe procs N ROUNDS     # N processes on the GPU, a ring of ROUNDS hand-offs (IPC)
//
// Output: one line per experiment, `name: value` pairs.
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                          \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                   \
        }                                                                              \
    } while (0)
#define CKD(x)                                                                         \
    do {                                                                               \
        CUresult r_ = (x);                                                             \
        if (r_ != CUDA_SUCCESS) {                                                      \
            const char *s_ = "?";                                                      \
            cuGetErrorString(r_, &s_);                                                 \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);             \
            exit(2);                                                                   \
        }                                                                              \
    } while (0)

static double now_ms() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

__device__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Waits until *word >= want or budget_ns pass; result[0] = 1 if it saw the word, 2 if it gave up.
extern "C" __global__ void spin(volatile unsigned long long *word, unsigned long long want,
                                unsigned long long budget_ns, int *result) {
    unsigned long long t0 = gtime();
    while (*word < want) {
        if (gtime() - t0 > budget_ns) {
            *result = 2;
            return;
        }
    }
    *result = 1;
}

extern "C" __global__ void set_word(unsigned long long *word, unsigned long long v) {
    __threadfence_system();
    *(volatile unsigned long long *)word = v;
    __threadfence_system();
}

// Kernel i of a barrier of n: marks itself, then waits for all (budget); result[i] as spin's.
extern "C" __global__ void barrier_k(volatile unsigned int *arrived, int i, int n,
                                     unsigned long long budget_ns, int *result) {
    arrived[i] = 1;
    __threadfence_system();
    unsigned long long t0 = gtime();
    for (int j = 0; j < n; j++) {
        while (arrived[j] == 0) {
            if (gtime() - t0 > budget_ns) {
                result[i] = 2;
                return;
            }
        }
    }
    result[i] = 1;
}

extern "C" __global__ void nop() {}

static const unsigned long long BUDGET = 3000000000ull;  // 3 s

// ---- threads: what blocks while another stream's kernel spins --------------------------------

struct Op {
    const char *name;
    void (*run)(void *);
    void *arg;
};

static void op_none(void *) {}
static void *g_freed;
static void op_free(void *) { CK(cudaFree(g_freed)); }
static void op_malloc_real(void *) {
    void *p;
    CK(cudaMalloc(&p, 64 << 20));
    g_freed = p;
}
static void op_host_alloc(void *) {
    void *p;
    CK(cudaHostAlloc(&p, 1 << 20, cudaHostAllocMapped | cudaHostAllocPortable));
    CK(cudaFreeHost(p));
}
static cudaStream_t g_other;
static void *g_buf;
static void op_memset(void *) {
    CK(cudaMemsetAsync(g_buf, 0, 1 << 20, g_other));
    CK(cudaStreamSynchronize(g_other));
}
static void op_memcpy(void *) {
    CK(cudaMemcpyAsync(g_buf, (char *)g_buf + (1 << 20), 1 << 20, cudaMemcpyDeviceToDevice,
                       g_other));
    CK(cudaStreamSynchronize(g_other));
}
static void op_stream_create(void *) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamDestroy(s));
}
static const char *g_ptx;
static void op_module_load(void *) {
    CUmodule m;
    CKD(cuModuleLoadData(&m, g_ptx));
    CUfunction f;
    CKD(cuModuleGetFunction(&f, m, "nop"));
    // the module stays loaded (a second load of the same text is a new module)
}
static void op_func_load(void *) {
    CUmodule m;
    CKD(cuModuleLoadData(&m, g_ptx));
    CUfunction f;
    CKD(cuModuleGetFunction(&f, m, "nop"));
    CKD(cuFuncLoad(f));
}
static void op_launch_fresh(void *) {
    CUmodule m;
    CKD(cuModuleLoadData(&m, g_ptx));
    CUfunction f;
    CKD(cuModuleGetFunction(&f, m, "nop"));
    CKD(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, (CUstream)g_other, nullptr, nullptr));
    CK(cudaStreamSynchronize(g_other));
}
static void op_ctx_sync(void *) { CK(cudaDeviceSynchronize()); }
static void *g_host;
static void op_host_alloc_only(void *) {
    CK(cudaHostAlloc(&g_host, 1 << 20, cudaHostAllocMapped | cudaHostAllocPortable));
}
static void op_host_free_only(void *) { CK(cudaFreeHost(g_host)); }
static void op_memset_legacy_sync(void *) {
    CKD(cuMemsetD8((CUdeviceptr)g_buf, 0, 1 << 20));
    CKD(cuStreamSynchronize(nullptr));
}
static void op_memcpy_htod_sync(void *) {
    static char h[1 << 16];
    CKD(cuMemcpyHtoD((CUdeviceptr)g_buf, h, sizeof(h)));
}
static void op_memcpy_dtoh_sync(void *) {
    static char h[1 << 16];
    CKD(cuMemcpyDtoH(h, (CUdeviceptr)g_buf, sizeof(h)));
}
static void op_ipc_get(void *) {
    cudaIpcMemHandle_t h;
    CK(cudaIpcGetMemHandle(&h, g_buf));
}
static CUmodule g_mod;
static void op_module_load_prepare(void *) {}
static void op_module_unload(void *) { CKD(cuModuleUnload(g_mod)); }
static void *g_async;
static void op_free_async_of_malloc(void *) {
    cudaError_t e = cudaFreeAsync(g_async, g_other);
    printf("  (cudaFreeAsync of cudaMalloc memory: %s)\n", cudaGetErrorString(e));
    (void)cudaGetLastError();
}
static void op_malloc_async_free_async(void *) {
    void *p;
    CK(cudaMallocAsync(&p, 64 << 20, g_other));
    CK(cudaFreeAsync(p, g_other));
    CK(cudaStreamSynchronize(g_other));
}
static void op_event(void *) {
    cudaEvent_t e;
    CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK(cudaEventRecord(e, g_other));
    CK(cudaEventSynchronize(e));
    CK(cudaEventDestroy(e));
}

// Launches every kernel of this file once, so that none is loaded lazily under a spinner.
static void warm_up() {
    unsigned long long *w;
    unsigned int *a;
    int *r;
    CK(cudaMalloc(&w, 8));
    CK(cudaMalloc(&a, 4));
    CK(cudaMallocHost(&r, 4));
    set_word<<<1, 1>>>(w, 0);
    spin<<<1, 1>>>(w, 0, BUDGET, r);
    barrier_k<<<1, 1>>>(a, 0, 1, BUDGET, r);
    nop<<<1, 1>>>();
    CK(cudaDeviceSynchronize());
}

static void threads_experiment() {
    CUmoduleLoadingMode mode;
    CKD(cuModuleGetLoadingMode(&mode));
    printf("loading_mode: %s\n", mode == CU_MODULE_LAZY_LOADING ? "lazy" : "eager");
    unsigned long long *word;
    int *result;
    CK(cudaMalloc(&word, 8));
    CK(cudaMallocHost(&result, 4));
    CK(cudaMalloc(&g_buf, 2 << 20));
    cudaStream_t a;
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&g_other, cudaStreamNonBlocking));
    Op ops[] = {
        {"nothing", op_none, nullptr},
        {"cudaMalloc_64MiB", op_malloc_real, nullptr},
        {"cudaFree", op_free, nullptr},
        {"cudaHostAlloc+Free", op_host_alloc, nullptr},
        {"memsetAsync_other_stream", op_memset, nullptr},
        {"memcpyDtoD_other_stream", op_memcpy, nullptr},
        {"stream_create_destroy", op_stream_create, nullptr},
        {"cuModuleLoadData+GetFunction", op_module_load, nullptr},
        {"cuModuleLoadData+cuFuncLoad", op_func_load, nullptr},
        {"load+first_launch", op_launch_fresh, nullptr},
        {"cudaHostAlloc_only", op_host_alloc_only, nullptr},
        {"cudaFreeHost_only", op_host_free_only, nullptr},
        {"cuMemsetD8+legacy_stream_sync", op_memset_legacy_sync, nullptr},
        {"cuMemcpyHtoD_sync", op_memcpy_htod_sync, nullptr},
        {"cuMemcpyDtoH_sync", op_memcpy_dtoh_sync, nullptr},
        {"cudaIpcGetMemHandle", op_ipc_get, nullptr},
        {"cuModuleUnload", op_module_unload, nullptr},
        {"cudaFreeAsync_of_cudaMalloc", op_free_async_of_malloc, nullptr},
        {"cudaMallocAsync+FreeAsync", op_malloc_async_free_async, nullptr},
        {"event_create_record_sync_destroy", op_event, nullptr},
        {"cudaDeviceSynchronize", op_ctx_sync, nullptr},
    };
    CKD(cuModuleLoadData(&g_mod, g_ptx));
    CK(cudaMalloc(&g_async, 1 << 20));
    (void)op_module_load_prepare;
    for (auto &op : ops) {
        CK(cudaMemset(word, 0, 8));
        CK(cudaDeviceSynchronize());
        *result = 0;
        spin<<<1, 1, 0, a>>>(word, 1, BUDGET, result);
        CK(cudaGetLastError());
        usleep(50000);
        double t0 = now_ms();
        op.run(op.arg);
        double took = now_ms() - t0;
        set_word<<<1, 1, 0, g_other>>>(word, 1);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(a));
        CK(cudaStreamSynchronize(g_other));
        printf("while_spinning %s: host_ms %.2f spinner %s\n", op.name, took,
               *result == 1 ? "released" : "timed_out");
    }
}

// ---- queues: N streams, K1_i (barrier) then K2_i (nop) each, issued in stream order ---------

static void queues_experiment(int n) {
    const char *conns = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    unsigned int *arrived;
    int *result;
    CK(cudaMalloc(&arrived, n * 4));
    CK(cudaMemset(arrived, 0, n * 4));
    CK(cudaMallocHost(&result, n * 4));
    memset(result, 0, n * 4);
    cudaStream_t *s = (cudaStream_t *)malloc(n * sizeof(cudaStream_t));
    for (int i = 0; i < n; i++) CK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
    CK(cudaDeviceSynchronize());
    double t0 = now_ms();
    for (int i = 0; i < n; i++) {
        barrier_k<<<1, 1, 0, s[i]>>>(arrived, i, n, BUDGET, result);
        nop<<<1, 1, 0, s[i]>>>();
    }
    CK(cudaDeviceSynchronize());
    double took = now_ms() - t0;
    int ok = 0;
    for (int i = 0; i < n; i++) ok += result[i] == 1;
    printf("queues streams %d max_connections %s: %d of %d met, %.1f ms\n", n,
           conns ? conns : "(default)", ok, n, took);
}

// ---- procs: N processes, a ring of hand-offs through one IPC-shared word --------------------

static void procs_experiment(int n, int rounds) {
    // The parent allocates the word and exports it; children open it (CUDA IPC within one GPU).
    cudaIpcMemHandle_t *h = (cudaIpcMemHandle_t *)mmap(nullptr, sizeof(*h) + 4096,
                                                       PROT_READ | PROT_WRITE,
                                                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    volatile int *ready = (volatile int *)((char *)h + sizeof(*h));
    double *times = (double *)((char *)h + sizeof(*h) + 64);
    *ready = 0;
    pid_t *pids = (pid_t *)malloc(n * sizeof(pid_t));
    for (int r = 0; r < n; r++) {
        pid_t p = fork();
        if (p == 0) {
            unsigned long long *word;
            if (r == 0) {
                CK(cudaMalloc(&word, 8));
                CK(cudaMemset(word, 0, 8));
                CK(cudaDeviceSynchronize());
                CK(cudaIpcGetMemHandle(h, word));
                __sync_synchronize();
                *ready = 1;
            } else {
                while (*ready == 0) usleep(1000);
                CK(cudaIpcOpenMemHandle((void **)&word, *h, cudaIpcMemLazyEnablePeerAccess));
            }
            warm_up();
            int *result;
            CK(cudaMallocHost(&result, 4));
            cudaStream_t s;
            CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            __sync_fetch_and_add(ready, 1);
            while (*ready < n + 1) usleep(1000);
            double t0 = now_ms();
            int failed = 0;
            // Hand-off k (k = 1..rounds*n) belongs to rank (k - 1) % n: it waits for word >=
            // k - 1, then writes k.
            for (int k = 1; k <= rounds * n; k++) {
                if ((k - 1) % n != r) continue;
                *result = 0;
                spin<<<1, 1, 0, s>>>(word, k - 1, 10 * BUDGET, result);
                set_word<<<1, 1, 0, s>>>(word, k);
                CK(cudaStreamSynchronize(s));
                if (*result != 1) failed++;
            }
            times[r] = now_ms() - t0;
            printf("procs rank %d of %d: %d hand-offs, %d timed out, %.1f ms, %.3f ms per hand-off\n",
                   r, n, rounds, failed, times[r], times[r] / (rounds * n));
            fflush(stdout);
            _exit(failed ? 1 : 0);
        }
        pids[r] = p;
    }
    int bad = 0;
    for (int r = 0; r < n; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    printf("procs %d: %s\n", n, bad ? "FAILED" : "ok");
}

int main(int argc, char **argv) {
    if (argc < 2) return 1;
    if (!strcmp(argv[1], "threads")) {
        // PTX of this file's nop for the module experiments.
        FILE *f = fopen(argc > 2 ? argv[2] : "/tmp/probe_nop.ptx", "rb");
        if (!f) {
            fprintf(stderr, "no ptx\n");
            return 1;
        }
        static char text[1 << 20];
        size_t len = fread(text, 1, sizeof(text) - 1, f);
        text[len] = 0;
        g_ptx = text;
        CK(cudaFree(0));
        warm_up();
        threads_experiment();
    } else if (!strcmp(argv[1], "queues")) {
        warm_up();
        queues_experiment(atoi(argv[2]));
    } else if (!strcmp(argv[1], "procs")) {
        procs_experiment(atoi(argv[2]), atoi(argv[3]));
    }
    return 0;
}
