// A partition's stream (cuda_partition.h): a stream in a green context of the partition's SMs, or
// a plain priority stream in the primary context.
//
// Green contexts come from the driver API. Its entry points are taken from the driver that the
// (statically linked) runtime has loaded, through cudaGetDriverEntryPointByVersion, so nothing
// links libcuda; the CUDA 13.0 runtime has no green-context API of its own.
//
// Why the rest of the device is unchanged on a green-context stream (cuda.h, CUDA 13.0):
// - cuGreenCtxCreate retains the device's primary context, and cuCtxFromGreenCtx describes a
//   green context as "a normal primary context but with the resources of the green context":
//   one address space, so memory cudaMalloc'd in the primary context is the green context's too.
// - cuStreamGetCtx_v2 reports a green-context stream's context as the device's primary context
//   (with the green context beside it), and cuGreenCtxStreamCreate ignores the calling thread's
//   current context: the primary context stays current for the runtime (cudaMalloc, cuBLASLt's
//   handle, module loading) and the green context is never made current, while launches,
//   copies and graph launches into the stream run on the green context's SMs.
// - cuCtxSynchronize on the primary context (cudaDeviceSynchronize) waits for its green
//   contexts' work too.
// - cuGreenCtxDestroy does not destroy the context's streams, and they cannot be destroyed after
//   it: the stream goes first.
// The driver does not promise that disjoint SM groups run concurrently (hardware queues, see
// CUDA_DEVICE_MAX_CONNECTIONS), and under MPS, or on 9.x with a dynamic-parallelism module
// loaded, a green context's kernels may use more SMs than it holds (never fewer).

#include "core/device/cuda_partition.h"

#include <algorithm>
#include <utility>

#include "core/common/error.h"

#if TOKENFAB_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <type_traits>

#include "core/device/cuda_memory.h"
#endif

namespace tokenfab {

SmSplit plan_sm_split(int total_sms, int decode_sms, int min_partition, int alignment) {
  SmSplit s;
  if (decode_sms <= 0) {
    s.why_not = "no SM split requested";
    return s;
  }
  if (decode_sms >= total_sms) {
    s.why_not = std::to_string(decode_sms) + " decode SMs leave none for prefill on a GPU of " +
                std::to_string(total_sms);
    return s;
  }
  min_partition = std::max(min_partition, 1);
  alignment = std::max(alignment, 1);
  const int wanted = std::max(decode_sms, min_partition);
  const int decode = (wanted + alignment - 1) / alignment * alignment;
  if (total_sms - decode < min_partition) {
    s.why_not = std::to_string(decode_sms) + " decode SMs round up to " + std::to_string(decode) +
                " (at least " + std::to_string(min_partition) + ", multiples of " +
                std::to_string(alignment) + "), leaving " + std::to_string(total_sms - decode) +
                " of " + std::to_string(total_sms) + " for prefill, under the minimum of " +
                std::to_string(min_partition);
    return s;
  }
  s.decode = decode;
  s.prefill = total_sms - decode;
  return s;
}

PartitionStream::~PartitionStream() {
  release();
}

PartitionStream::PartitionStream(PartitionStream&& o) noexcept
    : stream_(std::exchange(o.stream_, nullptr)),
      green_(std::exchange(o.green_, nullptr)),
      sms_(o.sms_),
      note_(std::move(o.note_)) {}

PartitionStream& PartitionStream::operator=(PartitionStream&& o) noexcept {
  if (this != &o) {
    release();
    stream_ = std::exchange(o.stream_, nullptr);
    green_ = std::exchange(o.green_, nullptr);
    sms_ = o.sms_;
    note_ = std::move(o.note_);
  }
  return *this;
}

#if !TOKENFAB_HAVE_CUDA

// Nothing is ever created without CUDA.
void PartitionStream::release() noexcept {}

PartitionStream make_partition_stream(const PartitionStreamRequest& request, int) {
  throw Error(request.name + ": this build has no CUDA backend (it is built where nvcc is found)");
}

#else

static_assert(std::is_same_v<cudaStream_t, CUstream_st*> && std::is_same_v<CUstream, CUstream_st*>);
static_assert(std::is_same_v<CUgreenCtx, CUgreenCtx_st*>);

namespace {

// The driver entry points used here, each asked for at the CUDA version of its cudaTypedefs.h
// prototype so that the driver hands out the ABI the prototype describes.
struct DriverApi {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetDevResource_v12040 device_get_dev_resource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 sm_resource_split_by_count = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 dev_resource_generate_desc = nullptr;
  PFN_cuGreenCtxCreate_v12040 green_ctx_create = nullptr;
  PFN_cuGreenCtxDestroy_v12040 green_ctx_destroy = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 green_ctx_stream_create = nullptr;
  PFN_cuStreamDestroy_v4000 stream_destroy = nullptr;
  std::string missing;  // why an entry point could not be had; empty when all are there
};

std::string cuda_version_text(unsigned version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

template <typename Fn>
void resolve(const char* symbol, unsigned version, Fn& fn, std::string& missing) {
  if (!missing.empty()) return;
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &status);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not left for the device's first launch check to find
    missing = std::string("cudaGetDriverEntryPointByVersion(") + symbol + ", CUDA " +
              cuda_version_text(version) + ") failed: " + cudaGetErrorName(err) + ": " +
              cudaGetErrorString(err);
  } else if (p == nullptr || status != cudaDriverEntryPointSuccess) {
    missing = std::string("the driver has no ") + symbol + " of CUDA " + cuda_version_text(version);
  } else {
    fn = reinterpret_cast<Fn>(p);
  }
}

DriverApi load_driver_api() {
  DriverApi api;
  resolve("cuGetErrorName", 6000, api.get_error_name, api.missing);
  resolve("cuGetErrorString", 6000, api.get_error_string, api.missing);
  resolve("cuDeviceGet", 2000, api.device_get, api.missing);
  resolve("cuDeviceGetDevResource", 12040, api.device_get_dev_resource, api.missing);
  resolve("cuDevSmResourceSplitByCount", 12040, api.sm_resource_split_by_count, api.missing);
  resolve("cuDevResourceGenerateDesc", 12040, api.dev_resource_generate_desc, api.missing);
  resolve("cuGreenCtxCreate", 12040, api.green_ctx_create, api.missing);
  resolve("cuGreenCtxDestroy", 12040, api.green_ctx_destroy, api.missing);
  resolve("cuGreenCtxStreamCreate", 12050, api.green_ctx_stream_create, api.missing);
  resolve("cuStreamDestroy", 4000, api.stream_destroy, api.missing);
  return api;
}

const DriverApi& driver_api() {
  static const DriverApi api = load_driver_api();
  return api;
}

std::string driver_failure(const DriverApi& api, const char* call, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  api.get_error_name(r, &name);
  api.get_error_string(r, &text);
  return std::string(call) +
         " failed: " + (name != nullptr ? std::string(name) : "CUresult " + std::to_string(r)) +
         (text != nullptr ? std::string(": ") + text : std::string());
}

// The decode group and the remainder of one cuDevSmResourceSplitByCount call, which the driver
// makes disjoint. Two calls with equal arguments are not documented to pick the same SMs, so the
// partition created second takes the split of the first rather than making its own.
struct SmGroups {
  CUdevResource decode{};
  CUdevResource prefill{};
};

// The split of device `ordinal`'s SMs `all` with a decode group of at least `decode_sms`; returns
// the failure, empty on success.
std::string split_sms(const DriverApi& api, int ordinal, const CUdevResource& all,
                      unsigned decode_sms, SmGroups& groups) {
  static std::mutex mutex;
  static std::map<std::pair<int, unsigned>, SmGroups> splits;
  const std::lock_guard lock(mutex);
  if (auto it = splits.find({ordinal, decode_sms}); it != splits.end()) {
    groups = it->second;
    return {};
  }
  SmGroups g;
  unsigned n_groups = 1;
  if (CUresult r =
          api.sm_resource_split_by_count(&g.decode, &n_groups, &all, &g.prefill, 0, decode_sms);
      r != CUDA_SUCCESS)
    return driver_failure(api, "cuDevSmResourceSplitByCount", r);
  if (n_groups != 1 || g.decode.sm.smCount == 0 || g.prefill.sm.smCount == 0)
    return "cuDevSmResourceSplitByCount gave " + std::to_string(n_groups) + " group(s) of " +
           std::to_string(g.decode.sm.smCount) + " SMs and " +
           std::to_string(g.prefill.sm.smCount) + " left over for at least " +
           std::to_string(decode_sms) + " decode SMs";
  splits.emplace(std::pair{ordinal, decode_sms}, g);
  groups = g;
  return {};
}

// A green context of the partition's SMs and a stream in it; on failure ctx is null and
// why_not says why.
struct GreenStream {
  CUgreenCtx ctx = nullptr;
  CUstream stream = nullptr;
  int sms = 0;
  std::string detail;   // "72 of 132 SMs (green context; …)"
  std::string why_not;  // "green contexts unavailable: …" or "no SM split: …"
};

// How the partition's SM count came to be, for the note.
std::string green_detail(DevicePartition partition, const SmSplit& plan, int asked,
                         const CUdevResource& all, const SmGroups& groups) {
  const int decode = static_cast<int>(groups.decode.sm.smCount);
  const int mine =
      partition == DevicePartition::kDecode ? decode : static_cast<int>(groups.prefill.sm.smCount);
  std::string why;
  if (partition == DevicePartition::kPrefill)
    why = "; the SMs the decode partition's " + std::to_string(decode) + " leave";
  else if (decode != asked)
    why = "; " + std::to_string(asked) +
          " asked for, rounded up to the driver's granularity: at least " +
          std::to_string(all.sm.minSmPartitionSize) + ", multiples of " +
          std::to_string(all.sm.smCoscheduledAlignment) +
          (decode != plan.decode
               ? ", " + std::to_string(plan.decode) + " planned and the driver's split gave " +
                     std::to_string(decode)
               : std::string());
  return std::to_string(mine) + " of " + std::to_string(all.sm.smCount) + " SMs (green context" +
         why + ")";
}

GreenStream make_green_stream(const PartitionStreamRequest& request, int total_sms, int priority) {
  GreenStream out;
  // The cases that need no driver query: nothing asked for, or more than the GPU has.
  if (SmSplit coarse = plan_sm_split(total_sms, request.decode_sms, 1, 1); !coarse.split()) {
    out.why_not = coarse.why_not;
    return out;
  }
  auto fail = [&](std::string why) {
    out.why_not = "green contexts unavailable: " + std::move(why);
    return out;
  };
  const DriverApi& api = driver_api();
  if (!api.missing.empty()) return fail(api.missing);
  CUdevice dev = 0;
  if (CUresult r = api.device_get(&dev, request.device); r != CUDA_SUCCESS)
    return fail(driver_failure(api, "cuDeviceGet", r));
  CUdevResource all{};
  if (CUresult r = api.device_get_dev_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
      r != CUDA_SUCCESS)
    return fail(driver_failure(api, "cuDeviceGetDevResource", r));
  const SmSplit plan = plan_sm_split(static_cast<int>(all.sm.smCount), request.decode_sms,
                                     static_cast<int>(all.sm.minSmPartitionSize),
                                     static_cast<int>(all.sm.smCoscheduledAlignment));
  if (!plan.split()) {
    out.why_not = "no SM split: " + plan.why_not;
    return out;
  }
  SmGroups groups;
  if (std::string why =
          split_sms(api, request.device, all, static_cast<unsigned>(plan.decode), groups);
      !why.empty())
    return fail(std::move(why));
  CUdevResource mine =
      request.partition == DevicePartition::kDecode ? groups.decode : groups.prefill;
  CUdevResourceDesc desc = nullptr;
  if (CUresult r = api.dev_resource_generate_desc(&desc, &mine, 1); r != CUDA_SUCCESS)
    return fail(driver_failure(api, "cuDevResourceGenerateDesc", r));
  CUgreenCtx ctx = nullptr;
  if (CUresult r = api.green_ctx_create(&ctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
      r != CUDA_SUCCESS)
    return fail(driver_failure(api, "cuGreenCtxCreate", r));
  CUstream stream = nullptr;
  if (CUresult r = api.green_ctx_stream_create(&stream, ctx, CU_STREAM_NON_BLOCKING, priority);
      r != CUDA_SUCCESS) {
    api.green_ctx_destroy(ctx);
    return fail(driver_failure(api, "cuGreenCtxStreamCreate", r));
  }
  out.ctx = ctx;
  out.stream = stream;
  out.sms = static_cast<int>(mine.sm.smCount);
  out.detail = green_detail(request.partition, plan, request.decode_sms, all, groups);
  return out;
}

}  // namespace

void PartitionStream::release() noexcept {
  // Whatever was enqueued finishes first (a device whose constructor failed half way has not
  // synchronised it).
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (green_ != nullptr) {
    const DriverApi& api = driver_api();  // complete: green_ was made through it
    if (stream_ != nullptr) api.stream_destroy(stream_);
    api.green_ctx_destroy(green_);
  } else if (stream_ != nullptr) {
    cudaStreamDestroy(stream_);
  }
  stream_ = nullptr;
  green_ = nullptr;
}

PartitionStream make_partition_stream(const PartitionStreamRequest& request, int priority) {
  using cuda_backend::check;
  // Current device, primary context initialised (cudaSetDevice does since CUDA 12): green
  // contexts are made on top of it.
  check(cudaSetDevice(request.device), request.name, "selecting the device");
  int total_sms = 0;
  check(cudaDeviceGetAttribute(&total_sms, cudaDevAttrMultiProcessorCount, request.device),
        request.name, "reading the SM count");
  const char* label = request.partition == DevicePartition::kDecode    ? "decode partition: "
                      : request.partition == DevicePartition::kPrefill ? "prefill partition: "
                                                                       : "";
  const std::string priority_text = ", stream priority " + std::to_string(priority);
  PartitionStream out;
  if (request.partition == DevicePartition::kWhole) {
    check(cudaStreamCreateWithPriority(&out.stream_, cudaStreamNonBlocking, priority), request.name,
          "creating a stream");
    out.sms_ = total_sms;
    out.note_ = "all " + std::to_string(total_sms) + " SMs" + priority_text;
    return out;
  }
  GreenStream green = make_green_stream(request, total_sms, priority);
  if (green.ctx != nullptr) {
    out.green_ = green.ctx;
    out.stream_ = green.stream;
    out.sms_ = green.sms;
    out.note_ = label + green.detail + priority_text;
    return out;
  }
  check(cudaStreamCreateWithPriority(&out.stream_, cudaStreamNonBlocking, priority), request.name,
        "creating a stream");
  out.sms_ = total_sms;
  out.note_ = label + std::string("all ") + std::to_string(total_sms) +
              " SMs, shared with the other partition" + priority_text + " (" + green.why_not +
              "; priority streams only)";
  return out;
}

#endif

}  // namespace tokenfab
