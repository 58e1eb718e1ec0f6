/* nccl-percall: the per-call cost of NCCL's collectives through the C ABI, at world size 1, for
 * one or several libnccl.so.2 loaded by path (ours and NVIDIA's, same binary, same run).
 *
 * Every library is opened with dlopen (RTLD_LOCAL) and driven through the symbols it exports;
 * the CUDA runtime is opened with dlopen too, so this file needs no header but libc's and
 * builds with any C compiler: `cc -O2 -std=c11 -o nccl-percall percall.c -ldl`.
 *
 * For every library x collective x type x size x mode it times `--iters` calls `--reps` times
 * and prints one JSON line with the median microseconds per call (and the min and max):
 *   eager: `iters` calls queued on one stream, then the stream synchronized; the time of the
 *          whole divided by `iters` (the cost a caller sees once the queue is full: the host's
 *          cost per call or the device's, whichever is larger, as nccl-tests measures).
 *   graph: the same `iters` calls captured once into a CUDA graph (cudaStreamBeginCapture in
 *          the global mode, as PyTorch captures), then per repetition one cudaGraphLaunch and a
 *          synchronize, divided by `iters`.
 * Sizes are bytes of the receive buffer (nccl-tests' convention), from --min to --max by
 * factors of --step (the last size is --max itself).
 *
 * Without a CUDA runtime (or with --cpu) it runs on the CPU backend of mscclpp-rs's drop-in:
 * buffers are host memory, streams come from the library's mscclppCpuStreamCreate, and the
 * graph mode is skipped (a JSON line with "skipped" says so). That is the smoke test CI runs.
 *
 * Usage:
 *   nccl-percall --lib NAME=PATH [--lib NAME=PATH ...] [--ops all|LIST] [--dtypes LIST]
 *                [--modes eager,graph] [--min BYTES] [--max BYTES] [--step N] [--iters N]
 *                [--reps N] [--warmup N] [--cudart PATH] [--cpu] [--device N]
 * Ops: all_reduce (sum), all_reduce_avg, all_reduce_premulsum (a host scalar of 0.5),
 *      all_gather, reduce_scatter (sum), reduce_scatter_avg, reduce_scatter_premulsum,
 *      all_to_all, broadcast, reduce (sum). Types: float32, float16, bfloat16 (default
 *      float32). Sizes take K, M, G suffixes (powers of two).
 * Exit status: 0 when every measurement ran, 1 on a failed call, 2 on a usage error. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nres_t; /* ncclResult_t */
typedef struct { char internal[128]; } uid_t128;
typedef void *comm_t;
typedef void *stream_t;

/* ncclDataType_t and ncclRedOp_t values (nccl.h). */
enum { T_F16 = 6, T_F32 = 7, T_BF16 = 9 };
enum { OP_SUM = 0, OP_AVG = 4 };
enum { SCALAR_HOST = 1 };

/* The NCCL functions used, as the library exports them. */
typedef struct {
    const char *name;
    const char *path;
    void *h;
    nres_t (*get_version)(int *);
    nres_t (*get_unique_id)(uid_t128 *);
    nres_t (*comm_init_rank)(comm_t *, int, uid_t128, int);
    nres_t (*comm_destroy)(comm_t);
    const char *(*get_error_string)(nres_t);
    nres_t (*all_reduce)(const void *, void *, size_t, int, int, comm_t, stream_t);
    nres_t (*all_gather)(const void *, void *, size_t, int, comm_t, stream_t);
    nres_t (*reduce_scatter)(const void *, void *, size_t, int, int, comm_t, stream_t);
    nres_t (*all_to_all)(const void *, void *, size_t, int, comm_t, stream_t);
    nres_t (*broadcast)(const void *, void *, size_t, int, int, comm_t, stream_t);
    nres_t (*reduce)(const void *, void *, size_t, int, int, int, comm_t, stream_t);
    nres_t (*premul_create)(int *, void *, int, int, comm_t);
    nres_t (*premul_destroy)(int, comm_t);
    /* mscclpp-rs's CPU backend only. */
    nres_t (*cpu_stream_create)(void **);
    nres_t (*cpu_stream_sync)(void *);
    nres_t (*cpu_stream_destroy)(void *);
} lib_t;

/* The CUDA runtime functions used (cudaError_t is an int; 0 is success). */
typedef struct {
    void *h;
    int (*set_device)(int);
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memset_)(void *, int, size_t);
    int (*stream_create)(stream_t *, unsigned);
    int (*stream_destroy)(stream_t);
    int (*stream_sync)(stream_t);
    int (*begin_capture)(stream_t, int);
    int (*end_capture)(stream_t, void **);
    int (*graph_instantiate)(void **, void *, unsigned long long);
    int (*graph_launch)(void *, stream_t);
    int (*graph_exec_destroy)(void *);
    int (*graph_destroy)(void *);
    const char *(*error_string)(int);
} cudart_t;

static cudart_t rt;
static int on_cpu;

static void *sym(void *h, const char *name, int required, const char *from) {
    void *p = dlsym(h, name);
    if (!p && required) {
        fprintf(stderr, "nccl-percall: %s has no symbol %s\n", from, name);
        exit(1);
    }
    return p;
}

static void load_lib(lib_t *l) {
    l->h = dlopen(l->path, RTLD_NOW | RTLD_LOCAL);
    if (!l->h) {
        fprintf(stderr, "nccl-percall: cannot load %s: %s\n", l->path, dlerror());
        exit(1);
    }
#define NEED(f, s) *(void **)&l->f = sym(l->h, s, 1, l->path)
#define MAY(f, s) *(void **)&l->f = sym(l->h, s, 0, l->path)
    NEED(get_version, "ncclGetVersion");
    NEED(get_unique_id, "ncclGetUniqueId");
    NEED(comm_init_rank, "ncclCommInitRank");
    NEED(comm_destroy, "ncclCommDestroy");
    NEED(get_error_string, "ncclGetErrorString");
    NEED(all_reduce, "ncclAllReduce");
    NEED(all_gather, "ncclAllGather");
    NEED(reduce_scatter, "ncclReduceScatter");
    NEED(broadcast, "ncclBroadcast");
    NEED(reduce, "ncclReduce");
    MAY(all_to_all, "ncclAlltoAll");
    MAY(premul_create, "ncclRedOpCreatePreMulSum");
    MAY(premul_destroy, "ncclRedOpDestroy");
    MAY(cpu_stream_create, "mscclppCpuStreamCreate");
    MAY(cpu_stream_sync, "mscclppCpuStreamSynchronize");
    MAY(cpu_stream_destroy, "mscclppCpuStreamDestroy");
#undef NEED
#undef MAY
}

static int load_cudart(const char *path) {
    const char *names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};
    if (path) {
        rt.h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
        if (!rt.h) {
            fprintf(stderr, "nccl-percall: cannot load %s: %s\n", path, dlerror());
            exit(1);
        }
    }
    for (int i = 0; !rt.h && names[i]; i++) rt.h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (!rt.h) return 0;
#define RT(f, s) *(void **)&rt.f = sym(rt.h, s, 1, "the CUDA runtime")
    RT(set_device, "cudaSetDevice");
    RT(malloc_, "cudaMalloc");
    RT(free_, "cudaFree");
    RT(memset_, "cudaMemset");
    RT(stream_create, "cudaStreamCreateWithFlags");
    RT(stream_destroy, "cudaStreamDestroy");
    RT(stream_sync, "cudaStreamSynchronize");
    RT(begin_capture, "cudaStreamBeginCapture");
    RT(end_capture, "cudaStreamEndCapture");
    RT(graph_instantiate, "cudaGraphInstantiateWithFlags");
    RT(graph_launch, "cudaGraphLaunch");
    RT(graph_exec_destroy, "cudaGraphExecDestroy");
    RT(graph_destroy, "cudaGraphDestroy");
    RT(error_string, "cudaGetErrorString");
#undef RT
    return 1;
}

static void cuda_ok(int e, const char *what) {
    if (e != 0) {
        fprintf(stderr, "nccl-percall: %s: %s\n", what, rt.error_string(e));
        exit(1);
    }
}

static void nccl_ok(const lib_t *l, nres_t r, const char *what) {
    if (r != 0) {
        fprintf(stderr, "nccl-percall: %s (%s): %s\n", what, l->name, l->get_error_string(r));
        exit(1);
    }
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST, REDUCE } coll_t;
typedef enum { R_NONE, R_SUM, R_AVG, R_PREMUL } red_t;

static const struct {
    const char *name;
    coll_t coll;
    red_t red;
} OPS[] = {
    {"all_reduce", ALL_REDUCE, R_SUM},
    {"all_reduce_avg", ALL_REDUCE, R_AVG},
    {"all_reduce_premulsum", ALL_REDUCE, R_PREMUL},
    {"all_gather", ALL_GATHER, R_NONE},
    {"reduce_scatter", REDUCE_SCATTER, R_SUM},
    {"reduce_scatter_avg", REDUCE_SCATTER, R_AVG},
    {"reduce_scatter_premulsum", REDUCE_SCATTER, R_PREMUL},
    {"all_to_all", ALL_TO_ALL, R_NONE},
    {"broadcast", BROADCAST, R_NONE},
    {"reduce", REDUCE, R_SUM},
};
#define NOPS (sizeof OPS / sizeof OPS[0])

static const struct {
    const char *name;
    int type;
    size_t size;
    uint32_t half; /* 0.5 as one element */
} TYPES[] = {
    {"float32", T_F32, 4, 0x3f000000u},
    {"float16", T_F16, 2, 0x3800u},
    {"bfloat16", T_BF16, 2, 0x3f00u},
};
#define NTYPES (sizeof TYPES / sizeof TYPES[0])

/* One call of `op` on `l`: `count` elements per rank (world size 1: per part too). */
static nres_t call(const lib_t *l, coll_t coll, int redop, int type, const void *send,
                   void *recv, size_t count, comm_t comm, stream_t s) {
    switch (coll) {
    case ALL_REDUCE: return l->all_reduce(send, recv, count, type, redop, comm, s);
    case ALL_GATHER: return l->all_gather(send, recv, count, type, comm, s);
    case REDUCE_SCATTER: return l->reduce_scatter(send, recv, count, type, redop, comm, s);
    case ALL_TO_ALL: return l->all_to_all(send, recv, count, type, comm, s);
    case BROADCAST: return l->broadcast(send, recv, count, type, 0, comm, s);
    case REDUCE: return l->reduce(send, recv, count, type, redop, 0, comm, s);
    }
    return 3;
}

static void sync_stream(const lib_t *l, stream_t s) {
    if (on_cpu)
        nccl_ok(l, l->cpu_stream_sync(s), "mscclppCpuStreamSynchronize");
    else
        cuda_ok(rt.stream_sync(s), "cudaStreamSynchronize");
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    case 0: break;
    default: fprintf(stderr, "nccl-percall: bad size %s\n", s); exit(2);
    }
    return (size_t)v;
}

static int listed(const char *list, const char *name) {
    if (!strcmp(list, "all")) return 1;
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}

int main(int argc, char **argv) {
    lib_t libs[8];
    int nlibs = 0, iters = 20, reps = 5, warmup = 5, device = 0, force_cpu = 0;
    size_t min = 8, max = 64u << 20, step = 4;
    const char *ops = "all", *dtypes = "float32", *modes = "eager,graph", *cudart = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--cpu")) { force_cpu = 1; continue; }
        if (!v) { fprintf(stderr, "nccl-percall: %s needs a value (see the top of percall.c)\n", a); return 2; }
        i++;
        if (!strcmp(a, "--lib")) {
            const char *eq = strchr(v, '=');
            if (!eq || nlibs == 8) { fprintf(stderr, "nccl-percall: --lib NAME=PATH (at most 8)\n"); return 2; }
            libs[nlibs] = (lib_t){0};
            libs[nlibs].name = strndup(v, eq - v);
            libs[nlibs].path = eq + 1;
            nlibs++;
        } else if (!strcmp(a, "--ops")) ops = v;
        else if (!strcmp(a, "--dtypes")) dtypes = v;
        else if (!strcmp(a, "--modes")) modes = v;
        else if (!strcmp(a, "--min")) min = parse_size(v);
        else if (!strcmp(a, "--max")) max = parse_size(v);
        else if (!strcmp(a, "--step")) step = parse_size(v);
        else if (!strcmp(a, "--iters")) iters = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--cudart")) cudart = v;
        else if (!strcmp(a, "--device")) device = atoi(v);
        else { fprintf(stderr, "nccl-percall: unknown option %s\n", a); return 2; }
    }
    if (nlibs == 0 || iters < 1 || reps < 1 || warmup < 0 || step < 2 || min < 1 || max < min) {
        fprintf(stderr, "nccl-percall: usage: --lib NAME=PATH ... (see the top of percall.c)\n");
        return 2;
    }
    on_cpu = force_cpu || !load_cudart(cudart);
    if (!on_cpu) cuda_ok(rt.set_device(device), "cudaSetDevice");
    fprintf(stderr, "nccl-percall: %s backend\n", on_cpu ? "CPU (no CUDA runtime)" : "CUDA");

    /* Buffers for the largest size: all-to-all, gather and reduce-scatter read nranks parts;
     * at world size 1 one part is the whole. */
    size_t bytes_max = max;
    void *send = NULL, *recv = NULL;
    if (on_cpu) {
        send = calloc(1, bytes_max);
        recv = calloc(1, bytes_max);
        if (!send || !recv) { fprintf(stderr, "nccl-percall: out of memory\n"); return 1; }
    } else {
        cuda_ok(rt.malloc_(&send, bytes_max), "cudaMalloc");
        cuda_ok(rt.malloc_(&recv, bytes_max), "cudaMalloc");
        cuda_ok(rt.memset_(send, 0, bytes_max), "cudaMemset");
        cuda_ok(rt.memset_(recv, 0, bytes_max), "cudaMemset");
    }
    double *t = calloc(reps, sizeof *t);
    int failed = 0;

    for (int li = 0; li < nlibs; li++) {
        lib_t *l = &libs[li];
        load_lib(l);
        int version = 0;
        nccl_ok(l, l->get_version(&version), "ncclGetVersion");
        uid_t128 id;
        comm_t comm = NULL;
        nccl_ok(l, l->get_unique_id(&id), "ncclGetUniqueId");
        nccl_ok(l, l->comm_init_rank(&comm, 1, id, 0), "ncclCommInitRank");
        stream_t s = NULL;
        if (on_cpu) {
            if (!l->cpu_stream_create) {
                fprintf(stderr, "nccl-percall: %s has no mscclppCpuStreamCreate: the CPU backend needs mscclpp-rs's drop-in\n", l->path);
                return 1;
            }
            nccl_ok(l, l->cpu_stream_create(&s), "mscclppCpuStreamCreate");
        } else {
            cuda_ok(rt.stream_create(&s, 1 /* cudaStreamNonBlocking */), "cudaStreamCreate");
        }
        for (size_t oi = 0; oi < NOPS; oi++) {
            if (!listed(ops, OPS[oi].name)) continue;
            if (OPS[oi].coll == ALL_TO_ALL && !l->all_to_all) {
                printf("{\"lib\":\"%s\",\"op\":\"%s\",\"skipped\":\"no ncclAlltoAll in this library\"}\n", l->name, OPS[oi].name);
                continue;
            }
            for (size_t ti = 0; ti < NTYPES; ti++) {
                if (!listed(dtypes, TYPES[ti].name)) continue;
                int type = TYPES[ti].type, redop = OP_SUM;
                if (OPS[oi].red == R_AVG) redop = OP_AVG;
                if (OPS[oi].red == R_PREMUL) {
                    uint32_t scalar = TYPES[ti].half;
                    if (!l->premul_create) {
                        printf("{\"lib\":\"%s\",\"op\":\"%s\",\"skipped\":\"no ncclRedOpCreatePreMulSum\"}\n", l->name, OPS[oi].name);
                        continue;
                    }
                    nccl_ok(l, l->premul_create(&redop, &scalar, type, SCALAR_HOST, comm), "ncclRedOpCreatePreMulSum");
                }
                for (size_t bytes = min;; bytes = bytes * step > max ? max : bytes * step) {
                    size_t count = bytes / TYPES[ti].size;
                    if (count == 0) count = 1;
                    for (int mode = 0; mode < 2; mode++) {
                        const char *mname = mode ? "graph" : "eager";
                        if (!listed(modes, mname)) continue;
                        if (mode && on_cpu) {
                            printf("{\"lib\":\"%s\",\"op\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu,\"mode\":\"graph\",\"skipped\":\"the CPU backend has no CUDA graphs\"}\n",
                                   l->name, OPS[oi].name, TYPES[ti].name, bytes);
                            continue;
                        }
                        nres_t r = 0;
                        void *graph = NULL, *exec = NULL;
                        for (int w = 0; w < warmup && r == 0; w++)
                            r = call(l, OPS[oi].coll, redop, type, send, recv, count, comm, s);
                        if (r == 0) sync_stream(l, s);
                        if (r == 0 && mode) {
                            cuda_ok(rt.begin_capture(s, 0 /* global */), "cudaStreamBeginCapture");
                            for (int k = 0; k < iters && r == 0; k++)
                                r = call(l, OPS[oi].coll, redop, type, send, recv, count, comm, s);
                            int e = rt.end_capture(s, &graph);
                            if (r == 0) cuda_ok(e, "cudaStreamEndCapture");
                            if (r == 0) cuda_ok(rt.graph_instantiate(&exec, graph, 0), "cudaGraphInstantiate");
                            if (r == 0) { /* one launch to warm the graph up */
                                cuda_ok(rt.graph_launch(exec, s), "cudaGraphLaunch");
                                sync_stream(l, s);
                            }
                        }
                        for (int rep = 0; rep < reps && r == 0; rep++) {
                            double t0 = now_us();
                            if (mode) {
                                cuda_ok(rt.graph_launch(exec, s), "cudaGraphLaunch");
                            } else {
                                for (int k = 0; k < iters && r == 0; k++)
                                    r = call(l, OPS[oi].coll, redop, type, send, recv, count, comm, s);
                            }
                            sync_stream(l, s);
                            t[rep] = (now_us() - t0) / iters;
                        }
                        if (exec) rt.graph_exec_destroy(exec);
                        if (graph) rt.graph_destroy(graph);
                        if (r != 0) {
                            printf("{\"lib\":\"%s\",\"op\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu,\"mode\":\"%s\",\"error\":\"%s\"}\n",
                                   l->name, OPS[oi].name, TYPES[ti].name, bytes, mname, l->get_error_string(r));
                            failed = 1;
                            continue;
                        }
                        qsort(t, reps, sizeof *t, cmp_double);
                        printf("{\"lib\":\"%s\",\"version\":%d,\"op\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu,\"count\":%zu,\"mode\":\"%s\","
                               "\"nranks\":1,\"iters\":%d,\"reps\":%d,\"us_per_call\":%.3f,\"min_us\":%.3f,\"max_us\":%.3f}\n",
                               l->name, version, OPS[oi].name, TYPES[ti].name, bytes, count, mname, iters, reps,
                               reps % 2 ? t[reps / 2] : (t[reps / 2 - 1] + t[reps / 2]) / 2, t[0], t[reps - 1]);
                        fflush(stdout);
                    }
                    if (bytes >= max) break;
                }
                if (OPS[oi].red == R_PREMUL && l->premul_destroy) l->premul_destroy(redop, comm);
            }
        }
        if (on_cpu)
            nccl_ok(l, l->cpu_stream_destroy(s), "mscclppCpuStreamDestroy");
        else
            cuda_ok(rt.stream_destroy(s), "cudaStreamDestroy");
        nccl_ok(l, l->comm_destroy(comm), "ncclCommDestroy");
        /* Not closed: a library's threads and thread-local destructors may outlive the comm. */
    }
    free(t);
    if (on_cpu) {
        free(send);
        free(recv);
    } else {
        rt.free_(send);
        rt.free_(recv);
    }
    return failed;
}
