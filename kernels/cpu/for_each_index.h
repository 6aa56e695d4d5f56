#pragma once
// f(std::integral_constant<int, J>{}) for J = 0 … N − 1: each J a compile-time constant, for the
// immediates of the shifts and shuffles that unpack block J of a packed record (the kernels over
// x8 / x16 records). Plain C++: safe to include from a file of any instruction set.

#include <utility>

namespace tokenfab::kernels {

template <int N, typename F>
inline void for_each_index(F&& f) {
  [&]<int... J>(std::integer_sequence<int, J...>) {
    (f(std::integral_constant<int, J>{}), ...);
  }
  (std::make_integer_sequence<int, N>{});
}

}  // namespace tokenfab::kernels
