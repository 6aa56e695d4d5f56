// KV moved between CPU virtual devices is the KV the destination would have computed itself: a
// prompt prefilled on device P and transferred into D's pool (under other block ids) matches,
// bit for bit, the same prompt prefilled directly on D, and a decode step on D reading either
// gives the same logits. Both devices run the same kernels on one thread each, so the K/V rows
// are the same numbers; any difference means the transfer moved the wrong bytes.

#include <QtTest>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "tests/common/default_model.h"
#include "core/kvcache/kv_manager.h"
#include "core/model/llama_model.h"
#include "core/model/model_files.h"
#include "core/runtime/kv_storage.h"
#include "core/runtime/model_runner.h"
#include "core/tokenizer/tokenizer.h"
#include "core/transfer/kv_connector.h"

using namespace tokenfab;

namespace {

constexpr int32_t kBlocks = 64;
constexpr int32_t kBlockSize = 16;

// One CPU virtual device: its KV pool, the bookkeeping of that pool, and a runner over it.
struct Device {
  Device(const LlamaModel& model, const char* name)
      : storage(model.hparams(), kBlocks, kBlockSize, name),
        kv(kBlocks, kBlockSize),
        pool(1),
        runner(model, pool, storage) {}
  KvStorage storage;
  KvManager kv;
  kernels::ThreadPool pool;
  ModelRunner runner;
};

std::vector<int32_t> block_ids(const KvManager& kv, SequenceId seq) {
  const auto& blocks = kv.table(seq).blocks();
  return {blocks.begin(), blocks.end()};
}

// Logits of the last of `tokens`, placed at positions [pos0, pos0 + size) over `blocks`.
std::vector<float> run_one(Device& d, std::span<const int32_t> tokens, int64_t pos0,
                           const std::vector<int32_t>& blocks) {
  const BatchSequence seq{tokens, pos0, blocks, true};
  std::vector<float> logits;
  d.runner.run({&seq, 1}, logits);
  return logits;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

class TransferModelTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void received_kv_equals_kv_computed_directly();

 private:
  std::unique_ptr<LlamaModel> model_;
  std::optional<Tokenizer> tokenizer_;
};

void TransferModelTest::initTestCase() {
  TOKENFAB_LOAD_DEFAULT_MODEL(model_, tokenizer_);
}

void TransferModelTest::received_kv_equals_kv_computed_directly() {
  const HParams& hp = model_->hparams();
  const std::vector<TokenId> prompt = tokenizer_->encode(
      "Water boils at one hundred degrees Celsius at sea level. At the top of a high mountain, "
      "where the air pressure is lower, it boils at a lower temperature, so pasta takes longer",
      false, false);
  const auto n = static_cast<int32_t>(prompt.size());
  qInfo("prompt: %d tokens", n);
  // Across two block boundaries, the last block partial.
  QVERIFY(n > 2 * kBlockSize && n % kBlockSize != 0 && n < kBlocks * kBlockSize / 4);

  Device p(*model_, "cpu:0");
  Device d(*model_, "cpu:1");

  QVERIFY(p.kv.allocate_sequence(0, prompt).has_value());
  const std::vector<int32_t> p_blocks = block_ids(p.kv, 0);
  const std::vector<float> p_logits = run_one(p, prompt, 0, p_blocks);

  // On D, a sequence ahead of ours takes the first blocks, so the transferred KV lands under
  // other ids than it had on P.
  const std::vector<TokenId> other(24, prompt.front());
  QVERIFY(d.kv.allocate_sequence(100, other).has_value());
  QVERIFY(d.kv.allocate_sequence(0, prompt).has_value());
  const std::vector<int32_t> moved_blocks = block_ids(d.kv, 0);
  // The direct computation needs blocks of its own; allocated for the same prompt they would be
  // prefix-cache hits on the transferred ones, so they are reserved under a stand-in prompt that
  // differs in its first token (the runner is given the real tokens).
  std::vector<TokenId> stand_in = prompt;
  stand_in.front() = prompt.front() + 1;
  QVERIFY(d.kv.allocate_sequence(1, stand_in).has_value());
  const std::vector<int32_t> direct_blocks = block_ids(d.kv, 1);
  QCOMPARE(moved_blocks.size(), p_blocks.size());
  QCOMPARE(direct_blocks.size(), p_blocks.size());
  QVERIFY(moved_blocks != p_blocks);
  const auto ids = [](const std::vector<int32_t>& v) {
    QStringList out;
    for (const int32_t b : v) out << QString::number(b);
    return out.join(',');
  };
  qInfo("blocks on cpu:0 %s → on cpu:1 %s; computed on cpu:1 %s", qPrintable(ids(p_blocks)),
        qPrintable(ids(moved_blocks)), qPrintable(ids(direct_blocks)));
  for (const int32_t b : direct_blocks)
    QVERIFY(std::find(moved_blocks.begin(), moved_blocks.end(), b) == moved_blocks.end());

  const auto connector = make_kv_connector("loopback");
  const TransferId id =
      connector->send({0, &p.storage, &d.storage, p_blocks, moved_blocks, n, nullptr});
  QCOMPARE(QString(transfer_state_name(connector->wait(id))), QString("done"));
  const KvTransferStats st = connector->release(id);
  QCOMPARE(st.bytes,
           static_cast<int64_t>(KvStorage::bytes_per_block(hp, kBlockSize) * p_blocks.size()));
  qInfo("moved %d blocks (%lld bytes) cpu:0 → cpu:1 in %.3f ms", st.blocks,
        static_cast<long long>(st.bytes), st.seconds() * 1e3);

  const std::vector<float> d_logits = run_one(d, prompt, 0, direct_blocks);
  QVERIFY2(bitwise_equal(p_logits, d_logits), "the two devices' prefills differ");

  // Rows [0, n) of every head of every block; the tail of the last block was never written.
  const auto row_bytes = static_cast<size_t>(hp.head_dim) * sizeof(uint16_t);
  int64_t differing_rows = 0;
  for (int64_t layer = 0; layer < hp.n_layer; ++layer) {
    for (size_t i = 0; i < moved_blocks.size(); ++i) {
      const int64_t rows = std::min<int64_t>(kBlockSize, n - static_cast<int64_t>(i) * kBlockSize);
      for (int h = 0; h < hp.n_kv_head; ++h) {
        for (const bool is_k : {true, false}) {
          const uint16_t* tensor = is_k ? d.storage.k(layer) : d.storage.v(layer);
          const uint16_t* moved = tensor + d.storage.offset(moved_blocks[i], h, 0);
          const uint16_t* direct = tensor + d.storage.offset(direct_blocks[i], h, 0);
          for (int64_t r = 0; r < rows; ++r) {
            if (std::memcmp(moved + r * hp.head_dim, direct + r * hp.head_dim, row_bytes) == 0)
              continue;
            if (differing_rows++ == 0)
              qWarning("first difference: layer %lld, block %zu, kv head %d, row %lld (%s)",
                       static_cast<long long>(layer), i, h, static_cast<long long>(r),
                       is_k ? "K" : "V");
          }
        }
      }
    }
  }
  QCOMPARE(differing_rows, int64_t{0});

  // One decode step on D over either copy of the prompt's KV.
  const auto max_at = std::max_element(p_logits.begin(), p_logits.end()) - p_logits.begin();
  const std::vector<int32_t> next = {static_cast<int32_t>(max_at)};
  const std::vector<float> after_moved = run_one(d, next, n, moved_blocks);
  const std::vector<float> after_direct = run_one(d, next, n, direct_blocks);
  QCOMPARE(after_moved.size(), static_cast<size_t>(hp.n_vocab));
  QVERIFY2(bitwise_equal(after_moved, after_direct),
           "a decode step over the transferred KV gives other logits than over the direct KV");
}

QTEST_GUILESS_MAIN(TransferModelTest)
#include "test_transfer_model.moc"
