#include "kernels/cuda/paged_rows.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace tokenfab::kernels {

namespace {

int32_t checked_int32(int64_t value, const char* what) {
  if (value < 0 || value > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument(std::string("flatten_paged_rows: ") + what + " " +
                                std::to_string(value) + " does not fit the GPU rows (int32)");
  return static_cast<int32_t>(value);
}

// Appends row t's path (positions pos0 + r for r root … t) to `paths`; returns its length.
int32_t append_tree_path(const PagedSequence& s, int64_t t, std::vector<int32_t>& paths) {
  const size_t begin = paths.size();
  for (int64_t r = t; r >= 0; r = s.parent[r]) {
    if (s.parent[r] >= r)
      throw std::invalid_argument("flatten_paged_rows: parent[" + std::to_string(r) +
                                  "] = " + std::to_string(s.parent[r]) + " is not an earlier row");
    paths.push_back(checked_int32(s.pos0 + r, "position"));
  }
  std::reverse(paths.begin() + static_cast<std::ptrdiff_t>(begin), paths.end());
  return static_cast<int32_t>(paths.size() - begin);
}

}  // namespace

CudaPagedRows flatten_paged_rows(std::span<const PagedSequence> seqs) {
  CudaPagedRows out;
  for (const PagedSequence& s : seqs) {
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      CudaPagedRow row{s.blocks, s.q_row + t, 0, 0, 0};
      if (s.parent) {
        row.n_ctx = checked_int32(s.pos0, "pos0");
        row.path_begin = checked_int32(static_cast<int64_t>(out.paths.size()), "path offset");
        row.path_len = append_tree_path(s, t, out.paths);
      } else {
        row.n_ctx = checked_int32(s.pos0 + t + 1, "position");
      }
      out.max_keys =
          std::max(out.max_keys, checked_int32(int64_t{row.n_ctx} + row.path_len, "key count"));
      out.rows.push_back(row);
    }
  }
  return out;
}

}  // namespace tokenfab::kernels
