// Malformed files, built byte by byte: each is rejected with its own message, never a crash.

#include <QTemporaryDir>
#include <QtTest>
#include <cstring>
#include <fstream>

#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_writer.h"
#include "test_gguf.h"

using namespace tokenfab;
using namespace tokenfab::gguf;

namespace {

// Little-endian GGUF bytes, written field by field.
struct Raw {
  std::vector<uint8_t> b;

  template <class T>
  Raw& put(T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
    return *this;
  }
  Raw& u8(uint8_t v) { return put(v); }
  Raw& u32(uint32_t v) { return put(v); }
  Raw& u64(uint64_t v) { return put(v); }
  Raw& chars(std::string_view s) {
    const size_t at = b.size();
    b.resize(at + s.size());
    if (!s.empty()) std::memcpy(b.data() + at, s.data(), s.size());
    return *this;
  }
  Raw& str(std::string_view s) { return u64(s.size()).chars(s); }
  Raw& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
  Raw& pad_to(size_t a) {
    b.resize((b.size() + a - 1) / a * a, 0);
    return *this;
  }
  Raw& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  Raw& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32(uint32_t(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  QByteArray bytes() const { return QByteArray(reinterpret_cast<const char*>(b.data()), b.size()); }
};

constexpr uint32_t kF32 = 0, kQ4_0 = 2, kArray = 9, kString = 8;

Raw header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
  return Raw().chars("GGUF").u32(version).u64(n_tensors).u64(n_kv);
}

// A file with one key/value whose encoding (key, type, value) is `kv`.
Raw one_kv(const Raw& kv) {
  Raw r = header(0, 1);
  r.b.insert(r.b.end(), kv.b.begin(), kv.b.end());
  return r;
}

// Tensor infos `infos` (with `n` tensors), the data section padded to 32, then `data_bytes`.
Raw with_tensors(uint64_t n, const Raw& infos, size_t data_bytes) {
  Raw r = header(n, 0);
  r.b.insert(r.b.end(), infos.b.begin(), infos.b.end());
  return r.pad_to(32).zeros(data_bytes);
}

void add(const char* name, const Raw& raw, const char* expected) {
  QTest::newRow(name) << raw.bytes() << QString(expected);
}

void add_header_cases() {
  add("empty file", Raw(), "header: file is empty");
  add("truncated header", Raw().chars("GGUF").u32(3).u8(0).u8(0),
      "header: tensor count at offset 8 needs 8 bytes, 2 remain");
  add("bad magic", Raw().chars("GGML").u32(3).u64(0).u64(0), "header: bad magic 0x4c4d4747");
  add("version 1", header(0, 0, 1), "header: GGUF version 1 is not supported");
  add("version 4", header(0, 0, 4), "header: unsupported GGUF version 4 (expected 2 or 3)");
  add("big-endian", header(0, 0, 0x03000000), "header: big-endian GGUF file");
  add("huge tensor count", header(uint64_t{1} << 60, 0).zeros(64),
      "header: tensor count 1152921504606846976 cannot fit in the");
  add("huge kv count", header(0, uint64_t{1} << 40).zeros(64),
      "header: metadata count 1099511627776 cannot fit in the");
}

void add_metadata_cases() {
  add("truncated kv key", header(0, 1).u64(100).chars("general"),
      "metadata #0: key: string length 100 at offset 24 exceeds the 7 bytes that remain");
  add("truncated kv value", one_kv(Raw().str("a.b").u32(10).u32(0)),
      "metadata #0 'a.b': value at offset 39 needs 8 bytes, 4 remain");
  add("huge string length", one_kv(Raw().str("a.s").u32(kString).u64(uint64_t{1} << 62)),
      "metadata #0 'a.s': value: string length 4611686018427387904");
  add("unknown value type", one_kv(Raw().str("a.b").u32(13).u32(0)),
      "metadata #0 'a.b': unknown value type 13");
  add("huge array length", one_kv(Raw().str("a.arr").u32(kArray).u32(4).u64(uint64_t{1} << 61)),
      "metadata #0 'a.arr': array length 2305843009213693952 cannot fit");
  add("truncated array",
      one_kv(
          Raw().str("a.arr").u32(kArray).u32(kString).u64(3).str("x").str("y").u64(50).chars("zz")),
      "metadata #0 'a.arr' array element [2]: value: string length 50");
  add("unknown array element type", one_kv(Raw().str("a.arr").u32(kArray).u32(77).u64(0)),
      "metadata #0 'a.arr': unknown array element type 77");
  Raw deep = Raw().str("a.deep").u32(kArray);
  for (int i = 0; i < 8; ++i) deep.u32(kArray).u64(1);
  add("arrays nested too deep", one_kv(deep.zeros(16)),
      "'a.deep' array element [0][0][0][0][0][0][0]: arrays nested more than 8 deep");
  add("bad bool", one_kv(Raw().str("a.flag").u32(7).u8(2)),
      "metadata #0 'a.flag': value: bool byte 2 at offset 42 (expected 0 or 1)");
  add("empty key", one_kv(Raw().str("").u32(4).u32(1)), "metadata #0: empty key");
  add("duplicate keys", header(0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2),
      "metadata #1 'a.b': duplicate metadata key (first defined at metadata #0)");
  add("alignment of wrong type", one_kv(Raw().str("general.alignment").u32(10).u64(32)),
      "metadata #0 'general.alignment': has type uint64 (expected uint32)");
  add("alignment not a power of two", one_kv(Raw().kv_u32("general.alignment", 48)),
      "'general.alignment': alignment 48 is not valid (expected a non-zero power of two)");
  add("alignment zero", one_kv(Raw().kv_u32("general.alignment", 0)),
      "'general.alignment': alignment 0 is not valid");
}

void add_tensor_cases() {
  add("truncated tensor info", header(1, 0).str("weights.x").u32(1).u64(32).u32(kF32).u32(0),
      "tensor info #0 'weights.x': data offset at offset 57 needs 8 bytes, 4 remain");
  add("empty tensor name", with_tensors(1, Raw().tensor("", {32}, kF32, 0), 128),
      "tensor info #0: empty tensor name");
  add("zero n_dims", with_tensors(1, Raw().tensor("w", {}, kF32, 0), 128),
      "tensor info #0 'w': n_dims 0 (expected 1 to 4)");
  add("too many dims", with_tensors(1, Raw().tensor("w", {1, 1, 1, 1, 1}, kF32, 0), 128),
      "tensor info #0 'w': n_dims 5 (expected 1 to 4)");
  add("zero dim", with_tensors(1, Raw().tensor("w", {32, 0}, kF32, 0), 128),
      "tensor info #0 'w': dims[1] is 0 (expected >= 1)");
  add("element count overflow",
      with_tensors(1, Raw().tensor("w", {uint64_t{1} << 32, uint64_t{1} << 32}, kF32, 0), 128),
      "tensor info #0 'w': element count overflows int64 at dims[1]");
  add("byte size overflow",
      with_tensors(1, Raw().tensor("w", {uint64_t{1} << 31, uint64_t{1} << 31}, kF32, 0), 128),
      "tensor info #0 'w': byte size overflows int64");
  add("unknown tensor type", with_tensors(1, Raw().tensor("w", {32}, 4, 0), 128),
      "tensor info #0 'w': unknown tensor type 4");
  add("not a block multiple", with_tensors(1, Raw().tensor("w", {48}, kQ4_0, 0), 128),
      "tensor info #0 'w': dims[0] = 48 is not a multiple of the Q4_0 block size 32");
  add("duplicate tensor names",
      with_tensors(2, Raw().tensor("w", {4}, kF32, 0).tensor("w", {4}, kF32, 32), 64),
      "tensor info #1 'w': duplicate tensor name (first defined at tensor info #0)");
  add("truncated tensor data", header(1, 0).tensor("w", {4}, kF32, 0),
      "tensor data: section starts at offset 64 (header end 57 padded to alignment 32)");
  add("misaligned tensor offset", with_tensors(1, Raw().tensor("w", {4}, kF32, 4), 64),
      "tensor data 'w': offset 4 is not a multiple of the alignment 32");
  add("tensor past EOF", with_tensors(1, Raw().tensor("w", {16}, kF32, 0), 32),
      "tensor data 'w': data at offset 0 + 64 bytes runs past the end of the file");
  add("tensor offset past EOF", with_tensors(1, Raw().tensor("w", {1}, kF32, 1u << 30), 32),
      "tensor data 'w': data at offset 1073741824 + 4 bytes runs past the end of the file");
  add("overlapping tensors",
      with_tensors(2, Raw().tensor("a", {16}, kF32, 0).tensor("b", {8}, kF32, 32), 64),
      "tensor data 'b': data [32, 64) overlaps tensor 'a' [0, 64)");
  Raw aligned = header(1, 1).kv_u32("general.alignment", 64);
  aligned.tensor("w", {4}, kF32, 32).pad_to(64).zeros(128);
  add("offset misaligned for general.alignment", aligned,
      "tensor data 'w': offset 32 is not a multiple of the alignment 64");
}

}  // namespace

void TestGguf::rejects_malformed_file_data() {
  QTest::addColumn<QByteArray>("bytes");
  QTest::addColumn<QString>("expected");
  add_header_cases();
  add_metadata_cases();
  add_tensor_cases();
}

void TestGguf::rejects_malformed_file() {
  QFETCH(QByteArray, bytes);
  QFETCH(QString, expected);
  const std::span<const uint8_t> span(reinterpret_cast<const uint8_t*>(bytes.constData()),
                                      size_t(bytes.size()));
  try {
    GgufFile::parse(span, "bad.gguf");
    QFAIL("parsed without an Error");
  } catch (const Error& e) {
    const QString message = QString::fromUtf8(e.what());
    QVERIFY2(message.startsWith("bad.gguf: "), qPrintable(message));
    QVERIFY2(message.contains(expected),
             qPrintable(QString("message \"%1\"\n   lacks \"%2\"").arg(message, expected)));
  }
}

namespace {

std::vector<uint8_t> small_valid_file() {
  GgufWriter w;
  w.add("general.name", Value::string("tiny"));
  w.add("tokens", Value::string_array({"a", "bb", "ccc"}));
  w.add("nested",
        Value::array(ValueType::Array, {Value::array(ValueType::Int16, {Value::i16(3)})}));
  w.add("flag", Value::boolean(true));
  const std::vector<uint8_t> q(34 * 2, 7), f(4 * 3, 1);
  w.add_tensor("q", TensorType::Q8_0, {32, 2}, q);
  w.add_tensor("f", TensorType::F32, {3}, f);
  return w.to_bytes();
}

}  // namespace

void TestGguf::rejects_every_truncation() {
  const std::vector<uint8_t> bytes = small_valid_file();
  const GgufFile whole = GgufFile::parse(bytes, "whole.gguf");
  const TensorInfo& last = whole.tensors().back();
  const size_t end_of_data = size_t(last.data - bytes.data()) + last.n_bytes;
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::span<const uint8_t> prefix(bytes.data(), n);
    if (n < end_of_data) {
      QVERIFY_THROWS_EXCEPTION(Error, GgufFile::parse(prefix, "cut.gguf"));
    } else {
      QCOMPARE(GgufFile::parse(prefix, "cut.gguf").tensors().size(), size_t{2});  // padding only
    }
  }
}

// Every single-byte corruption of the header and metadata either parses or raises Error.
void TestGguf::survives_corrupted_bytes() {
  const std::vector<uint8_t> bytes = small_valid_file();
  const size_t head = GgufFile::parse(bytes, "x").data_offset();
  int rejected = 0;
  for (size_t i = 0; i < head; ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x80}, uint8_t(bytes[i] + 1)}) {
      std::vector<uint8_t> copy = bytes;
      copy[i] = v;
      try {
        GgufFile::parse(copy, "corrupt.gguf");
      } catch (const Error&) {
        ++rejected;
      }
    }
  }
  QVERIFY(rejected > 0);
}

void TestGguf::open_reports_missing_empty_and_directory() {
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const std::string missing = dir.filePath("missing.gguf").toStdString();
  const std::string empty = dir.filePath("empty.gguf").toStdString();
  std::ofstream(empty).close();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {missing, "cannot open " + missing + ": No such file or directory"},
      {empty, empty + ": file is empty"},
      {dir.path().toStdString(), "cannot open " + dir.path().toStdString() + ": it is a directory"},
  };
  for (const auto& [path, expected] : cases) {
    try {
      GgufFile::open(path);
      QFAIL("opened without an Error");
    } catch (const Error& e) {
      QVERIFY2(std::string(e.what()).find(expected) != std::string::npos, e.what());
    }
  }
}
