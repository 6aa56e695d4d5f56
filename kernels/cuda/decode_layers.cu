#include "kernels/cuda/decode_layers.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemv_warp.cuh"
#include "kernels/cuda/paged_kv_device.cuh"

namespace tokenfab::kernels {

namespace {

using gemv_detail::Chunk;
using gemv_detail::finish;
using gemv_detail::kWarp;
using gemv_detail::lane_row_sums;
using gemv_detail::row_inv_rms;
using gemv_detail::row_products;
using gemv_detail::warp_sum;

constexpr int kWarps = 16;  // per block: one block per SM
constexpr int kThreads = kWarps * kWarp;
constexpr int kSplit = kDecodeLayersSplitKeys;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kGroupRows = 8;  // x rows a warp's products take at a time (the kernel's M, at most)
// Layers of up to this many weight bytes are prefetched into L2 a layer ahead (a small model's
// layer, 7 MB for the embedded model's, fits beside the one running in the H200's 50 MB). Bigger
// ones would only evict each other: their phases stream from memory with every warp's loads in
// flight.
constexpr int64_t kPrefetchLayerBytes = int64_t{16} << 20;

__device__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFull, v, offset));
  return v;
}

__device__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A block that waits this long at a barrier stops the kernel (a trap: the step fails with an
// error) rather than hang the GPU. A phase takes microseconds to milliseconds; only a fault can
// keep a block from arriving.
constexpr uint64_t kBarrierTimeoutNs = uint64_t{4} * 1000 * 1000 * 1000;

// Returns when *counter reaches target (an acquire), or traps after kBarrierTimeoutNs. Out of
// line: the kernel's registers stay with its phases.
__device__ __noinline__ void wait_for_count(const unsigned* counter, unsigned target) {
  const uint64_t start = global_ns();
  while (load_acquire(counter) < target)
    if (global_ns() - start > kBarrierTimeoutNs) __trap();
}

// A barrier of the whole grid (co-resident: a cooperative launch). The counter only grows during
// a launch: the k-th barrier is passed when every block has arrived k times. Each block's writes
// before it are visible to every block after it (a fence on each side of the count, after the
// block's own barrier, as cooperative groups' grid sync does). arrive() then wait() is sync();
// between the two a block may only read what no block writes in the phase (the weights: the
// next product's first loads, issued while the grid finishes).
struct GridBarrier {
  unsigned* counter;
  unsigned target = 0;

  __device__ void arrive() {
    target += gridDim.x;
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
    }
  }
  __device__ void wait() {
    if (threadIdx.x == 0) {
      wait_for_count(counter, target);
      __threadfence();
    }
    __syncthreads();
  }
  __device__ void sync() {
    arrive();
    wait();
  }
};

// The kernel's time by phase (DecodeLayersArgs::phase_ns), kept by block 0's first thread, which
// every barrier lets through only once all blocks have arrived: adds the time since its last
// mark to counter `slot` (none for slot −1: the start; the tail also counts the launch). Its
// last mark waits in shared memory, not in a register the whole kernel would hold.
__device__ void phase_clock(unsigned long long* ns, int slot) {
  __shared__ unsigned long long last;
  if (ns == nullptr || blockIdx.x != 0 || threadIdx.x != 0) return;
  const unsigned long long now = global_ns();
  if (slot >= 0) ns[slot] += now - last;
  if (slot == kDecodeLayersTailSlot) ns[kDecodeLayersLaunchSlot] += 1;
  last = now;
}

// The most splits a row of up to max_keys keys has (row_splits): the attention's items per
// (row, head), and the partials' slots per (row, head).
__host__ __device__ int decode_layers_splits(int32_t max_keys) {
  const int64_t chunks = (static_cast<int64_t>(max_keys) + kSplit - 1) / kSplit;
  return static_cast<int>(chunks < kDecodeLayersMaxSplits ? chunks : kDecodeLayersMaxSplits);
}

struct Dims {
  int64_t n_embd, q_dim, kv_dim, qkv_dim, n_ff;
};

__device__ Dims dims_of(const DecodeLayersArgs& a) {
  const int64_t q_dim = static_cast<int64_t>(a.n_head) * a.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(a.n_kv_head) * a.head_dim;
  return {a.n_embd, q_dim, kv_dim, q_dim + 2 * kv_dim, a.n_ff};
}

// The bytes [0, bytes) of `base` into L2, a 128-byte line per thread of the grid in turn.
__device__ void prefetch_l2(const void* base, int64_t bytes) {
  const char* p = static_cast<const char*>(base);
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 128; b < bytes;
       b += threads * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + b));
}

__device__ void prefetch_layer(const DecodeLayer& l, const Dims& d) {
  const int64_t bytes = 2 * d.n_embd * (d.qkv_dim + d.q_dim + 3 * d.n_ff);
  if (bytes > kPrefetchLayerBytes) return;
  prefetch_l2(l.wqkv, d.qkv_dim * d.n_embd * 2);
  prefetch_l2(l.wo, d.n_embd * d.q_dim * 2);
  prefetch_l2(l.w_gate_up, 2 * d.n_ff * d.n_embd * 2);
  prefetch_l2(l.w_down, d.n_embd * d.n_ff * 2);
}

// Each x row's RMSNorm scale into the block's inv_rms (a warp per row), then a block barrier.
__device__ void block_inv_rms(const float* x, int64_t k, int m, float eps, float* inv_rms) {
  const int lane = threadIdx.x % kWarp;
  for (int r = threadIdx.x / kWarp; r < m; r += kWarps) {
    const float inv = row_inv_rms(x + r * k, k, eps, lane);
    if (lane == 0) inv_rms[r] = inv;
  }
  __syncthreads();
}

// The output pair p of a product: rows j0 and j1 (has1: j1 exists): a SwiGLU's gate row and its
// up row, else two neighbouring rows.
struct OutputPair {
  int64_t j0, j1;
  bool has1;
};

__device__ inline OutputPair output_pair(const GemvArgs& a, int64_t p) {
  if (a.epilogue == GemvEpilogue::kSwiGlu) return {p, p + a.n / 2, true};
  return {2 * p, 2 * p + 1, 2 * p + 1 < a.n};
}

// The GEMV's chunks in flight per lane for M x rows (as gemv.cu's at P = 1), and their registers.
template <int M>
inline constexpr int kGemvUnroll = M <= 2 ? 4 : 2;
template <int M>
using GemvRaw = Chunk<GemvWeights::kBf16>[kGemvUnroll<M>][2];

// The first loads of warp w's first output pair of product `a` (pair w, its first x rows: the
// chunks gemv_pairs<M> takes first), into raw; nothing for a warp without a pair.
template <int M>
__device__ void gemv_preload(const GemvArgs& a, int warp, GemvRaw<M>& raw) {
  using C = Chunk<GemvWeights::kBf16>;
  const int64_t n_pairs = a.epilogue == GemvEpilogue::kSwiGlu ? a.n / 2 : (a.n + 1) / 2;
  if (warp >= n_pairs) return;
  const OutputPair o = output_pair(a, warp);
  const int64_t rows[2] = {o.j0, o.has1 ? o.j1 : o.j0};
  gemv_detail::load_chunks<2, kGemvUnroll<M>>(a, rows, threadIdx.x % kWarp, kWarp, a.k / C::kElems,
                                              raw);
}

// The product's output pairs, warp w of the grid taking pairs w, w + warps, …: for each, the
// arithmetic of the layered GEMV's warp with whole rows (gemv.cu, P = 1, S = 1), so the same
// values bit for bit, M x rows at a time (a step of more rows takes its rows in groups of M, the
// pair's weights read again for each group from cache): a row's sums are the same in any group.
// With `preloaded`, raw already holds the first pair's first chunks (gemv_preload).
template <int M>
__device__ void gemv_pairs(const GemvArgs& a, const float* inv_rms, int warp, int warps,
                           GemvRaw<M>& raw, bool preloaded) {
  using C = Chunk<GemvWeights::kBf16>;
  constexpr int R = 2;
  constexpr int kUnroll = kGemvUnroll<M>;
  const int lane = threadIdx.x % kWarp;
  const int64_t n_pairs = a.epilogue == GemvEpilogue::kSwiGlu ? a.n / 2 : (a.n + 1) / 2;
  const int64_t n_vec = a.k / C::kElems;
  bool loaded = preloaded;
  for (int64_t p = warp; p < n_pairs; p += warps) {
    const OutputPair o = output_pair(a, p);
    const int64_t j0 = o.j0, j1 = o.j1;
    const bool has1 = o.has1;
    const int64_t rows[R] = {j0, has1 ? j1 : j0};
    for (int g0 = 0; g0 < a.m; g0 += M) {
      GemvArgs g = a;  // rows g0 … g0 + M − 1
      g.m = min(M, a.m - g0);
      g.x = a.x + g0 * a.x_stride;
      g.out = a.out + g0 * a.out_stride;
      if (a.rope != nullptr) g.rope = a.rope + static_cast<int64_t>(g0) * a.rot_dim;
      if (a.kv_slots != nullptr) g.kv_slots = a.kv_slots + g0;
      float acc[R][M];
      row_products<M, R, kUnroll>(g, inv_rms + g0, rows, lane, kWarp, n_vec, raw, loaded, acc);
      loaded = false;
      float y[R];
      lane_row_sums<M, R>(acc, y, lane);
      if (lane < g.m) finish(g, lane, j0, j1, has1, y[0], y[1]);
    }
  }
}

// ---- Tensor-core products (DecodeLayersArgs::tensor_cores) ----
//
// A block takes the product's tiles of 8 output pairs (16 weight rows: row i the pair's j0, row
// i + 8 its j1; with many rows, a chunk of a tile's rows: mma_pairs), and its 16 warps split each
// tile's k: warp w multiplies the k-blocks of 32 weights w, w + 16, … with mma.sync m16n8k16 (BF16
// in, f32 accumulate), the weights as A and eight x rows as B (the step's rows, eight at a time,
// are the product's n). Within a k-block, lane (g, t) (g = lane / 4, t = lane % 4) loads the 8
// weights at 8t … 8t + 7 of its pair's two rows and the same 8 elements of x row g, and gives them
// to the two mma steps as their columns 2t, 2t + 1, 2t + 8, 2t + 9 (elements 4s … 4s + 3 in step
// s): a permutation of the k-block's columns, the same for A and B, so the sum is the product's. x
// goes in as two BF16 terms (x ≈ hi + lo, 16 bits of its mantissa), each multiplied, so a product
// keeps close to the f32 GEMV's precision. The warps' partial sums are added in warp order by the
// block, then go through the GEMV's epilogue (finish). A row's sum therefore depends on the
// product's shape alone: the same bits in any step, whatever its row count or the row's place in
// it. The RMSNorm scale of a normed product is taken from the same loads (each block sums the
// squares of the x elements it reads, in a fixed order) and applied to the sums: no pass over x
// before the product.

constexpr int kMmaGroups = 4;   // x rows of eight a block takes at a time
constexpr int kMmaKBlock = 32;  // weights a warp multiplies per tile row at a time
constexpr int kMmaUnroll = 2;   // k-blocks whose loads a warp issues before its mmas

__device__ inline uint32_t bf16_pair(float lo_k, float hi_k) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo_k, hi_k);  // .x: the lower column
  return *reinterpret_cast<const uint32_t*>(&v);
}

// x ≈ hi + lo in BF16, element pair by element pair.
__device__ inline void bf16_split(float e0, float e1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(e0, e1);
  const float2 back = __bfloat1622float2(h);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = bf16_pair(e0 - back.x, e1 - back.y);
}

// d += A · B for one m16n8k16 step: a0 … a3 and b0, b1 as the PTX fragments (BF16 pairs).
__device__ inline void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One pass of a tile: x rows r0 … r0 + 8·kMmaGroups − 1 (those below a.m) times the tile's 16
// weight rows, over warp w's k-blocks; acc[q] is the m16n8 accumulator of rows r0 + 8q …, ss[q]
// this lane's sum of squares of x row r0 + 8q + g over the elements it read (normed products).
__device__ void mma_tile_pass(const GemvArgs& a, const uint16_t* w0, const uint16_t* w1,
                              bool has_pair, int r0, float (&acc)[kMmaGroups][4],
                              float (&ss)[kMmaGroups]) {
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp;
  const int g = lane / 4, t = lane % 4;
  const int64_t k_blocks = (a.k + kMmaKBlock - 1) / kMmaKBlock;
#pragma unroll
  for (int q = 0; q < kMmaGroups; ++q) {
    ss[q] = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[q][i] = 0.0f;
  }
  for (int64_t kb0 = w; kb0 < k_blocks; kb0 += kMmaUnroll * kWarps) {
    uint4 wa[kMmaUnroll], wb[kMmaUnroll];
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {  // every load first
      const int64_t k = (kb0 + u * kWarps) * kMmaKBlock + 8 * t;
      wa[u] = wb[u] = make_uint4(0, 0, 0, 0);
      if (has_pair && k < a.k) {
        wa[u] = __ldg(reinterpret_cast<const uint4*>(w0 + k));
        wb[u] = __ldg(reinterpret_cast<const uint4*>(w1 + k));
      }
    }
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int64_t kb = kb0 + u * kWarps;
      if (kb >= k_blocks) break;  // the same for the whole warp
      const int64_t k = kb * kMmaKBlock + 8 * t;
      const bool in = k < a.k;
      float nw[8];
      if (a.norm != nullptr && in) {
        const float4 n0 = __ldg(reinterpret_cast<const float4*>(a.norm + k));
        const float4 n1 = __ldg(reinterpret_cast<const float4*>(a.norm + k + 4));
        nw[0] = n0.x, nw[1] = n0.y, nw[2] = n0.z, nw[3] = n0.w;
        nw[4] = n1.x, nw[5] = n1.y, nw[6] = n1.z, nw[7] = n1.w;
      }
      const uint32_t wa_w[4] = {wa[u].x, wa[u].y, wa[u].z, wa[u].w};
      const uint32_t wb_w[4] = {wb[u].x, wb[u].y, wb[u].z, wb[u].w};
#pragma unroll
      for (int q = 0; q < kMmaGroups; ++q) {
        if (r0 + 8 * q >= a.m) break;  // the same for the whole warp
        const int r = r0 + 8 * q + g;
        float xs[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (r < a.m && in) {
          const float* xr = a.x + r * a.x_stride + k;
          const float4 x0 = *reinterpret_cast<const float4*>(xr);
          const float4 x1 = *reinterpret_cast<const float4*>(xr + 4);
          xs[0] = x0.x, xs[1] = x0.y, xs[2] = x0.z, xs[3] = x0.w;
          xs[4] = x1.x, xs[5] = x1.y, xs[6] = x1.z, xs[7] = x1.w;
        }
        if (a.norm != nullptr && in) {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            ss[q] = fmaf(xs[i], xs[i], ss[q]);
            xs[i] *= nw[i];
          }
        }
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) bf16_split(xs[2 * i], xs[2 * i + 1], hi[i], lo[i]);
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          // A: row g (j0) columns 2t, 2t + 1 | row g + 8 (j1) the same | row g columns 2t + 8,
          // 2t + 9 | row g + 8 the same; B: columns 2t, 2t + 1 and 2t + 8, 2t + 9 of x row g.
          mma_bf16(acc[q], wa_w[2 * s], wb_w[2 * s], wa_w[2 * s + 1], wb_w[2 * s + 1], hi[2 * s],
                   hi[2 * s + 1]);
          mma_bf16(acc[q], wa_w[2 * s], wb_w[2 * s], wa_w[2 * s + 1], wb_w[2 * s + 1], lo[2 * s],
                   lo[2 * s + 1]);
        }
      }
    }
  }
}

// The product on tensor cores (see above), every block of the grid taking its tiles (or, with
// many rows, its tiles' chunks of rows).
__device__ void mma_pairs(const GemvArgs& a) {
  __shared__ float4 partial[kWarps][kMmaGroups][kWarp];  // each warp's accumulators
  __shared__ float squares[kWarps][kMmaGroups][8];       // each warp's sums of squares per x row
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp;
  const int g = lane / 4;
  const int64_t n_pairs = a.epilogue == GemvEpilogue::kSwiGlu ? a.n / 2 : (a.n + 1) / 2;
  const int64_t n_tiles = (n_pairs + 7) / 8;
  // A step of many rows on a narrow product (fewer tiles than blocks) deals each tile's passes
  // of 8·kMmaGroups rows to several blocks, in chunks of `chunk` passes: each block then reads
  // only its chunk's x rows, where one block per tile would read all of them while the other
  // blocks wait. A row is still computed whole by one block, as in any other step.
  constexpr int kPassRows = 8 * kMmaGroups;
  const int64_t passes = (a.m + kPassRows - 1) / kPassRows;
  const int64_t per_tile = max(int64_t{1}, min(passes, static_cast<int64_t>(gridDim.x) / n_tiles));
  const int64_t chunk = (passes + per_tile - 1) / per_tile;  // passes per task
  const int64_t chunks = (passes + chunk - 1) / chunk;
  for (int64_t task = blockIdx.x; task < n_tiles * chunks; task += gridDim.x) {
    const int64_t tile = task % n_tiles;
    const int r_begin = static_cast<int>(task / n_tiles * chunk * kPassRows);
    const int r_end = static_cast<int>(min(static_cast<int64_t>(a.m), r_begin + chunk * kPassRows));
    const int64_t p = tile * 8 + g;
    const bool has_pair = p < n_pairs;
    const OutputPair op = output_pair(a, has_pair ? p : 0);
    const uint16_t* w0 = a.w + op.j0 * a.k;
    const uint16_t* w1 = a.w + (op.has1 ? op.j1 : op.j0) * a.k;
    for (int r0 = r_begin; r0 < r_end; r0 += kPassRows) {
      float acc[kMmaGroups][4], ss[kMmaGroups];
      mma_tile_pass(a, w0, w1, has_pair, r0, acc, ss);
#pragma unroll
      for (int q = 0; q < kMmaGroups; ++q) {
        partial[w][q][lane] = make_float4(acc[q][0], acc[q][1], acc[q][2], acc[q][3]);
        // The four lanes of x row g hold its squares over k-blocks' quarters: summed in a fixed
        // order (t 0 + 1, 2 + 3, then the two).
        float s = ss[q] + __shfl_xor_sync(kFull, ss[q], 1);
        s += __shfl_xor_sync(kFull, s, 2);
        if (lane % 4 == 0) squares[w][q][g] = s;
      }
      __syncthreads();
      if (threadIdx.x < kMmaGroups * kWarp) {
        // Thread (q, l) finishes the accumulator entries lane l of every warp held for group q:
        // pair l / 4 of the tile, x rows r0 + 8q + 2·(l % 4) and the one after.
        const int q = static_cast<int>(threadIdx.x) / kWarp,
                  l = static_cast<int>(threadIdx.x) % kWarp;
        float4 sum = partial[0][q][l];
        for (int v = 1; v < kWarps; ++v) {
          const float4 pv = partial[v][q][l];
          sum.x += pv.x, sum.y += pv.y, sum.z += pv.z, sum.w += pv.w;
        }
        const int64_t pl = tile * 8 + l / 4;
        const int c = 2 * (l % 4);  // the accumulator's column: x row r0 + 8q + c
        if (pl < n_pairs) {
          const OutputPair o = output_pair(a, pl);
          float y[2][2] = {{sum.x, sum.z}, {sum.y, sum.w}};  // [row c, c + 1][j0, j1]
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int r = r0 + 8 * q + c + i;
            if (r >= a.m) break;
            if (a.norm != nullptr) {
              float sq = squares[0][q][c + i];
              for (int v = 1; v < kWarps; ++v) sq += squares[v][q][c + i];
              const float inv = 1.0f / sqrtf(sq / static_cast<float>(a.k) + a.eps);
              y[i][0] *= inv;
              y[i][1] *= inv;
            }
            finish(a, r, o.j0, o.j1, o.has1, y[i][0], y[i][1]);
          }
        }
      }
      __syncthreads();
    }
  }
}

// The splits of a row of n_keys keys: its chunks of kSplit keys (a lane per key) dealt in order
// into at most kDecodeLayersMaxSplits splits of `per` chunks each. It depends on the row's own
// keys alone (not on the step's rows or its longest row), so a row's attention is the same, bit
// for bit, whatever step it is in.
struct RowSplits {
  int32_t chunks, per, count;
};

__device__ RowSplits row_splits(int32_t n_keys) {
  const int32_t chunks = (n_keys + kSplit - 1) / kSplit;
  const int32_t per = (chunks + kDecodeLayersMaxSplits - 1) / kDecodeLayersMaxSplits;
  return {chunks, per, (chunks + per - 1) / per};
}

// Query heads an attention item takes at most: heads that share a KV head read each key's K and
// V rows once for all of them. Four for heads of up to 128 elements; wider heads one at a time
// (their sums would not fit in registers four times over).
__host__ __device__ constexpr int item_heads_max(int e) {
  return e <= 4 ? 4 : 1;
}

// The query heads of an attention item: the largest of item_heads_max … 2 that divides the heads
// per KV head, else 1.
__device__ int item_heads(int n_head, int n_kv_head, int head_dim) {
  const int group = n_head / n_kv_head;
  for (int h = item_heads_max(head_dim / kWarp); h > 1; --h)
    if (group % h == 0) return h;
  return 1;
}

// One attention split of row r's query heads head0 … head0 + H − 1 (H ≤ item_heads_max, one KV
// head's): its chunks one after another, a lane per key of a chunk, with a running softmax over
// them, each head's. Scores as the layered decode attention's (q·scale, then the K row in
// order); then Σ p·v with lane i owning V elements E·i … E·i + E − 1. Each head's arithmetic is
// the same, in the same order, whatever H is: the heads only share the loads. A row of one split
// writes its output; otherwise the split's partials (maximum, sum of exponentials, Σ p·v) go to
// the workspace, per head, and the item's last split to count itself combines them, in split
// order.
template <int E>
__device__ void attention_split(const DecodeLayersArgs& a, const DecodeLayer& l, const Dims& d,
                                int r, int head0, int H, int split, int n_splits) {
  constexpr int D = E * kWarp;
  constexpr int kItemHeads = item_heads_max(E);
  const int lane = threadIdx.x % kWarp;
  const CudaPagedRow row = a.rows[r];
  const int32_t n_keys = row.n_ctx + row.path_len;
  if (n_keys < 1) return;  // (flatten_paged_rows gives every row a key: its own)
  const RowSplits rs = row_splits(n_keys);
  if (split >= rs.count) return;
  const int kv_head = head0 / (a.n_head / a.n_kv_head);
  const float* q = a.qkv + row.q_row * d.qkv_dim + static_cast<int64_t>(head0) * D;
  float mx[kItemHeads], sum_p[kItemHeads], acc[kItemHeads][E];
#pragma unroll
  for (int h = 0; h < kItemHeads; ++h) {
    mx[h] = -INFINITY;
    sum_p[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[h][e] = 0.0f;
  }
  const int32_t chunk_end = min(rs.chunks, (split + 1) * rs.per);
  for (int32_t chunk = split * rs.per; chunk < chunk_end; ++chunk) {
    const int32_t key0 = chunk * kSplit;
    const int32_t key = key0 + lane;
    const bool valid = key < n_keys;
    int64_t off = 0;
    float score[kItemHeads];
#pragma unroll
    for (int h = 0; h < kItemHeads; ++h) score[h] = -INFINITY;
    if (valid) {
      const int32_t pos = key < row.n_ctx ? key : a.paths[row.path_begin + key - row.n_ctx];
      off = cuda_detail::pool_row(row.blocks[pos / a.block_size], pos % a.block_size, kv_head,
                                  a.n_kv_head, a.block_size, D);
      // The key's V row into this SM's L1 while its K row is read and scored, so that the Σ p·v
      // below, a key at a time, finds it there (rows start on 128-byte lines: D ≥ 64).
#pragma unroll
      for (int e = 0; e < D; e += 64)
        asm volatile("prefetch.global.L1 [%0];" ::"l"(l.v_pool + off + e));
      const uint16_t* kr = l.k_pool + off;
      float dot[kItemHeads];
#pragma unroll
      for (int h = 0; h < kItemHeads; ++h) dot[h] = 0.0f;
#pragma unroll
      for (int d0 = 0; d0 < D; d0 += 64) {  // eight 16-byte loads in flight, then their sums
        uint4 raw[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) raw[u] = *reinterpret_cast<const uint4*>(kr + d0 + 8 * u);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const __half2* hk = reinterpret_cast<const __half2*>(&raw[u]);
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            const float2 f = __half22float2(hk[t]);
            const int e = d0 + 8 * u + 2 * t;
#pragma unroll
            for (int h = 0; h < kItemHeads; ++h) {
              if (h >= H) break;
              const float* qh = q + h * D;
              dot[h] = fmaf(qh[e] * a.scale, f.x, dot[h]);
              dot[h] = fmaf(qh[e + 1] * a.scale, f.y, dot[h]);
            }
          }
        }
      }
#pragma unroll
      for (int h = 0; h < kItemHeads; ++h) score[h] = dot[h];
    }
    // Each head's running maximum (finite: lane 0's key exists) and what its sums so far shrink
    // by (0 at the first chunk, where they are 0).
    float p[kItemHeads];
#pragma unroll
    for (int h = 0; h < kItemHeads; ++h) {
      p[h] = 0.0f;
      if (h >= H) break;
      const float m_new = fmaxf(mx[h], warp_max(score[h]));
      const float shrink = expf(mx[h] - m_new);
      p[h] = valid ? expf(score[h] - m_new) : 0.0f;
      sum_p[h] = sum_p[h] * shrink + warp_sum(p[h]);
      mx[h] = m_new;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[h][e] *= shrink;
    }
    const int nj = min(kSplit, n_keys - key0);
    for (int j0 = 0; j0 < nj; j0 += 8) {  // eight keys' V loads in flight
      __half2 v[8][E / 2];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int j = j0 + u;  // < 40: the shuffles' source lane is j mod 32, used only if j < nj
        const int64_t oj = __shfl_sync(kFull, off, j % kWarp);
        const __half2* vr = reinterpret_cast<const __half2*>(l.v_pool + oj + lane * E);
#pragma unroll
        for (int e = 0; e < E / 2; ++e) v[u][e] = j < nj ? vr[e] : __float2half2_rn(0.0f);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int j = j0 + u;
#pragma unroll
        for (int h = 0; h < kItemHeads; ++h) {
          if (h >= H) break;
          const float pj = j < nj ? __shfl_sync(kFull, p[h], j % kWarp) : 0.0f;
#pragma unroll
          for (int e = 0; e < E / 2; ++e) {
            const float2 f = __half22float2(v[u][e]);
            acc[h][2 * e] = fmaf(pj, f.x, acc[h][2 * e]);
            acc[h][2 * e + 1] = fmaf(pj, f.y, acc[h][2 * e + 1]);
          }
        }
      }
    }
  }

  if (rs.count == 1) {
#pragma unroll
    for (int h = 0; h < kItemHeads; ++h) {
      if (h >= H) break;
      float* out = a.att + row.q_row * d.q_dim + static_cast<int64_t>(head0 + h) * D + lane * E;
      const float inv = 1.0f / sum_p[h];
#pragma unroll
      for (int e = 0; e < E; ++e) out[e] = acc[h][e] * inv;
    }
    return;
  }
  // Partials: m and l (rows · heads · n_splits), then the sums ((rows · heads · n_splits) · D).
  const int64_t slots = static_cast<int64_t>(a.m) * a.n_head * n_splits;
  float* pm = a.partials;
  float* pl = a.partials + slots;
  float* pa = a.partials + 2 * slots;
#pragma unroll
  for (int h = 0; h < kItemHeads; ++h) {
    if (h >= H) break;
    const int64_t slot = (static_cast<int64_t>(r) * a.n_head + head0 + h) * n_splits + split;
#pragma unroll
    for (int e = 0; e < E; ++e) pa[slot * D + lane * E + e] = acc[h][e];
    if (lane == 0) {
      pm[slot] = mx[h];
      pl[slot] = sum_p[h];
    }
  }
  // One counter per item (row, head0): the split that counts last combines every head's.
  const int64_t counter = static_cast<int64_t>(r) * a.n_head + head0;
  __threadfence();
  __syncwarp();
  int last = 0;
  if (lane == 0) last = atomicAdd(a.counts + counter, 1) == rs.count - 1;
  last = __shfl_sync(kFull, last, 0);
  __syncwarp();
  if (last == 0) return;
  __threadfence();
  for (int h = 0; h < H; ++h) {
    const int64_t slot0 = (static_cast<int64_t>(r) * a.n_head + head0 + h) * n_splits;
    float big = -INFINITY;
    for (int s = lane; s < rs.count; s += kWarp) big = fmaxf(big, __ldcg(pm + slot0 + s));
    big = warp_max(big);
    float total = 0.0f;
    for (int s = lane; s < rs.count; s += kWarp)
      total += __ldcg(pl + slot0 + s) * expf(__ldcg(pm + slot0 + s) - big);
    total = warp_sum(total);
    float sum[E];
#pragma unroll
    for (int e = 0; e < E; ++e) sum[e] = 0.0f;
    constexpr int U = E <= 2 ? 8 : 16 / E;  // splits whose loads are in flight together
    for (int s0 = 0; s0 < rs.count; s0 += U) {
      float w[U], v[U][E];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int s = s0 + u;
        w[u] = s < rs.count ? expf(__ldcg(pm + slot0 + s) - big) : 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e)
          v[u][e] = s < rs.count ? __ldcg(pa + (slot0 + s) * D + lane * E + e) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int e = 0; e < E; ++e) sum[e] += v[u][e] * w[u];
      }
    }
    const float inv = 1.0f / total;
    float* out = a.att + row.q_row * d.q_dim + static_cast<int64_t>(head0 + h) * D + lane * E;
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = sum[e] * inv;
  }
  if (lane == 0) a.counts[counter] = 0;  // ready for the next layer and the next step
}

// Every (row, item, split) of the step, split fastest, warp w of the grid taking items w,
// w + warps, …: an item is item_heads query heads of one KV head. kE: the heads' E (head_dim /
// 32) when the kernel is built for one head size, else 0 (any).
template <int kE>
__device__ void attention_phase(const DecodeLayersArgs& a, const DecodeLayer& l, const Dims& d,
                                int warp, int warps) {
  const int n_splits = decode_layers_splits(a.max_keys);
  const int H = item_heads(a.n_head, a.n_kv_head, a.head_dim);
  const int n_items = a.n_head / H;  // per row
  const int64_t items = static_cast<int64_t>(a.m) * n_items * n_splits;
  for (int64_t item = warp; item < items; item += warps) {
    const int split = static_cast<int>(item % n_splits);
    const int head0 = static_cast<int>(item / n_splits % n_items) * H;
    const int r = static_cast<int>(item / (static_cast<int64_t>(n_splits) * n_items));
    if constexpr (kE != 0) {
      attention_split<kE>(a, l, d, r, head0, H, split, n_splits);
      continue;
    }
    switch (a.head_dim / kWarp) {
      case 2:
        attention_split<2>(a, l, d, r, head0, H, split, n_splits);
        break;
      case 4:
        attention_split<4>(a, l, d, r, head0, H, split, n_splits);
        break;
      case 6:
        attention_split<6>(a, l, d, r, head0, H, split, n_splits);
        break;
      default:
        attention_split<8>(a, l, d, r, head0, H, split, n_splits);
        break;
    }
  }
}

// A layer's tap, if it has one: rmsnorm(x) of each logit row without a weight (x · scale · 1,
// as the layered path's norm with a weight of ones), a warp per row.
__device__ void tap_phase(const DecodeLayersArgs& a, const DecodeLayer& l, int warp, int warps) {
  if (l.tap == nullptr) return;
  const int lane = threadIdx.x % kWarp;
  for (int i = warp; i < a.n_logit; i += warps) {
    const int64_t src = a.logit_rows != nullptr ? a.logit_rows[i] : i;
    const float* xr = a.x + src * a.n_embd;
    const float inv = row_inv_rms(xr, a.n_embd, a.eps, lane);
    float* out = l.tap + static_cast<int64_t>(i) * a.n_embd;
    for (int j = lane; j < a.n_embd; j += kWarp) out[j] = xr[j] * inv * 1.0f;
  }
}

// A layer's four products, their epilogues and (qkv, gate_up) norms.
__device__ GemvArgs qkv_product(const DecodeLayersArgs& a, const DecodeLayer& l, const Dims& d) {
  GemvArgs p = gemv_product(a.x, d.n_embd, a.m, l.wqkv, d.qkv_dim, d.n_embd, GemvEpilogue::kRopeKv,
                            a.qkv, d.qkv_dim);
  p.norm = l.attn_norm;
  p.eps = a.eps;
  p.rope = a.rope;
  p.kv_slots = a.kv_slots;
  p.q_dim = static_cast<int>(d.q_dim);
  p.kv_dim = static_cast<int>(d.kv_dim);
  p.head_dim = a.head_dim;
  p.rot_dim = a.rot_dim;
  p.n_kv_head = a.n_kv_head;
  p.block_size = a.block_size;
  p.k_pool = l.k_pool;
  p.v_pool = l.v_pool;
  return p;
}

// o and down: x += w · in, rows of k.
__device__ GemvArgs residual_product(const DecodeLayersArgs& a, const float* in, const uint16_t* w,
                                     int64_t k, const Dims& d) {
  return gemv_product(in, k, a.m, w, d.n_embd, k, GemvEpilogue::kAdd, a.x, d.n_embd);
}

__device__ GemvArgs gate_up_product(const DecodeLayersArgs& a, const DecodeLayer& l,
                                    const Dims& d) {
  GemvArgs p = gemv_product(a.x, d.n_embd, a.m, l.w_gate_up, 2 * d.n_ff, d.n_embd,
                            GemvEpilogue::kSwiGlu, a.ffn, d.n_ff);
  p.norm = l.ffn_norm;
  p.eps = a.eps;
  return p;
}

// The step's product `p`: on tensor cores (mma_pairs) or as the GEMV's warps (gemv_pairs, with
// the rows' RMSNorm scales in inv_rms and the first loads in raw: gemv_preload).
template <int M, bool kMma>
__device__ void product(const GemvArgs& p, const float* inv_rms, int warp, int warps,
                        GemvRaw<M>& raw) {
  if constexpr (kMma)
    mma_pairs(p);
  else
    gemv_pairs<M>(p, inv_rms, warp, warps, raw, true);
}

// The end of a phase: the grid barrier, with the next product's first loads (GEMV products)
// issued between the block's arrival and its wait, so that they land while the grid finishes.
template <int M, bool kMma>
__device__ void end_phase(GridBarrier& barrier, const GemvArgs& next, int warp, GemvRaw<M>& raw) {
  barrier.arrive();
  if constexpr (!kMma) gemv_preload<M>(next, warp, raw);
  barrier.wait();
}

// M: the GEMV's x rows at a time (kMma false); kMma: the products on tensor cores; kE: 2 for a
// model whose heads have 64 elements (the embedded model's: only that attention is compiled in,
// so the wider heads' registers do not weigh on the rest), 0 for any head size.
template <int M, bool kMma, int kE>
__global__ void __launch_bounds__(kThreads, 1) decode_layers_kernel(DecodeLayersArgs a) {
  __shared__ float inv_rms[kMma ? 1 : kDecodeLayersMaxGemvRows];
  const int warp = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / kWarp;
  const int warps = static_cast<int>(gridDim.x) * kWarps;
  const Dims d = dims_of(a);
  GridBarrier barrier{a.barrier};
  GemvRaw<M> raw;  // the next GEMV product's first loads (gemv_preload)
  phase_clock(a.phase_ns, -1);
  prefetch_layer(a.layers[0], d);
  if constexpr (!kMma) gemv_preload<M>(qkv_product(a, a.layers[0], d), warp, raw);
  for (int layer = 0; layer < a.n_layer; ++layer) {
    const DecodeLayer l = a.layers[layer];
    if (layer + 1 < a.n_layer) prefetch_layer(a.layers[layer + 1], d);
    if (layer > 0) tap_phase(a, a.layers[layer - 1], warp, warps);  // reads x, as phase 1 does

    // 1. q, k, v = wqkv · rmsnorm(x); RoPE; k and v into the pool.
    if constexpr (!kMma) block_inv_rms(a.x, d.n_embd, a.m, a.eps, inv_rms);
    product<M, kMma>(qkv_product(a, l, d), inv_rms, warp, warps, raw);
    barrier.sync();
    phase_clock(a.phase_ns, 0);

    // 2. attention.
    attention_phase<kE>(a, l, d, warp, warps);
    const GemvArgs o = residual_product(a, a.att, l.wo, d.q_dim, d);
    end_phase<M, kMma>(barrier, o, warp, raw);
    phase_clock(a.phase_ns, 1);

    // 3. x += wo · att.
    product<M, kMma>(o, inv_rms, warp, warps, raw);
    const GemvArgs gate_up = gate_up_product(a, l, d);
    end_phase<M, kMma>(barrier, gate_up, warp, raw);
    phase_clock(a.phase_ns, 2);

    // 4. h = silu(gate · rmsnorm(x)) · (up · rmsnorm(x)).
    if constexpr (!kMma) block_inv_rms(a.x, d.n_embd, a.m, a.eps, inv_rms);
    product<M, kMma>(gate_up, inv_rms, warp, warps, raw);
    const GemvArgs down = residual_product(a, a.ffn, l.w_down, d.n_ff, d);
    end_phase<M, kMma>(barrier, down, warp, raw);
    phase_clock(a.phase_ns, 3);

    // 5. x += w_down · h.
    product<M, kMma>(down, inv_rms, warp, warps, raw);
    if (layer + 1 < a.n_layer) {
      const GemvArgs next = qkv_product(a, a.layers[layer + 1], d);
      end_phase<M, kMma>(barrier, next, warp, raw);
    } else {
      barrier.sync();
    }
    phase_clock(a.phase_ns, 4);
  }
  tap_phase(a, a.layers[a.n_layer - 1], warp, warps);
  phase_clock(a.phase_ns, kDecodeLayersTailSlot);
}

template <int M, bool kMma>
int blocks_per_sm() {
  int any = 0, head64 = 0;
  TOKENFAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &any, decode_layers_kernel<M, kMma, 0>, kThreads, 0));
  TOKENFAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &head64, decode_layers_kernel<M, kMma, 2>, kThreads, 0));
  return std::min(any, head64);
}

// The cooperative launch of the kernel for a's head size.
template <int M, bool kMma>
void launch(const cudaLaunchConfig_t& config, const DecodeLayersArgs& a) {
  if (a.head_dim == 2 * kWarp) {
    TOKENFAB_CUDA_CHECK(cudaLaunchKernelEx(&config, decode_layers_kernel<M, kMma, 2>, a));
  } else {
    TOKENFAB_CUDA_CHECK(cudaLaunchKernelEx(&config, decode_layers_kernel<M, kMma, 0>, a));
  }
}

}  // namespace

bool decode_layers_supported(int n_embd, int n_head, int n_kv_head, int head_dim, int n_ff) {
  return head_dim > 0 && head_dim % 64 == 0 && head_dim <= kPagedDecodeMaxHeadDim &&
         n_kv_head > 0 && n_head > 0 && n_head % n_kv_head == 0 && n_embd > 0 && n_embd % 8 == 0 &&
         n_ff > 0 && n_ff % 8 == 0;
}

int64_t decode_layers_workspace_floats(int64_t m, int n_head, int head_dim, int32_t max_keys) {
  return m * n_head * decode_layers_splits(max_keys) * (static_cast<int64_t>(head_dim) + 2);
}

int decode_layers_grid(int device, int sms) {
  int cooperative = 0, count = 0;
  TOKENFAB_CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
  TOKENFAB_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  if (cooperative == 0 || count <= 0) return 0;
  const int fit =
      std::min({blocks_per_sm<1, false>(), blocks_per_sm<2, false>(), blocks_per_sm<4, false>(),
                blocks_per_sm<kGroupRows, false>(), blocks_per_sm<1, true>()});
  if (fit < 1) return 0;
  return sms > 0 ? std::min(sms, count) : count;
}

void launch_decode_layers(const DecodeLayersArgs& a, int grid, cudaStream_t stream) {
  const std::string where = "launch_decode_layers: ";
  if (!decode_layers_supported(a.n_embd, a.n_head, a.n_kv_head, a.head_dim, a.n_ff) || a.m < 1 ||
      a.m > decode_layers_max_rows(a.tensor_cores) || a.n_layer < 1 || a.block_size < 1 ||
      a.rot_dim < 0 || a.rot_dim % 2 != 0 || a.rot_dim > a.head_dim || a.max_keys < 1 ||
      a.n_logit < 0 || grid < 1)
    throw std::invalid_argument(
        where + "unsupported shape: " + std::to_string(a.m) + " rows, " +
        std::to_string(a.n_layer) + " layers, n_embd " + std::to_string(a.n_embd) + ", " +
        std::to_string(a.n_head) + "/" + std::to_string(a.n_kv_head) + " heads of " +
        std::to_string(a.head_dim) + ", n_ff " + std::to_string(a.n_ff) + ", max_keys " +
        std::to_string(a.max_keys) + ", grid " + std::to_string(grid));
  if (a.layers == nullptr || a.x == nullptr || a.qkv == nullptr || a.att == nullptr ||
      a.ffn == nullptr || a.kv_slots == nullptr || a.rows == nullptr || a.barrier == nullptr ||
      (a.rot_dim > 0 && a.rope == nullptr))
    throw std::invalid_argument(where + "a buffer is missing");
  const int64_t needed = decode_layers_workspace_floats(a.m, a.n_head, a.head_dim, a.max_keys);
  if (a.partials == nullptr || a.partial_floats < needed || a.counts == nullptr ||
      a.count_ints < static_cast<int64_t>(a.m) * a.n_head)
    throw std::invalid_argument(where + "a workspace of " + std::to_string(a.partial_floats) +
                                " floats and " + std::to_string(a.count_ints) + " counters; " +
                                std::to_string(needed) + " and " +
                                std::to_string(static_cast<int64_t>(a.m) * a.n_head) + " needed");
  TOKENFAB_CUDA_CHECK(cudaMemsetAsync(a.barrier, 0, sizeof(unsigned), stream));
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  if (a.tensor_cores) {
    launch<1, true>(config, a);
  } else if (a.m <= 1) {
    launch<1, false>(config, a);
  } else if (a.m <= 2) {
    launch<2, false>(config, a);
  } else if (a.m <= 4) {
    launch<4, false>(config, a);
  } else {
    launch<kGroupRows, false>(config, a);
  }
}

}  // namespace tokenfab::kernels
