#pragma once
// The rows of one paged attention call, flattened on the host for the GPU kernels
// (kernels/cuda/paged_decode_attention.cuh): the same PagedSequence list the CPU's
// kernels::paged_attention takes becomes one CudaPagedRow per query row plus the draft-tree
// paths, which the caller uploads.

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/paged_decode_attention.cuh"

namespace tokenfab::kernels {

struct CudaPagedRows {
  std::vector<CudaPagedRow> rows;  // one per query row, sequence by sequence
  std::vector<int32_t> paths;      // tree rows' key positions, root first, row after row
  int32_t max_keys = 0;            // the largest n_ctx + path_len
};

// seqs as for kernels::paged_attention, except that each `blocks` is a device pointer (copied
// into the rows, never read here); `parent`, when set, is host memory. A tree row t attends the
// context [0, pos0) and then positions pos0 + r for r on its path root … t, the keys the CPU
// gathers for it (in the same depth order). Throws std::invalid_argument when a position does
// not fit in int32 or a parent is out of range.
CudaPagedRows flatten_paged_rows(std::span<const PagedSequence> seqs);

}  // namespace tokenfab::kernels
