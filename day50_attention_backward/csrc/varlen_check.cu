// The packed-sequence offsets checked where they live, on the device.
//
// attention_varlen's CUDA path never reads cu_seqlens_q / cu_seqlens_k on the host (a copy
// would synchronise the stream and break CUDA-graph capture), so the rules the CPU path
// checks with TORCH_CHECK (attention_cpu.cpp, check_offsets) are checked here by one small
// kernel launched before the attention kernels:
//   cu[0] == 0, cu nondecreasing, cu[B] == total (every packed row belongs to a sequence),
//   every length <= the max_seqlen that sized the grid.
// A violation would leave rows unwritten or read past a sequence: a silent wrong answer. It
// is reported the way PyTorch reports a bad index inside a kernel (embedding, gather): a
// message from the device and a trap, which the next CUDA call raises as an error. One block
// of 128 threads, a strided loop over the sequences: a few microseconds, on the stream.
#include "attention.h"

#include <cstdio>

namespace day50 {
namespace {

__device__ bool offsets_ok(const int* cu, int64_t nseq, int64_t total, int64_t max_len, const char* name) {
  bool ok = true;
  if (threadIdx.x == 0 && (cu[0] != 0 || cu[nseq] != total)) {
    printf("attention_varlen: %s must start at 0 and end at the packed length %lld, got %d and %d\n", name,
           static_cast<long long>(total), cu[0], cu[nseq]);
    ok = false;
  }
  for (int64_t b = threadIdx.x; b < nseq; b += blockDim.x) {
    const int64_t len = int64_t(cu[b + 1]) - cu[b];
    if (len < 0 || len > max_len) {
      printf("attention_varlen: sequence %lld of %s has length %lld, outside [0, max_seqlen = %lld]\n",
             static_cast<long long>(b), name, static_cast<long long>(len), static_cast<long long>(max_len));
      ok = false;
    }
  }
  return ok;
}

__global__ void varlen_offsets_check_kernel(const int* cu_q, const int* cu_k, int64_t nseq, int64_t total_q,
                                            int64_t total_k, int64_t max_q, int64_t max_k) {
  const bool ok_q = offsets_ok(cu_q, nseq, total_q, max_q, "cu_seqlens_q");
  const bool ok_k = offsets_ok(cu_k, nseq, total_k, max_k, "cu_seqlens_k");
  if (__syncthreads_or(!(ok_q && ok_k))) __trap();
}

}  // namespace

cudaError_t varlen_offsets_check(const int* cu_q, const int* cu_k, int64_t nseq, int64_t total_q, int64_t total_k,
                                 int64_t max_q, int64_t max_k, cudaStream_t stream) {
  if (nseq <= 0) return cudaSuccess;
  varlen_offsets_check_kernel<<<1, 128, 0, stream>>>(cu_q, cu_k, nseq, total_q, total_k, max_q, max_k);
  return cudaGetLastError();
}

}  // namespace day50
