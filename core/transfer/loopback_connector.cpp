// The loopback KvConnector: both pools live in this process's host memory (CPU virtual devices),
// so a layer of a transfer is a memcpy per block on the connector's own thread (the queue, states
// and stats are QueuedConnector's).

#include <cstring>
#include <memory>
#include <string>

#include "core/common/error.h"
#include "core/transfer/queued_connector.h"

namespace tokenfab {
namespace {

class LoopbackConnector final : public QueuedConnector {
 public:
  LoopbackConnector() { start(); }
  ~LoopbackConnector() override { stop(); }

  std::string_view backend() const override { return "loopback"; }

 protected:
  void check_store(const KvBlockStore& store) const override {
    if (store.memory() != KvMemory::kHost)
      throw Error("the loopback connector copies host memory only; " +
                  std::string(store.device()) + " holds its KV in CUDA memory");
  }

  // A layer is a set of memcpys, with nothing kept between layers.
  bool interleaves_ready_transfers() const override { return true; }

  std::string copy_layer(const KvTransferSpec& spec, int32_t layer) override {
    const size_t block_bytes = spec.src->block_bytes();
    for (size_t i = 0; i < spec.src_blocks.size(); ++i) {
      const int32_t from = spec.src_blocks[i];
      const int32_t to = spec.dst_blocks[i];
      std::memcpy(spec.dst->k_block(layer, to), spec.src->k_block(layer, from), block_bytes);
      std::memcpy(spec.dst->v_block(layer, to), spec.src->v_block(layer, from), block_bytes);
    }
    return {};
  }
};

}  // namespace

std::unique_ptr<KvConnector> make_loopback_connector() {
  return std::make_unique<LoopbackConnector>();
}

}  // namespace tokenfab
