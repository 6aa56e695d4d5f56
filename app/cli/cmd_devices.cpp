// devices: what this machine can compute on — the CPU (cores, SIMD, memory) and the NVIDIA GPUs
// (memory, SMs, compute capability, bandwidth, peer access), or why there are none.

#include <unistd.h>

#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "cli_common.h"
#include "core/device/cuda_device.h"
#include "kernels/cpu/cpu_features.h"

namespace tokenfab::cli {

namespace {

// A "key: value" line of /proc/cpuinfo or /proc/meminfo; empty when absent (not Linux, say).
std::string proc_field(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : line.substr(start);
  }
  return {};
}

// /proc/meminfo's "<key>: N kB" in bytes, or `fallback` when it cannot be read.
uint64_t meminfo_bytes(const std::string& key, uint64_t fallback) {
  const std::string value = proc_field("/proc/meminfo", key + ":");
  if (value.empty()) return fallback;
  return std::stoull(value) * 1024;
}

nlohmann::json describe_cpu() {
  const kernels::CpuFeatures& f = kernels::detected_cpu_features();
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  const uint64_t total = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * page;
  const uint64_t available = static_cast<uint64_t>(sysconf(_SC_AVPHYS_PAGES)) * page;
  return {
      {"device", "cpu"},
      {"name", proc_field("/proc/cpuinfo", "model name")},
      {"logical_cores", std::thread::hardware_concurrency()},
      {"simd", {{"avx2", f.avx2}, {"avx512", f.avx512}, {"avx512_vnni", f.avx512_vnni}}},
      {"kernels", kernels::kernel_isa_name()},  // what the matmul kernels dispatch to
      {"memory_total_bytes", meminfo_bytes("MemTotal", total)},
      {"memory_available_bytes", meminfo_bytes("MemAvailable", available)},
  };
}

nlohmann::json describe_gpu(const CudaDeviceInfo& d) {
  return {
      {"device", "cuda:" + std::to_string(d.index)},
      {"name", d.name},
      {"memory_total_bytes", d.total_bytes},
      {"memory_free_bytes", d.free_bytes},
      {"sm_count", d.sm_count},
      {"compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)},
      {"memory_clock_khz", d.memory_clock_khz},
      {"bus_width_bits", d.bus_width_bits},
      {"bandwidth_gbs", d.bandwidth_gbs},
  };
}

nlohmann::json describe_devices() {
  const CudaInventory inv = enumerate_cuda_devices();
  nlohmann::json gpus = nlohmann::json::array();
  for (const CudaDeviceInfo& d : inv.devices) gpus.push_back(describe_gpu(d));
  nlohmann::json peers = nlohmann::json::array();
  for (const std::vector<bool>& row : inv.peer_access) peers.push_back(row);
  return {
      {"cpu", describe_cpu()},
      {"gpus", gpus},
      {"peer_access", peers},
      {"cuda",
       {{"built", inv.built},
        {"reason", inv.reason.empty() ? nlohmann::json() : nlohmann::json(inv.reason)},
        {"driver_version", inv.driver_version},
        {"runtime_version", inv.runtime_version}}},
  };
}

std::string gib(uint64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1024.0 * 1024 * 1024)
    << " GiB";
  return s.str();
}

void print_text(const nlohmann::json& j) {
  const nlohmann::json& cpu = j["cpu"];
  std::cout << "cpu: " << cpu["name"].get<std::string>() << ", " << cpu["logical_cores"]
            << " logical cores, kernels " << cpu["kernels"].get<std::string>() << " (avx2 "
            << cpu["simd"]["avx2"] << ", avx512 " << cpu["simd"]["avx512"] << ", avx512_vnni "
            << cpu["simd"]["avx512_vnni"] << "), memory "
            << gib(cpu["memory_available_bytes"].get<uint64_t>()) << " available of "
            << gib(cpu["memory_total_bytes"].get<uint64_t>()) << "\n";
  for (const nlohmann::json& g : j["gpus"])
    std::cout << g["device"].get<std::string>() << ": " << g["name"].get<std::string>() << ", "
              << gib(g["memory_free_bytes"].get<uint64_t>()) << " free of "
              << gib(g["memory_total_bytes"].get<uint64_t>()) << ", " << g["sm_count"]
              << " SMs, compute capability " << g["compute_capability"].get<std::string>() << ", "
              << std::fixed << std::setprecision(0) << g["bandwidth_gbs"].get<double>()
              << " GB/s peak memory bandwidth\n";
  if (j["gpus"].size() > 1) {
    std::cout << "peer access (row reads column):\n";
    for (const nlohmann::json& row : j["peer_access"]) {
      for (const nlohmann::json& can : row) std::cout << (can.get<bool>() ? " yes" : "  no");
      std::cout << "\n";
    }
  }
  if (j["gpus"].empty()) std::cout << "no GPU: " << j["cuda"]["reason"].get<std::string>() << "\n";
}

}  // namespace

void register_devices(CLI::App& app) {
  auto* cmd = app.add_subcommand("devices", "list the CPU and the NVIDIA GPUs this machine has");
  auto o = std::make_shared<CommonOptions>();
  add_json_option(*cmd, *o);
  cmd->callback([o] {
    const nlohmann::json j = describe_devices();
    if (o->json) {
      print_json(j);
    } else {
      print_text(j);
    }
  });
}

}  // namespace tokenfab::cli
