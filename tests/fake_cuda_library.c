/* A stand-in for libphaselab_cuda.so whose C table (cuda_abi.h) is wrong in
 * one way, chosen by FAKE_WRONG: 1 another ABI version, 2 another size of
 * PhlCudaSeq, 3 a function missing. test_cuda checks that the loader
 * refuses each with its reason. Nothing here is ever called. */
#include "backend/cuda/cuda_abi.h"

static const PhlCudaTable table = {
    sizeof(PhlCudaTable),
    FAKE_WRONG == 1 ? 999 : PHASELAB_CUDA_ABI_VERSION,
    sizeof(PhlCudaWeight),
    sizeof(PhlCudaVector),
    sizeof(PhlCudaLayer),
    sizeof(PhlCudaConfig),
    sizeof(PhlCudaModel),
    sizeof(PhlCudaSwitches),
    sizeof(PhlCudaPool),
    FAKE_WRONG == 2 ? sizeof(PhlCudaSeq) + 8 : sizeof(PhlCudaSeq),
    sizeof(PhlCudaReserve),
    sizeof(PhlCudaChunk),
    sizeof(PhlCudaProbe),
    sizeof(PhlCudaDraw),
    0, /* (no function at all: FAKE_WRONG 3 gets as far as checking them) */
};

__attribute__((visibility("default"))) const PhlCudaTable* phaselab_cuda_table(void) { return &table; }
