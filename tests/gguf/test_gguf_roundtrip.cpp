// Files written by GgufWriter read back exactly; the type table; value conversions.

#include <QDir>
#include <QTemporaryDir>
#include <QtTest>
#include <cstring>
#include <limits>

#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_writer.h"
#include "test_gguf.h"

using namespace tokenfab;
using namespace tokenfab::gguf;

namespace {

template <class T>
using Lim = std::numeric_limits<T>;

// One entry of every value type, arrays of each scalar type, strings, nested and empty arrays.
std::vector<KeyValue> every_value() {
  using VT = ValueType;
  return {
      {"t.u8", Value::u8(255)},
      {"t.i8", Value::i8(-128)},
      {"t.u16", Value::u16(65535)},
      {"t.i16", Value::i16(-32768)},
      {"t.u32", Value::u32(Lim<uint32_t>::max())},
      {"t.i32", Value::i32(Lim<int32_t>::min())},
      {"t.f32", Value::f32(-3.25f)},
      {"t.bool_true", Value::boolean(true)},
      {"t.bool_false", Value::boolean(false)},
      {"t.string", Value::string("h\xc3\xa9llo, a string longer than the small-string buffer")},
      {"t.empty_string", Value::string("")},
      {"t.u64", Value::u64(Lim<uint64_t>::max())},
      {"t.i64", Value::i64(Lim<int64_t>::min())},
      {"t.f64", Value::f64(-1.5e300)},
      {"a.u8", Value::array(VT::UInt8, {Value::u8(0), Value::u8(255)})},
      {"a.i8", Value::array(VT::Int8, {Value::i8(-128), Value::i8(127)})},
      {"a.u16", Value::array(VT::UInt16, {Value::u16(1), Value::u16(65535)})},
      {"a.i16", Value::array(VT::Int16, {Value::i16(-32768), Value::i16(32767)})},
      {"a.u32", Value::array(VT::UInt32, {Value::u32(7), Value::u32(Lim<uint32_t>::max())})},
      {"a.i32", Value::array(VT::Int32, {Value::i32(Lim<int32_t>::min()), Value::i32(-1)})},
      {"a.f32", Value::array(VT::Float32, {Value::f32(0.5f), Value::f32(-1e30f)})},
      {"a.bool", Value::array(VT::Bool, {Value::boolean(true), Value::boolean(false)})},
      {"a.string", Value::string_array({"a", "", "\xe2\x96\x81token with spaces", "\n"})},
      {"a.u64", Value::array(VT::UInt64, {Value::u64(Lim<uint64_t>::max()), Value::u64(0)})},
      {"a.i64", Value::array(VT::Int64, {Value::i64(Lim<int64_t>::min()), Value::i64(1)})},
      {"a.f64", Value::array(VT::Float64, {Value::f64(1e-300), Value::f64(2.0)})},
      {"a.nested",
       Value::array(VT::Array, {Value::array(VT::Int32, {Value::i32(1), Value::i32(2)}),
                                Value::array(VT::Int32, {}), Value::string_array({"x", "y"})})},
      {"a.nested2",
       Value::array(VT::Array,
                    {Value::array(VT::Array, {Value::array(VT::UInt8, {Value::u8(9)})})})},
      {"a.empty_u32", Value::array(VT::UInt32, {})},
      {"a.empty_string", Value::array(VT::String, {})},
  };
}

struct TensorSpec {
  const char* name;
  TensorType type;
  std::vector<uint64_t> dims;
};

const std::vector<TensorSpec>& tensor_specs() {
  static const std::vector<TensorSpec> specs = {
      {"f32", TensorType::F32, {4, 3}},         {"f16", TensorType::F16, {8}},
      {"q4_0", TensorType::Q4_0, {64, 2}},      {"q4_1", TensorType::Q4_1, {32}},
      {"q8_0", TensorType::Q8_0, {32, 3, 1}},   {"q4_k", TensorType::Q4_K, {256}},
      {"q6_k", TensorType::Q6_K, {256, 2}},     {"i8", TensorType::I8, {5}},
      {"bf16", TensorType::BF16, {7, 1, 1, 2}}, {"i32", TensorType::I32, {1}},
  };
  return specs;
}

std::vector<uint8_t> pattern_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return out;
}

GgufWriter every_value_writer(uint64_t alignment) {
  GgufWriter writer;
  writer.set_alignment(alignment);
  for (auto& kv : every_value()) writer.add(kv.key, kv.value);
  uint32_t seed = 1;
  for (const auto& spec : tensor_specs()) {
    const auto size = tensor_size(static_cast<uint32_t>(spec.type), spec.dims);
    writer.add_tensor(spec.name, spec.type, spec.dims, pattern_bytes(size->n_bytes, seed++));
  }
  return writer;
}

void verify_every_value(const GgufFile& file, uint64_t alignment) {
  std::vector<KeyValue> expected = every_value();
  if (alignment != kDefaultAlignment) {
    expected.insert(expected.begin(), {"general.alignment", Value::u32(uint32_t(alignment))});
  }
  QCOMPARE(file.version(), 3u);
  QCOMPARE(file.alignment(), alignment);
  QCOMPARE(file.metadata().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    QCOMPARE(file.metadata()[i].key, expected[i].key);
    QVERIFY2(file.metadata()[i].value == expected[i].value, expected[i].key.c_str());
    QVERIFY(file.find(expected[i].key) != nullptr);
  }
  QCOMPARE(file.data_offset() % alignment, uint64_t{0});
  const uint8_t* data_start = file.bytes().data() + file.data_offset();
  QCOMPARE(file.tensors().size(), tensor_specs().size());
  uint32_t seed = 1;
  for (size_t i = 0; i < tensor_specs().size(); ++i) {
    const TensorSpec& spec = tensor_specs()[i];
    const TensorInfo& t = file.tensors()[i];
    QCOMPARE(t.name, std::string(spec.name));
    QCOMPARE(&file.tensor(spec.name), &t);
    QCOMPARE(t.type, spec.type);
    QCOMPARE(t.dims, spec.dims);
    const auto size = tensor_size(static_cast<uint32_t>(spec.type), spec.dims);
    QCOMPARE(t.n_elements, size->n_elements);
    QCOMPARE(t.n_bytes, size->n_bytes);
    QCOMPARE(uint64_t(t.data - data_start), t.offset);
    QCOMPARE(t.offset % alignment, uint64_t{0});
    const auto bytes = pattern_bytes(t.n_bytes, seed++);
    QVERIFY(std::memcmp(t.data, bytes.data(), bytes.size()) == 0);
  }
}

}  // namespace

void TestGguf::type_traits_match_ggml() {
  // (raw type, elements per block, bytes per block) from ggml's type_traits table.
  const std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> table = {
      {0, 1, 4},      {1, 1, 2},      {2, 32, 18},   {3, 32, 20},    {6, 32, 22},    {7, 32, 24},
      {8, 32, 34},    {9, 32, 36},    {10, 256, 84}, {11, 256, 110}, {12, 256, 144}, {13, 256, 176},
      {14, 256, 210}, {15, 256, 292}, {16, 256, 66}, {17, 256, 74},  {18, 256, 98},  {19, 256, 50},
      {20, 32, 18},   {21, 256, 110}, {22, 256, 82}, {23, 256, 136}, {24, 1, 1},     {25, 1, 2},
      {26, 1, 4},     {27, 1, 8},     {28, 1, 8},    {29, 256, 56},  {30, 1, 2},     {34, 256, 54},
      {35, 256, 66}};
  for (auto [raw, elements, bytes] : table) {
    auto traits = tensor_type_traits(raw);
    QVERIFY2(traits.has_value(), qPrintable(QString::number(raw)));
    QCOMPARE(traits->block_elements, elements);
    QCOMPARE(traits->block_bytes, bytes);
  }
  for (uint32_t raw : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 1000u}) {
    QVERIFY(!tensor_type_traits(raw).has_value());
  }
  QCOMPARE(std::string(tensor_type_name(TensorType::Q4_1)), std::string("Q4_1"));
}

void TestGguf::round_trip_every_value_type_data() {
  QTest::addColumn<quint64>("alignment");
  for (quint64 a : {1u, 8u, 32u, 64u, 256u, 4096u}) {
    QTest::newRow(qPrintable(QString("alignment %1").arg(a))) << a;
  }
}

void TestGguf::round_trip_every_value_type() {
  QFETCH(quint64, alignment);
  const GgufWriter writer = every_value_writer(alignment);
  const std::vector<uint8_t> bytes = writer.to_bytes();
  verify_every_value(GgufFile::parse(bytes, "memory.gguf"), alignment);

  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const std::filesystem::path path = dir.filePath("every.gguf").toStdString();
  writer.write(path);
  const GgufFile file = GgufFile::open(path);
  QCOMPARE(file.name(), path.string());
  verify_every_value(file, alignment);
  QCOMPARE(file.file_size(), uint64_t(bytes.size()));
  QVERIFY(std::memcmp(file.bytes().data(), bytes.data(), bytes.size()) == 0);
  // The mapping starts on a page boundary, so the data is aligned in memory too.
  for (const TensorInfo& t : file.tensors()) {
    QCOMPARE(reinterpret_cast<uintptr_t>(t.data) % alignment, uintptr_t{0});
  }
}

void TestGguf::reads_version_2() {
  std::vector<uint8_t> bytes = every_value_writer(32).to_bytes();
  const uint32_t v2 = 2;  // v2 and v3 differ only in v3 allowing big-endian files
  std::memcpy(bytes.data() + 4, &v2, 4);
  const GgufFile file = GgufFile::parse(bytes, "v2.gguf");
  QCOMPARE(file.version(), 2u);
  QCOMPARE(file.metadata().size(), every_value().size());
}

void TestGguf::write_leaves_no_temp_file() {
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const std::filesystem::path path = dir.filePath("out.gguf").toStdString();
  GgufWriter first;
  first.add("general.name", Value::string("first"));
  first.write(path);
  GgufWriter second;
  second.add("general.name", Value::string("second"));
  second.write(path);  // replaces the existing file
  const auto entries = QDir(dir.path()).entryList(QDir::Files | QDir::Hidden | QDir::System);
  QCOMPARE(entries, QStringList{"out.gguf"});
  QCOMPARE(GgufFile::open(path).get("general.name").as_string(), std::string("second"));
  // A directory that does not exist: an error naming the path, and nothing written.
  const auto missing = std::filesystem::path(dir.path().toStdString()) / "no" / "x.gguf";
  try {
    second.write(missing);
    QFAIL("expected an Error");
  } catch (const Error& e) {
    QVERIFY2(QString(e.what()).startsWith("cannot write " + QString::fromStdString(missing)),
             e.what());
  }
}

namespace {

void expect_error(const std::function<void()>& action, const char* expected) {
  try {
    action();
  } catch (const Error& e) {
    QVERIFY2(std::string(e.what()).find(expected) != std::string::npos,
             qPrintable(QString("message \"%1\" lacks \"%2\"").arg(e.what(), expected)));
    return;
  }
  QFAIL(qPrintable(QString("no Error; expected \"%1\"").arg(expected)));
}

}  // namespace

void TestGguf::writer_rejects_bad_input() {
  GgufWriter w;
  const std::vector<uint8_t> sixteen(16);
  expect_error([&] { w.add_tensor("x", TensorType::F32, {3}, sixteen); },
               "tensor 'x': data has 16 bytes, expected 12");
  expect_error([&] { w.add_tensor("x", TensorType::Q4_0, {16}, sixteen); },
               "dims[0] = 16 is not a multiple of the Q4_0 block size 32");
  expect_error([&] { w.add_tensor("x", TensorType::F32, {4, 0}, sixteen); }, "dims[1] is 0");
  expect_error([&] { w.add_tensor("x", TensorType::F32, {}, sixteen); }, "0 dims");
  expect_error([&] { w.add_tensor("x", TensorType(4), {4}, sixteen); }, "unknown tensor type 4");
  w.add_tensor("x", TensorType::F32, {4}, sixteen);
  expect_error([&] { w.add_tensor("x", TensorType::F32, {4}, sixteen); },
               "duplicate tensor name 'x'");
  w.add("k", Value::u8(1));
  expect_error([&] { w.add("k", Value::u8(2)); }, "duplicate metadata key 'k'");
  expect_error([&] { w.set_alignment(48); }, "alignment 48 is not valid");
  expect_error([&] { w.set_alignment(0); }, "alignment 0 is not valid");
  expect_error([&] { w.add("general.alignment", Value::u64(64)); }, "must be uint32");
  expect_error([&] { w.add("bad", Value(ValueType::UInt32, std::string("s"))); },
               "metadata 'bad': value tagged uint32 holds another type");
  expect_error(
      [&] { w.add("bad", Value(ValueType::Array, Value::Array{Value::u8(1)}, ValueType::Int8)); },
      "array element of type uint8 in an array of int8");
}

void TestGguf::value_conversions_are_range_checked() {
  QCOMPARE(Value::u8(200).as_int(), int64_t{200});
  QCOMPARE(Value::i16(-5).as_int(), int64_t{-5});
  QCOMPARE(Value::u32(7).as_uint(), uint64_t{7});
  QCOMPARE(Value::i32(3).as_float(), 3.0);
  QCOMPARE(Value::f32(0.5f).as_float(), 0.5);
  QVERIFY(Value::u64(1).is_integer());
  QVERIFY(!Value::boolean(true).is_integer());
  QVERIFY(!Value::f64(1).is_integer());
  expect_error([] { Value::u64(Lim<uint64_t>::max()).as_int("n.big"); },
               "n.big: expected an integer that fits in int64, got 18446744073709551615");
  expect_error([] { Value::i8(-1).as_uint("n.neg"); },
               "n.neg: expected a non-negative integer, got -1");
  expect_error([] { Value::string("7").as_int("n.str"); },
               "n.str: expected an integer, got string");
  expect_error([] { Value::u8(1).as_bool("n.b"); }, "n.b: expected a bool, got uint8");
  expect_error([] { Value::u8(1).as_string("n.s"); }, "n.s: expected a string, got uint8");
  expect_error([] { Value::string("x").as_float("n.f"); }, "n.f: expected a number, got string");
  expect_error([] { Value::u8(1).as_array("n.a"); }, "n.a: expected an array, got uint8");

  const Value ints = Value::array(ValueType::Int32, {Value::i32(-1), Value::i32(2)});
  QCOMPARE(ints.as_int_array(), (std::vector<int64_t>{-1, 2}));
  QCOMPARE(ints.as_float_array(), (std::vector<double>{-1.0, 2.0}));
  expect_error([&] { ints.as_string_array("tok"); }, "tok[0]: expected a string, got int32");
  const Value big = Value::array(ValueType::UInt64, {Value::u64(1), Value::u64(~0ull)});
  expect_error([&] { big.as_int_array("ids"); }, "ids[1]: expected an integer that fits");
  QCOMPARE(Value::string_array({"a", "b"}).as_string_array(), (std::vector<std::string>{"a", "b"}));
  expect_error([] { Value::array(ValueType::UInt8, {Value::i8(1)}); },
               "element 0 has type int8, expected uint8");
}
