#pragma once
// What the CUDA op tests share: device buffers, random inputs and mismatch reports.

#include <QtTest/QtTest>

#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_check.cuh"

namespace tokenfab::kernels::testing {

// Why these tests cannot run here (no driver, no device), or an empty string when a CUDA device
// is present.
inline QString no_cuda_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    return QStringLiteral("no CUDA device: cudaGetDeviceCount failed: %1")
        .arg(QString::fromUtf8(cudaGetErrorString(err)));
  if (count == 0) return QStringLiteral("no CUDA device: cudaGetDeviceCount returned 0");
  return {};
}

// Device memory for `count` values of T, freed when the buffer goes out of scope.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    TOKENFAB_CUDA_CHECK(cudaMalloc(&data_, bytes()));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  void upload(const std::vector<T>& host) {
    TOKENFAB_CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    TOKENFAB_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t count_;
};

inline std::vector<float> random_floats(std::mt19937& rng, size_t count, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

// Index of the first element outside |got - want| <= rel·|want|, or -1 when all are within.
inline int64_t first_relative_mismatch(const std::vector<float>& got,
                                       const std::vector<float>& want, float rel) {
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]))) return static_cast<int64_t>(i);
  return -1;
}

// Index of the first element whose bits differ (two NaNs count as equal), or -1.
inline int64_t first_bit_mismatch(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]))
      return static_cast<int64_t>(i);
  }
  return -1;
}

inline QByteArray mismatch_message(const char* what, int64_t index, int64_t n,
                                   const std::vector<float>& got, const std::vector<float>& want) {
  return QStringLiteral("%1: row %2 col %3: gpu %4, cpu %5")
      .arg(what)
      .arg(index / n)
      .arg(index % n)
      .arg(static_cast<double>(got[index]), 0, 'g', 9)
      .arg(static_cast<double>(want[index]), 0, 'g', 9)
      .toUtf8();
}

}  // namespace tokenfab::kernels::testing
