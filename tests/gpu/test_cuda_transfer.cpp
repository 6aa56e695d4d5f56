// The CUDA KV connectors (core/transfer/cuda_connector.cpp) move every byte of every listed block
// of every layer to the right destination block, and nothing else: cuda_p2p between the two
// partitions of one GPU (and between two GPUs when the machine has them), host_staged and the
// automatic "cuda" backend GPU → GPU, host → GPU and GPU → host; within the one storage of a GPU's
// two partitions (make_cuda_partitions) they hand blocks over and copy only the rest (label gpu;
// skipped without a CUDA device).

#include <QtTest/QtTest>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/device/cuda_model.h"
#include "core/device/device.h"
#include "core/model/llama_model.h"
#include "core/model/synthetic_model.h"
#include "core/runtime/kv_storage.h"
#include "core/transfer/kv_connector.h"
#include "tests/gpu/cuda_test_support.h"

using namespace tokenfab;

namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kBlocks = 40;

// Reads one block of one layer (K then V) from any store, host or GPU.
std::vector<std::byte> read_block(KvBlockStore& s, int32_t layer, int32_t block) {
  std::vector<std::byte> out(2 * s.block_bytes());
  const auto kind = s.memory() == KvMemory::kCuda ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
  TOKENFAB_CUDA_CHECK(cudaMemcpy(out.data(), s.k_block(layer, block), s.block_bytes(), kind));
  TOKENFAB_CUDA_CHECK(
      cudaMemcpy(out.data() + s.block_bytes(), s.v_block(layer, block), s.block_bytes(), kind));
  return out;
}

// Fills every block of every layer with random bytes.
void fill(KvBlockStore& s, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<std::byte> data(s.block_bytes());
  const auto kind = s.memory() == KvMemory::kCuda ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost;
  for (int32_t l = 0; l < s.n_layers(); ++l)
    for (int32_t b = 0; b < s.n_blocks(); ++b)
      for (std::byte* dst : {s.k_block(l, b), s.v_block(l, b)}) {
        for (std::byte& x : data) x = static_cast<std::byte>(byte(rng));
        TOKENFAB_CUDA_CHECK(cudaMemcpy(dst, data.data(), data.size(), kind));
      }
}

}  // namespace

class TestCudaTransfer : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void backends_move_exactly_the_listed_blocks_data();
  void backends_move_exactly_the_listed_blocks();
  void partitions_hand_over_within_one_storage_data();
  void partitions_hand_over_within_one_storage();
  void two_gpus_by_peer_copy();
  void peer_backend_refuses_host_pools();

 private:
  // Sends src_blocks of `src` onto a shuffled choice of `dst`'s blocks through `backend`, then
  // checks every block of `dst`: the chosen ones hold their source's bytes, the rest are as
  // before.
  void check_transfer(const std::string& backend, KvBlockStore& src, KvBlockStore& dst);

  QTemporaryDir dir_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Device> prefill_, decode_;
  std::unique_ptr<KvStorage> host_;
  int gpus_ = 0;
};

void TestCudaTransfer::initTestCase() {
  if (const QString why = kernels::testing::no_cuda_device(); !why.isEmpty())
    QSKIP(qPrintable(why));
  TOKENFAB_CUDA_CHECK(cudaGetDeviceCount(&gpus_));
  QVERIFY(dir_.isValid());
  // A small model: the pools' geometry (3 layers, 2 kv heads of 32) is all the transfers see.
  SyntheticShape shape;
  shape.name = "transfer-test";
  shape.n_vocab = kSyntheticMinVocab + 5;
  shape.n_embd = 128;
  shape.n_ff = 256;
  shape.n_layer = 3;
  shape.n_head = 4;
  shape.n_kv_head = 2;
  shape.n_ctx = 1024;
  const std::filesystem::path path = dir_.filePath("small.gguf").toStdString();
  write_synthetic_llama(path, shape, kernels::WeightType::Q8_0, 3);
  model_ = LlamaModel::load(path);
  prefill_ = make_cuda_device({DeviceKind::kCuda, 0, DevicePartition::kPrefill}, *model_, 1,
                              kBlocks, kBlockSize);
  decode_ = make_cuda_device({DeviceKind::kCuda, 0, DevicePartition::kDecode}, *model_, 1, kBlocks,
                             kBlockSize);
  host_ = std::make_unique<KvStorage>(model_->hparams(), kBlocks, kBlockSize, "cpu:0");
}

void TestCudaTransfer::check_transfer(const std::string& backend, KvBlockStore& src,
                                      KvBlockStore& dst) {
  std::mt19937 rng(
      static_cast<uint32_t>(std::hash<std::string>{}(backend + std::string(src.device()))));
  fill(src, rng);
  fill(dst, rng);
  std::vector<std::vector<std::vector<std::byte>>> before(static_cast<size_t>(dst.n_layers()));
  for (int32_t l = 0; l < dst.n_layers(); ++l)
    for (int32_t b = 0; b < dst.n_blocks(); ++b) before[l].push_back(read_block(dst, l, b));
  KvTransferSpec spec;
  spec.request = 7;
  spec.src = &src;
  spec.dst = &dst;
  std::vector<int32_t> all(static_cast<size_t>(kBlocks));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  spec.src_blocks.assign(all.begin(), all.begin() + 13);
  std::shuffle(all.begin(), all.end(), rng);
  spec.dst_blocks.assign(all.begin(), all.begin() + 13);
  spec.n_tokens = 13 * kBlockSize - 5;
  const auto connector = make_kv_connector(backend);
  const TransferId id = connector->send(spec);
  QCOMPARE(connector->wait(id), TransferState::kDone);
  const KvTransferStats stats = connector->release(id);
  QCOMPARE(stats.layers_done, src.n_layers());
  QCOMPARE(stats.bytes, static_cast<int64_t>(2 * src.block_bytes() * 13 * src.n_layers()));
  for (int32_t l = 0; l < dst.n_layers(); ++l)
    for (int32_t b = 0; b < dst.n_blocks(); ++b) {
      const auto it = std::find(spec.dst_blocks.begin(), spec.dst_blocks.end(), b);
      const std::vector<std::byte> want =
          it == spec.dst_blocks.end()
              ? before[l][b]
              : read_block(src, l,
                           spec.src_blocks[static_cast<size_t>(it - spec.dst_blocks.begin())]);
      QVERIFY2(read_block(dst, l, b) == want,
               qPrintable(QStringLiteral("%1: layer %2, block %3 of %4 differs")
                              .arg(QString::fromStdString(backend))
                              .arg(l)
                              .arg(b)
                              .arg(QString::fromUtf8(dst.device().data(),
                                                     static_cast<int>(dst.device().size())))));
    }
}

void TestCudaTransfer::backends_move_exactly_the_listed_blocks_data() {
  QTest::addColumn<QString>("backend");
  QTest::addColumn<QString>("route");
  for (const char* backend : {"cuda_p2p", "host_staged", "cuda"})
    QTest::addRow("%s gpu partitions", backend) << backend << "gpu-gpu";
  for (const char* backend : {"host_staged", "cuda"}) {
    QTest::addRow("%s host to gpu", backend) << backend << "host-gpu";
    QTest::addRow("%s gpu to host", backend) << backend << "gpu-host";
  }
}

void TestCudaTransfer::backends_move_exactly_the_listed_blocks() {
  QFETCH(QString, backend);
  QFETCH(QString, route);
  KvBlockStore& gpu_src = prefill_->kv_storage();
  KvBlockStore& gpu_dst = decode_->kv_storage();
  if (route == "gpu-gpu") check_transfer(backend.toStdString(), gpu_src, gpu_dst);
  if (route == "host-gpu") check_transfer(backend.toStdString(), *host_, gpu_dst);
  if (route == "gpu-host") check_transfer(backend.toStdString(), gpu_src, *host_);
}

void TestCudaTransfer::partitions_hand_over_within_one_storage_data() {
  QTest::addColumn<QString>("backend");
  for (const char* backend : {"cuda_p2p", "host_staged", "cuda"})
    QTest::addRow("%s", backend) << backend;
}

// The two partitions of one GPU (make_cuda_partitions) share one KV storage: a pair naming the
// same block on both sides is handed over (no byte moves), a pair naming another block is copied
// by the backend as between two storages, and no other block changes.
void TestCudaTransfer::partitions_hand_over_within_one_storage() {
  QFETCH(QString, backend);
  auto [prefill, decode] = make_cuda_partitions({DeviceKind::kCuda, 0, DevicePartition::kPrefill},
                                                {DeviceKind::kCuda, 0, DevicePartition::kDecode},
                                                *model_, 1, 1, kBlocks, kBlockSize);
  KvBlockStore& src = prefill->kv_storage();
  KvBlockStore& dst = decode->kv_storage();
  QVERIFY(same_storage(src, dst));
  QVERIFY(dst.n_blocks() > 31);
  std::mt19937 rng(11);
  fill(src, rng);
  std::vector<std::vector<std::vector<std::byte>>> before(static_cast<size_t>(src.n_layers()));
  for (int32_t l = 0; l < src.n_layers(); ++l)
    for (int32_t b = 0; b < src.n_blocks(); ++b) before[l].push_back(read_block(src, l, b));
  KvTransferSpec spec;
  spec.request = 5;
  spec.src = &src;
  spec.dst = &dst;
  spec.src_blocks = {7, 2, 5, 11};  // 7 and 2 handed over, 5 copied onto 9 and 11 onto 30
  spec.dst_blocks = {7, 2, 9, 30};
  spec.n_tokens = 4 * kBlockSize - 3;
  const auto connector = make_kv_connector(backend.toStdString());
  const TransferId id = connector->send(spec);
  QCOMPARE(connector->wait(id), TransferState::kDone);
  const KvTransferStats stats = connector->release(id);
  QCOMPARE(stats.handed_over, 2);
  QCOMPARE(stats.blocks, 4);
  QCOMPARE(stats.layers_done, src.n_layers());
  QCOMPARE(stats.bytes, static_cast<int64_t>(2 * src.block_bytes() * 2 * src.n_layers()));
  for (int32_t l = 0; l < src.n_layers(); ++l)
    for (int32_t b = 0; b < src.n_blocks(); ++b) {
      const std::vector<std::byte>& want = b == 9    ? before[l][5]
                                           : b == 30 ? before[l][11]
                                                     : before[l][b];
      QVERIFY2(
          read_block(dst, l, b) == want,
          qPrintable(QStringLiteral("%1: layer %2, block %3 differs").arg(backend).arg(l).arg(b)));
    }
}

void TestCudaTransfer::two_gpus_by_peer_copy() {
  if (gpus_ < 2) QSKIP("one GPU here: the two-GPU peer copy needs cuda:0 and cuda:1");
  const auto second = make_cuda_device({DeviceKind::kCuda, 1}, *model_, 1, kBlocks, kBlockSize);
  int can = 0;
  TOKENFAB_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, 1, 0));
  check_transfer(can ? "cuda_p2p" : "host_staged", prefill_->kv_storage(), second->kv_storage());
  check_transfer("cuda", second->kv_storage(), prefill_->kv_storage());
}

void TestCudaTransfer::peer_backend_refuses_host_pools() {
  const auto connector = make_kv_connector("cuda_p2p");
  KvTransferSpec spec;
  spec.src = host_.get();
  spec.dst = &decode_->kv_storage();
  spec.src_blocks = {0};
  spec.dst_blocks = {0};
  try {
    connector->send(spec);
    QFAIL("cuda_p2p accepted a host pool");
  } catch (const Error& e) {
    QVERIFY2(std::string(e.what()).find("use host_staged") != std::string::npos, e.what());
  }
}

QTEST_GUILESS_MAIN(TestCudaTransfer)
#include "test_cuda_transfer.moc"
