#include "tests/model/reference_forward.h"

#include <cmath>
#include <optional>
#include <string>

#include "core/common/error.h"
#include "core/model/llama_model.h"
#include "kernels/cpu/quant_types.h"
#include "kernels/cpu/quantize.h"

namespace tokenfab::test {

namespace {

using Vec = std::vector<double>;

// A weight expanded to f32: (rows, cols), row-major. 1-D tensors have one row.
struct Dense {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> w;
};

// The kernels' type of the tensor (the loader's mapping), or Error for one it cannot read.
kernels::WeightType kernel_type(const gguf::TensorInfo& t) {
  if (const std::optional<kernels::WeightType> type = kernel_type_of(t.type)) return *type;
  throw Error("reference forward: tensor " + t.name + " has a type it cannot read");
}

double to_bf16(double x) {
  return kernels::bf16_to_fp32(kernels::fp32_to_bf16(static_cast<float>(x)));
}
double to_fp16(double x) {
  return kernels::fp16_to_fp32(kernels::fp32_to_fp16(static_cast<float>(x)));
}

Dense dense(const gguf::GgufFile& file, const std::string& name, Rounding rounding) {
  const gguf::TensorInfo& t = file.tensor(name);
  Dense d;
  d.cols = static_cast<int64_t>(t.dims[0]);
  d.rows = t.dims.size() > 1 ? static_cast<int64_t>(t.dims[1]) : 1;
  d.w.resize(static_cast<size_t>(d.rows * d.cols));
  const kernels::WeightType type = kernel_type(t);
  const uint64_t row_bytes = kernels::row_bytes(type, static_cast<uint64_t>(d.cols));
  for (int64_t r = 0; r < d.rows; ++r)
    kernels::dequantize_row(type, t.data + r * row_bytes, d.w.data() + r * d.cols, d.cols);
  if (rounding != Rounding::kExact)
    for (float& w : d.w) w = static_cast<float>(to_bf16(w));
  return d;
}

struct Config {
  int64_t n_embd = 0, n_layer = 0;
  int n_head = 0, n_kv_head = 0, head_dim = 0;
  double eps = 0.0, rope_base = 0.0;
  Rounding rounding = Rounding::kExact;
};

Config read_config(const gguf::GgufFile& f) {
  Config c;
  c.n_embd = f.get("llama.embedding_length").as_int();
  c.n_layer = f.get("llama.block_count").as_int();
  c.n_head = static_cast<int>(f.get("llama.attention.head_count").as_int());
  c.n_kv_head = static_cast<int>(f.get("llama.attention.head_count_kv").as_int());
  c.head_dim = static_cast<int>(c.n_embd / c.n_head);
  c.eps = f.get("llama.attention.layer_norm_rms_epsilon").as_float();
  c.rope_base = f.get("llama.rope.freq_base").as_float();
  if (const gguf::Value* rot = f.find("llama.rope.dimension_count");
      rot && rot->as_int() != c.head_dim)
    throw Error("reference forward: partial RoPE is not implemented");
  return c;
}

// y = W x: (rows) from (cols), x rounded first as `rounding` says.
Vec matvec(const Dense& m, const Vec& x_in, Rounding rounding) {
  Vec x = x_in;
  if (rounding == Rounding::kGpuFewRows)
    for (double& v : x) v = static_cast<float>(v);
  if (rounding == Rounding::kGpuManyRows)
    for (double& v : x) v = to_bf16(v);
  Vec y(static_cast<size_t>(m.rows), 0.0);
  for (int64_t r = 0; r < m.rows; ++r) {
    const float* row = m.w.data() + r * m.cols;
    double sum = 0.0;
    for (int64_t c = 0; c < m.cols; ++c) sum += static_cast<double>(row[c]) * x[c];
    y[r] = sum;
  }
  return y;
}

Vec rms_norm(const Vec& x, const Dense& w, double eps) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * scale * w.w[i];
  return y;
}

// Rotates pairs (v[2i], v[2i+1]) of each head by pos · base^(-2i / head_dim) (GGUF's Llama
// convention: Q/K rows are stored permuted for exactly this pairing).
void rope(Vec& v, int n_heads, int head_dim, int64_t pos, double base) {
  for (int h = 0; h < n_heads; ++h) {
    double* x = v.data() + h * head_dim;
    for (int i = 0; i < head_dim / 2; ++i) {
      const double theta = static_cast<double>(pos) * std::pow(base, -2.0 * i / head_dim);
      const double a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * std::cos(theta) - b * std::sin(theta);
      x[2 * i + 1] = a * std::sin(theta) + b * std::cos(theta);
    }
  }
}

// Causal attention of every position over positions 0..t. Query head h reads KV head
// h / (n_head / n_kv_head) (grouped-query attention: consecutive query heads share one KV head).
std::vector<Vec> attention(const Config& c, const std::vector<Vec>& q, const std::vector<Vec>& k,
                           const std::vector<Vec>& v) {
  const int group = c.n_head / c.n_kv_head;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  std::vector<Vec> out(q.size(), Vec(static_cast<size_t>(c.n_head) * c.head_dim, 0.0));
  for (size_t t = 0; t < q.size(); ++t) {
    for (int h = 0; h < c.n_head; ++h) {
      const int kvh = h / group;
      Vec p(t + 1);
      double max = -INFINITY;
      for (size_t s = 0; s <= t; ++s) {
        double dot = 0.0;
        for (int d = 0; d < c.head_dim; ++d)
          dot += q[t][h * c.head_dim + d] * k[s][kvh * c.head_dim + d];
        p[s] = dot * scale;
        max = std::max(max, p[s]);
      }
      double sum = 0.0;
      for (double& x : p) sum += (x = std::exp(x - max));
      for (size_t s = 0; s <= t; ++s)
        for (int d = 0; d < c.head_dim; ++d)
          out[t][h * c.head_dim + d] += p[s] / sum * v[s][kvh * c.head_dim + d];
    }
  }
  return out;
}

void add(Vec& y, const Vec& x) {
  for (size_t i = 0; i < y.size(); ++i) y[i] += x[i];
}

void layer(const gguf::GgufFile& f, const Config& c, int64_t index, std::vector<Vec>& x) {
  const std::string p = "blk." + std::to_string(index) + ".";
  // The norms' weights stay exact: the GPU's norm kernels read them as f32.
  const Dense attn_norm = dense(f, p + "attn_norm.weight", Rounding::kExact),
              ffn_norm = dense(f, p + "ffn_norm.weight", Rounding::kExact);
  const Rounding r = c.rounding;
  const Dense wq = dense(f, p + "attn_q.weight", r), wk = dense(f, p + "attn_k.weight", r),
              wv = dense(f, p + "attn_v.weight", r), wo = dense(f, p + "attn_output.weight", r),
              gate = dense(f, p + "ffn_gate.weight", r), up = dense(f, p + "ffn_up.weight", r),
              down = dense(f, p + "ffn_down.weight", r);
  std::vector<Vec> q, k, v;  // per position: (q_dim), (kv_dim), (kv_dim)
  for (size_t t = 0; t < x.size(); ++t) {
    const Vec h = rms_norm(x[t], attn_norm, c.eps);
    q.push_back(matvec(wq, h, r));
    k.push_back(matvec(wk, h, r));
    v.push_back(matvec(wv, h, r));
    rope(q.back(), c.n_head, c.head_dim, static_cast<int64_t>(t), c.rope_base);
    rope(k.back(), c.n_kv_head, c.head_dim, static_cast<int64_t>(t), c.rope_base);
    if (r != Rounding::kExact) {  // stored in the fp16 pool, read back by the attention
      for (double& e : k.back()) e = to_fp16(e);
      for (double& e : v.back()) e = to_fp16(e);
    }
  }
  const std::vector<Vec> att = attention(c, q, k, v);
  for (size_t t = 0; t < x.size(); ++t) {
    add(x[t], matvec(wo, att[t], r));
    const Vec h = rms_norm(x[t], ffn_norm, c.eps);
    Vec g = matvec(gate, h, r);
    const Vec u = matvec(up, h, r);
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];  // SiLU(g)·u
    add(x[t], matvec(down, g, r));
  }
}

}  // namespace

std::vector<double> reference_logits(const gguf::GgufFile& f, std::span<const int32_t> tokens,
                                     Rounding rounding) {
  Config c = read_config(f);
  c.rounding = rounding;
  // (n_vocab, n_embd): the GPU, too, reads the embedding rows in the file's own type.
  const Dense embd = dense(f, "token_embd.weight", Rounding::kExact);
  std::vector<Vec> x;  // (n, n_embd) residual stream
  for (int32_t token : tokens)
    x.emplace_back(embd.w.begin() + token * c.n_embd, embd.w.begin() + (token + 1) * c.n_embd);
  for (int64_t i = 0; i < c.n_layer; ++i) layer(f, c, i, x);

  const Dense norm = dense(f, "output_norm.weight", Rounding::kExact);
  const Dense out = f.find_tensor("output.weight") != nullptr
                        ? dense(f, "output.weight", rounding)
                        : dense(f, "token_embd.weight", rounding);  // tied: the GPU's LM head copy
  std::vector<double> logits;
  for (const Vec& row : x) {
    const Vec l = matvec(out, rms_norm(row, norm, c.eps), rounding);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  return logits;
}

}  // namespace tokenfab::test
