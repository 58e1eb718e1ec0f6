/* Empty: nccl.h includes it; nothing of it is used in C (nccl/tests/abi.rs). */
