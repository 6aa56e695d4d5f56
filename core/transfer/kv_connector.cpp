#include "core/transfer/kv_connector.h"

#include <string>

#include "core/common/error.h"

namespace tokenfab {

const char* transfer_state_name(TransferState state) {
  switch (state) {
    case TransferState::kPending:
      return "pending";
    case TransferState::kTransferring:
      return "transferring";
    case TransferState::kDone:
      return "done";
    case TransferState::kFailed:
      return "failed";
  }
  return "unknown";
}

double KvTransferStats::seconds() const {
  if (started == MetricsTime{}) return 0.0;
  // A transfer that has started but not ended is measured up to now, so a poller sees its rate.
  const MetricsTime end = ended == MetricsTime{} ? MetricsClock::now() : ended;
  return seconds_between(started, end);
}

std::optional<double> KvTransferStats::gb_per_s() const {
  const double s = copy_seconds();
  if (s <= 0.0 || bytes == 0) return std::nullopt;
  return static_cast<double>(bytes) / s / 1e9;
}

std::unique_ptr<KvConnector> make_kv_connector(std::string_view backend) {
  if (backend == "loopback") return make_loopback_connector();
  if (backend == "cuda_p2p" || backend == "host_staged" || backend == "cuda")
    return make_cuda_connector(backend);
  throw Error("unknown KV connector backend \"" + std::string(backend) +
              "\" (loopback; with the CUDA backend also cuda, cuda_p2p and host_staged)");
}

}  // namespace tokenfab
