// hopper_common.cuh: what the Hopper (version 2) forward and backward share.
//
// Every tile they copy is a box of 64 columns (128 bytes: one swizzle row) x `box_rows` rows
// of one (batch, head) of a View4, so one 4-D tensor map (d, N, heads, batch) per input
// covers any strides the fused layout check admits; rows past N and columns past d come
// back as zeros. 128-byte swizzle: the layout kc/wgmma.cuh's descriptors read.
#pragma once

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention.h"
#include "kc/tma.cuh"

namespace day50 {
namespace hopper_common {

constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
cudaError_t make_map(CUtensorMap* map, const View4& x, int64_t batch, int64_t heads, int64_t n, int64_t d,
                     int box_rows) {
  const uint64_t es = sizeof(T);
  const uint64_t dims[4] = {uint64_t(d), uint64_t(n), uint64_t(heads), uint64_t(batch)};
  const uint64_t strides[3] = {uint64_t(x.sr) * es, uint64_t(x.sh) * es, uint64_t(x.sb) * es};
  const uint32_t box[4] = {64, uint32_t(box_rows), 1, 1};
  const CUtensorMapDataType dt =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return kc::make_tensor_map(map, dt, 4, x.ptr, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace hopper_common
}  // namespace day50
