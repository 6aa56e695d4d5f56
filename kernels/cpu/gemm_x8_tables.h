#pragma once
// Byte-shuffle controls (pshufb, per 128-bit lane) and tables shared by the packed kernels of
// every width (gemm_x8_*_avx2.cpp, gemm_vnni_*.h). Plain data: safe to include from a file of any
// instruction set.
//
// In a packed record a 32-bit lane belongs to one row; these controls move bytes within each lane,
// so one control serves every lane of a 256- or 512-bit vector (it is repeated per 128 bits).

#include <cstdint>

#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels::x8tables {

struct alignas(16) Shuffle {
  uint8_t b[16];
};

// Byte j of every lane from byte src[j] of the same lane; −1: zero.
constexpr Shuffle lane_shuffle(int s0, int s1, int s2, int s3) {
  Shuffle c{};
  const int src[4] = {s0, s1, s2, s3};
  for (int lane = 0; lane < 4; ++lane)
    for (int j = 0; j < 4; ++j)
      c.b[4 * lane + j] = src[j] < 0 ? 0x80 : static_cast<uint8_t>(4 * lane + src[j]);
  return c;
}

// Byte i of each lane, zero-extended to 32 bits.
inline constexpr Shuffle kByteToLane[4] = {lane_shuffle(0, -1, -1, -1), lane_shuffle(1, -1, -1, -1),
                                           lane_shuffle(2, -1, -1, -1),
                                           lane_shuffle(3, -1, -1, -1)};
// Byte i of each lane, zero-extended into both 16-bit halves (a madd_epi16 multiplier).
inline constexpr Shuffle kByteToHalves[4] = {lane_shuffle(0, -1, 0, -1), lane_shuffle(1, -1, 1, -1),
                                             lane_shuffle(2, -1, 2, -1),
                                             lane_shuffle(3, -1, 3, -1)};
// 16-bit half t of each lane into both halves.
inline constexpr Shuffle kHalfToHalves[2] = {lane_shuffle(0, 1, 0, 1), lane_shuffle(2, 3, 2, 3)};
// Byte i of each lane into the top byte of both halves (an arithmetic shift right by 8 then
// sign-extends it to 16 bits).
inline constexpr Shuffle kByteToHalvesTop[4] = {
    lane_shuffle(-1, 0, -1, 0), lane_shuffle(-1, 1, -1, 1), lane_shuffle(-1, 2, -1, 2),
    lane_shuffle(-1, 3, -1, 3)};
// Bytes i and i + 1 of each lane into the top bytes of its low and its high half (i = 0 or 2).
inline constexpr Shuffle kBytePairToHalvesTop[2] = {lane_shuffle(-1, 0, -1, 1),
                                                    lane_shuffle(-1, 2, -1, 3)};
// Byte i of each lane into its top byte (an arithmetic shift right by 24 sign-extends it).
inline constexpr Shuffle kByteToLaneTop[4] = {
    lane_shuffle(-1, -1, -1, 0), lane_shuffle(-1, -1, -1, 1), lane_shuffle(-1, -1, -1, 2),
    lane_shuffle(-1, -1, -1, 3)};

// kIQ4Values as signed bytes (the AVX2 kernels' sign trick) and offset by 128 to unsigned bytes
// (vpdpbusd's unsigned operand; the offset's share, −128·Σq per activation block, is added back).
constexpr Shuffle iq4_table(int offset) {
  Shuffle t{};
  for (int i = 0; i < 16; ++i) t.b[i] = static_cast<uint8_t>(kIQ4Values[i] + offset);
  return t;
}
inline constexpr Shuffle kIQ4Signed = iq4_table(0);
inline constexpr Shuffle kIQ4Unsigned = iq4_table(128);

}  // namespace tokenfab::kernels::x8tables
