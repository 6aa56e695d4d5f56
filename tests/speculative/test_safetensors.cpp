// The safetensors writer (core/speculative/safetensors_writer.h) and the Medusa config it goes
// with, read back byte by byte: the header's length and JSON, contiguous data offsets, the
// 8-byte alignment of the data, the dtype conversions, and the refusals.

#include <QTemporaryDir>
#include <QtTest>
#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/speculative/medusa_export.h"
#include "core/speculative/safetensors_writer.h"
#include "kernels/cpu/quant_types.h"

using namespace tokenfab;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

uint64_t read_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

uint16_t read_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}

// A tensor whose element i (row-major) is values[i].
SafetensorsTensor from_values(std::string name, SafetensorsDtype dtype, std::vector<int64_t> shape,
                              std::vector<float> values) {
  SafetensorsTensor t{std::move(name), dtype, std::move(shape), {}};
  const int64_t n = t.row_elements();
  t.row = [values = std::move(values), n](int64_t r, float* out) {
    std::copy_n(values.begin() + r * n, n, out);
  };
  return t;
}

DraftHeadInfo head_info(const std::string& type) {
  DraftHeadInfo info;
  info.type = type;
  info.name = "test-head";
  info.n_heads = 3;
  info.n_embd = 8;
  info.n_vocab = 32;
  return info;
}

struct ReadBack {
  uint64_t header_len = 0;
  nlohmann::json header;
  std::vector<uint8_t> bytes;
  const uint8_t* data() const { return bytes.data() + 8 + header_len; }
};

ReadBack read_back(const fs::path& path) {
  ReadBack r;
  r.bytes = read_all(path);
  r.header_len = read_u64(r.bytes.data());
  r.header = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(r.bytes.data() + 8),
                                               static_cast<size_t>(r.header_len)));
  return r;
}

}  // namespace

class TestSafetensors : public QObject {
  Q_OBJECT

 private slots:
  void header_offsets_and_alignment();
  void dtype_conversions();
  void refusals();
  void medusa_config_names();
};

void TestSafetensors::header_offsets_and_alignment() {
  QTemporaryDir dir;
  const fs::path path = fs::path(dir.path().toStdString()) / "t.safetensors";
  // Odd sizes (3 × 5 F32, 7 F16, a scalar BF16) so that the offsets are not all multiples of 8.
  std::vector<float> a(15), b(7);
  for (int i = 0; i < 15; ++i) a[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i) - 3.0f;
  for (int i = 0; i < 7; ++i) b[static_cast<size_t>(i)] = static_cast<float>(i) / 8.0f;
  const std::vector<SafetensorsTensor> tensors{
      from_values("blocks.0.layers.0.weight", SafetensorsDtype::kF32, {3, 5}, a),
      from_values("blocks.0.layers.0.bias", SafetensorsDtype::kF16, {7}, b),
      from_values("scale", SafetensorsDtype::kBF16, {}, {1.5f})};
  write_safetensors(path, tensors, {{"format", "pt"}});

  const ReadBack r = read_back(path);
  QCOMPARE((8 + r.header_len) % 8, uint64_t{0});  // the data starts 8-byte aligned
  QCOMPARE(r.header["__metadata__"], (nlohmann::json{{"format", "pt"}}));
  const nlohmann::json& w = r.header["blocks.0.layers.0.weight"];
  QCOMPARE(w["dtype"], nlohmann::json("F32"));
  QCOMPARE(w["shape"], (nlohmann::json{3, 5}));
  QCOMPARE(w["data_offsets"], (nlohmann::json{0, 60}));
  const nlohmann::json& bias = r.header["blocks.0.layers.0.bias"];
  QCOMPARE(bias["dtype"], nlohmann::json("F16"));
  QCOMPARE(bias["shape"], (nlohmann::json{7}));
  QCOMPARE(bias["data_offsets"], (nlohmann::json{60, 74}));
  QCOMPARE(r.header["scale"]["shape"], nlohmann::json::array());
  QCOMPARE(r.header["scale"]["data_offsets"], (nlohmann::json{74, 76}));
  QCOMPARE(r.bytes.size(), static_cast<size_t>(8 + r.header_len + 76));  // no gap, nothing after
  for (int i = 0; i < 15; ++i) {
    float x;
    std::memcpy(&x, r.data() + 4 * i, 4);
    QCOMPARE(x, a[static_cast<size_t>(i)]);
  }
  // The layout the writer reports is the file's.
  const SafetensorsLayout layout = safetensors_layout(tensors, {{"format", "pt"}});
  QCOMPARE(layout.header.size(), static_cast<size_t>(r.header_len));
  QCOMPARE(layout.data_bytes, uint64_t{76});
  QCOMPARE(layout.offsets[1], (std::pair<uint64_t, uint64_t>{60, 74}));
}

void TestSafetensors::dtype_conversions() {
  QTemporaryDir dir;
  const fs::path path = fs::path(dir.path().toStdString()) / "t.safetensors";
  // Exactly representable values, one that rounds (1 + 2^-11 + 2^-13: F16 keeps 10 bits, rounds
  // up; BF16 keeps 7, rounds to 1), F16's largest (BF16 rounds it up to 2^16), and a tiny one
  // (an F16 subnormal).
  const std::vector<float> v{1.0f, -2.5f, 1.0f + 0x1p-11f + 0x1p-13f, 65504.0f, 0x1p-20f, 0.0f};
  const std::vector<SafetensorsTensor> tensors{
      from_values("h", SafetensorsDtype::kF16, {6}, v),
      from_values("b", SafetensorsDtype::kBF16, {2, 3}, v)};
  write_safetensors(path, tensors, {});
  const ReadBack r = read_back(path);
  QVERIFY(!r.header.contains("__metadata__"));
  const uint8_t* h = r.data();
  const uint8_t* b = r.data() + 12;
  const std::vector<uint16_t> want_f16{0x3c00, 0xc100, 0x3c01, 0x7bff, 0x0010, 0x0000};
  const std::vector<uint16_t> want_bf16{0x3f80, 0xc020, 0x3f80, 0x4780, 0x3580, 0x0000};
  for (size_t i = 0; i < v.size(); ++i) {
    QCOMPARE(read_u16(h + 2 * i), want_f16[i]);
    QCOMPARE(read_u16(b + 2 * i), want_bf16[i]);
    QCOMPARE(read_u16(h + 2 * i), kernels::fp32_to_fp16(v[i]));  // the kernels' conversion
  }
}

void TestSafetensors::refusals() {
  QTemporaryDir dir;
  const fs::path path = fs::path(dir.path().toStdString()) / "bad.safetensors";
  auto throws = [&](std::vector<SafetensorsTensor> tensors, const char* part) {
    try {
      write_safetensors(path, tensors, {});
    } catch (const Error& e) {
      QVERIFY2(std::string(e.what()).find(part) != std::string::npos, e.what());
      QVERIFY(!fs::exists(path));  // nothing half-written under the final name
      return;
    }
    QFAIL(part);
  };
  throws({from_values("x", SafetensorsDtype::kF16, {1}, {70000.0f})}, "beyond F16's range");
  throws({from_values("x", SafetensorsDtype::kF32, {2}, {1.0f, std::nanf("")})}, "not finite");
  throws({from_values("x", SafetensorsDtype::kF32, {1}, {1.0f}),
          from_values("x", SafetensorsDtype::kF32, {1}, {1.0f})},
         "given twice");
  throws({from_values("__metadata__", SafetensorsDtype::kF32, {1}, {1.0f})}, "not a tensor name");
  throws({SafetensorsTensor{"x", SafetensorsDtype::kF32, {1}, {}}}, "has no values");
  // A BF16 copy of a value F16 cannot hold is fine.
  const std::vector<SafetensorsTensor> wide{
      from_values("x", SafetensorsDtype::kBF16, {1}, {70000.0f})};
  write_safetensors(path, wide, {});
  QVERIFY(fs::exists(path));
}

// The names vLLM's MedusaConfig reads (vllm/transformers_utils/configs/medusa.py), with the
// values our heads have; and the one refusal for an mtp head.
void TestSafetensors::medusa_config_names() {
  const DraftHeadInfo info = head_info(std::string("medusa"));
  const nlohmann::ordered_json c = medusa_hf_config(info, SafetensorsDtype::kF16);
  QCOMPARE(c["model_type"], nlohmann::ordered_json("medusa"));
  QCOMPARE(c["architectures"], (nlohmann::ordered_json{"MedusaModel"}));
  QCOMPARE(c["hidden_size"].get<int>(), 8);
  QCOMPARE(c["vocab_size"].get<int>(), 32);
  QCOMPARE(c["truncated_vocab_size"].get<int>(), 32);
  QCOMPARE(c["num_heads"].get<int>(), 3);
  QCOMPARE(c["num_hidden_layers"].get<int>(), 1);
  QCOMPARE(c["medusa_fc_bias"].get<bool>(), true);
  QCOMPARE(c["original_lm_head"].get<bool>(), true);
  QCOMPARE(c["torch_dtype"], nlohmann::ordered_json("float16"));
  QCOMPARE(medusa_hf_config(info, SafetensorsDtype::kBF16)["torch_dtype"],
           nlohmann::ordered_json("bfloat16"));
  // MedusaConfig.from_pretrained renames any key holding "num" and "heads" to num_heads.
  for (const auto& [key, value] : c.items())
    if (key.find("num") != std::string::npos)
      QVERIFY2(key == "num_heads" || key == "num_hidden_layers", key.c_str());
  try {
    check_medusa_exportable(head_info(std::string("mtp")));
    QFAIL("an mtp head was accepted");
  } catch (const Error& e) {
    QVERIFY2(std::string(e.what()).find("vLLM has no format for it") != std::string::npos,
             e.what());
  }
}

QTEST_MAIN(TestSafetensors)
#include "test_safetensors.moc"
