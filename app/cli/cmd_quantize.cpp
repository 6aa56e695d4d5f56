// quantize: re-quantizes a model file into one of llama.cpp's file types, each tensor taking the
// type llama-quantize would give it (core/model/quant_mix.h): Q4_K_M, Q8_0, IQ4_XS, … Every
// changed tensor is dequantized to f32 and quantized again row by row (rows spread over
// --threads); tensors whose type stays are copied. The metadata is copied with general.file_type
// and general.quantization_version set, and the file is written under a temporary name and
// renamed, so a failure leaves nothing under OUT.

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <vector>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/gguf/file_type.h"
#include "core/gguf/gguf_writer.h"
#include "core/model/llama_model.h"
#include "core/model/quant_mix.h"
#include "core/model/requantize_rows.h"

namespace tokenfab::cli {

namespace {

// ggml's quantization version (GGML_QNT_VERSION), which llama-quantize writes beside the file type.
constexpr uint32_t kQuantizationVersion = 2;

struct QuantizeCommand {
  CommonOptions common;
  std::string type;
  std::string in;
  std::string out;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Refuses what cannot be quantized before anything is read or written: an unknown type, an
// input that is not there, the input as its own output, an output directory that is missing.
uint32_t check_request(const QuantizeCommand& c) {
  const std::optional<uint32_t> file_type = quant_mix_file_type(c.type);
  if (!file_type)
    throw Error("--type " + c.type + ": expected one of " + quant_mix_names_text() +
                " (case does not matter)");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(c.in, ec))
    throw Error("cannot read " + c.in + ": " +
                (std::filesystem::exists(c.in, ec) ? "not a regular file" : "no such file"));
  if (std::filesystem::exists(c.out, ec) && std::filesystem::equivalent(c.in, c.out, ec))
    throw Error("the output " + c.out + " is the input file; write the quantized model elsewhere");
  const std::filesystem::path out(c.out);
  if (out.has_parent_path() && !std::filesystem::is_directory(out.parent_path(), ec))
    throw Error("cannot write " + c.out + ": directory " + out.parent_path().string() +
                " does not exist");
  return *file_type;
}

// The input's metadata with general.file_type and general.quantization_version set (in place
// where the input has them); general.alignment is the writer's to state.
void copy_metadata(const gguf::GgufFile& file, uint32_t file_type, gguf::GgufWriter& w) {
  bool has_file_type = false, has_version = false;
  for (const gguf::KeyValue& kv : file.metadata()) {
    if (kv.key == "general.alignment") continue;
    if (kv.key == "general.file_type") {
      w.add(kv.key, gguf::Value::u32(file_type));
      has_file_type = true;
    } else if (kv.key == "general.quantization_version") {
      w.add(kv.key, gguf::Value::u32(kQuantizationVersion));
      has_version = true;
    } else {
      w.add(kv.key, kv.value);
    }
  }
  if (!has_version) w.add("general.quantization_version", gguf::Value::u32(kQuantizationVersion));
  if (!has_file_type) w.add("general.file_type", gguf::Value::u32(file_type));
  w.set_alignment(file.alignment());
}

struct Totals {
  uint64_t bytes_in = 0, bytes_out = 0, elements = 0;
  int64_t requantized = 0;
  std::map<std::string, int64_t> types;  // tensors by output type
};

// One tensor in `to`: the same bytes, or each row dequantized and quantized again.
std::vector<uint8_t> convert(const gguf::TensorInfo& t, gguf::TensorType to, int threads) {
  if (to == t.type) return {t.data, t.data + t.n_bytes};
  const std::optional<kernels::WeightType> from_type = kernel_type_of(t.type);
  const std::optional<kernels::WeightType> to_type = kernel_type_of(to);
  if (!from_type || !to_type)  // the loader accepted the file, and mixtures choose kernel types
    throw Error("tensor " + t.name + ": cannot convert " + gguf::tensor_type_name(t.type) + " to " +
                gguf::tensor_type_name(to));
  const auto cols = static_cast<int64_t>(t.dims[0]);
  const auto rows = static_cast<int64_t>(t.n_elements / t.dims[0]);
  std::vector<uint8_t> out(kernels::row_bytes(*to_type, static_cast<uint64_t>(cols)) *
                           static_cast<uint64_t>(rows));
  requantize_rows(*from_type, t.data, *to_type, out.data(), rows, cols, threads);
  return out;
}

void run_quantize(const QuantizeCommand& c) {
  const auto start = Clock::now();
  const uint32_t file_type = check_request(c);
  const std::string type_name = *gguf::file_type_name(file_type);
  // Loaded as the engine loads it (without the CPU repack): a file Tokenfab cannot run is refused
  // with the loader's message, and every block scale has been checked.
  const std::unique_ptr<LlamaModel> model = LlamaModel::load(c.in, /*repack=*/false);
  const gguf::GgufFile& file = model->file();
  const std::vector<gguf::TensorType> types = quant_mix(MixModel::from_gguf(file), file_type);
  const int threads = resolve_threads(c.common.threads);

  gguf::GgufWriter w;
  copy_metadata(file, file_type, w);
  Totals totals;
  const auto convert_start = Clock::now();
  double next_report_s = 0.0;
  const std::vector<gguf::TensorInfo>& tensors = file.tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const gguf::TensorInfo& t = tensors[i];
    const std::vector<uint8_t> data = convert(t, types[i], threads);
    w.add_tensor(t.name, types[i], t.dims, data);
    totals.bytes_in += t.n_bytes;
    totals.bytes_out += data.size();
    totals.elements += t.n_elements;
    totals.requantized += types[i] != t.type;
    ++totals.types[gguf::tensor_type_name(types[i])];
    // Progress at most four times a second, and at the end.
    const double elapsed = seconds_since(convert_start);
    if (elapsed >= next_report_s || i + 1 == tensors.size()) {
      std::cerr << "\rquantize: " << i + 1 << "/" << tensors.size() << " tensors, "
                << static_cast<int>(totals.bytes_in / 1e6 / elapsed) << " MB/s" << std::flush;
      next_report_s = elapsed + 0.25;
    }
  }
  const double convert_s = seconds_since(convert_start);
  std::cerr << std::endl;
  w.write(c.out);

  const double bits = 8.0 * static_cast<double>(totals.bytes_out) / totals.elements;
  const nlohmann::json j = {
      {"type", type_name},
      {"file_type", file_type},
      {"input", c.in},
      {"output", c.out},
      {"tensors", tensors.size()},
      {"requantized", totals.requantized},
      {"tensor_types", totals.types},
      {"bytes_in", totals.bytes_in},
      {"bytes_out", totals.bytes_out},
      {"file_bytes", std::filesystem::file_size(c.out)},
      {"bits_per_weight", bits},
      {"threads", threads},
      {"quantize_s", convert_s},
      {"mb_s", totals.bytes_in / 1e6 / convert_s},
      {"seconds", seconds_since(start)},
  };
  if (c.common.json) {
    print_json(j);
    return;
  }
  std::cout << c.out << ": " << type_name << ", " << tensors.size() << " tensors ("
            << totals.requantized << " re-quantized), " << totals.bytes_out << " bytes of weights, "
            << bits << " bits per weight, " << seconds_since(start) << " s" << std::endl;
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto c = std::make_shared<QuantizeCommand>();
  auto* cmd = app.add_subcommand(
      "quantize",
      "re-quantize a model into a llama.cpp file type (Q4_K_M, Q8_0, IQ4_XS, …), each tensor "
      "taking the type llama-quantize would give it");
  cmd->add_option("--type", c->type, "target: " + quant_mix_names_text() + " (case-insensitive)")
      ->required();
  cmd->add_option("IN", c->in, "GGUF model to read (a model Tokenfab runs)")->required();
  cmd->add_option("OUT", c->out, "GGUF file to write (not IN)")->required();
  add_threads_option(*cmd, c->common);
  add_json_option(*cmd, c->common);
  cmd->footer(
      "Holds the output file in memory until it is written. Progress (tensors done, MB/s of "
      "input) goes to stderr; --json prints {type, file_type, input, output, tensors, "
      "requantized, tensor_types, bytes_in, bytes_out, file_bytes, bits_per_weight, threads, "
      "quantize_s, mb_s, seconds}.");
  cmd->callback([c] { run_quantize(*c); });
}

}  // namespace tokenfab::cli
