/* The two CUDA runtime types NCCL's nccl.h names (and size_t), declared as CUDA declares them, so the ABI
 * test compiles NVIDIA's header on a machine without CUDA (nccl/tests/abi.rs). */
#ifndef MSCCLPP_NCCL_TEST_CUDA_RUNTIME_STUB_H
#define MSCCLPP_NCCL_TEST_CUDA_RUNTIME_STUB_H
#include <stddef.h> /* size_t, which CUDA's headers bring */
#define CUDART_VERSION 12090
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
#endif
