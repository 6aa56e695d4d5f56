#pragma once
// Device memory and errors for the CUDA backend's host code (cuda_model.cpp, cuda_weights.cpp):
// every failure becomes an Error naming the device and what was being done. CUDA builds only.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "core/common/error.h"

namespace tokenfab::cuda_backend {

inline constexpr double kMiB = 1024.0 * 1024.0;

// bytes as whole MiB, rounded up ("12 MiB").
inline std::string mib(uint64_t bytes) {
  return std::to_string(static_cast<int64_t>(std::ceil(static_cast<double>(bytes) / kMiB))) +
         " MiB";
}

// A CUDA runtime failure as an Error naming the device and what was being done.
inline void check(cudaError_t err, const std::string& device, const char* what) {
  if (err == cudaSuccess) return;
  throw Error(device + ": " + what + " failed: " + cudaGetErrorName(err) + ": " +
              cudaGetErrorString(err));
}

// Runs a kernel launcher, turning its std::exception into an Error that names the device.
template <typename F>
void launch(const std::string& device, const char* op, F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(device + ": " + op + ": " + e.what());
  }
}

// Device memory for `count` values of T on the current device. Grows only (contents are lost
// when it grows); freed on destruction.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  ~DeviceArray() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      if (data_ != nullptr) cudaFree(data_);
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }

  // At least `count` values; `device` and `what` name them in an out-of-memory error.
  // Returns true when it allocated (the old pointer is gone).
  bool reserve(size_t count, const std::string& device, const char* what) {
    if (count <= count_) return false;
    if (data_ != nullptr) cudaFree(data_);  // waits for the work that may still read it
    data_ = nullptr;
    count_ = 0;
    const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T));
    if (err != cudaSuccess) {
      size_t free_bytes = 0, total_bytes = 0;
      cudaGetLastError();  // clear the sticky-free error state of a failed allocation
      cudaMemGetInfo(&free_bytes, &total_bytes);
      throw Error(device + ": cannot allocate " + mib(count * sizeof(T)) + " of GPU memory for " +
                  what + " (" + mib(free_bytes) + " free of " + mib(total_bytes) +
                  "): " + cudaGetErrorString(err));
    }
    count_ = count;
    return true;
  }
  T* get() const { return data_; }
  size_t size() const { return count_; }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace tokenfab::cuda_backend
