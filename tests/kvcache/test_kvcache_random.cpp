// Randomized operation sequences against KvManager, checked after every step: the invariants
// (check_invariants), a shadow copy of every sequence's tokens, and a stand-in for the K/V
// tensors — one token id per block slot — through which every sequence must read back exactly
// its own tokens. That last check catches a wrong prefix hit, a missing copy-on-write or a write
// into a shared block. At the end everything is freed and evicted: every block must be free.

#include <QtTest>
#include <map>
#include <random>
#include <vector>

#include "core/kvcache/kv_manager.h"
#include "test_kvcache.h"

using namespace tokenfab;

namespace {

constexpr TokenId kUnwritten = -1;

class RandomRun {
 public:
  RandomRun(uint32_t seed, int32_t n_blocks, int32_t block_size)
      : draws_(seed),
        kv_(n_blocks, block_size),
        slots_(static_cast<size_t>(n_blocks) * static_cast<size_t>(block_size), kUnwritten) {
    // A few shared "system prompts" so that prefixes repeat and the cache gets hits.
    for (int32_t i = 0; i < 4; ++i) prefixes_.push_back(random_tokens(pick(0, 3 * block_size)));
  }

  // Runs one random operation; returns a description of the first problem found, or "".
  std::string step() {
    const int32_t op = pick(0, 99);
    if (op < 25 || shadow_.empty()) {
      allocate();
    } else if (op < 65) {
      append();
    } else if (op < 72) {
      fork();
    } else if (op < 82) {
      truncate();
    } else if (op < 95) {
      free_one(random_sequence());
    } else {
      kv_.evict(pick(0, 4));
    }
    if (std::string e = kv_.check_invariants(); !e.empty()) return e;
    return check_contents();
  }

  // Frees every sequence and evicts the cache; returns a problem or "".
  std::string finish() {
    while (!shadow_.empty()) free_one(shadow_.begin()->first);
    const KvSnapshot before = kv_.snapshot();
    if (before.n_owned != 0) return "blocks still owned after every sequence was freed";
    if (before.n_free + before.n_cached != before.n_blocks) return "free + cached != total";
    kv_.evict_all();
    if (kv_.pool().n_free() != kv_.pool().n_blocks()) return "blocks not free after evict_all";
    return kv_.check_invariants();
  }

  int64_t hit_tokens() const { return kv_.prefix_cache().stats().hit_tokens; }
  int64_t copies() const { return copies_; }
  int64_t out_of_blocks() const { return out_of_blocks_; }

 private:
  int32_t pick(int32_t lo, int32_t hi) { return draws_.pick(lo, hi); }
  std::vector<TokenId> random_tokens(int32_t n) { return draws_.tokens(n); }

  SequenceId random_sequence() {
    auto it = shadow_.begin();
    std::advance(it, pick(0, static_cast<int32_t>(shadow_.size()) - 1));
    return it->first;
  }

  // Writes tokens [from, end) of `seq` into the slots its table maps them to. A block written
  // here must be held by `seq` alone.
  void write(SequenceId seq, int32_t from) {
    const BlockTable& table = kv_.table(seq);
    const int32_t bs = table.block_size();
    for (int32_t i = from; i < table.n_tokens(); ++i) {
      const BlockId id = table.blocks()[static_cast<size_t>(i / bs)];
      if (kv_.pool().record(id).ref_count != 1) shared_write_ = true;
      slots_[static_cast<size_t>(id) * bs + i % bs] = table.tokens()[static_cast<size_t>(i)];
    }
  }

  void allocate() {
    if (shadow_.size() >= 12) return;
    std::vector<TokenId> prompt = prefixes_[static_cast<size_t>(pick(0, 3))];
    const std::vector<TokenId> tail = random_tokens(pick(0, 20));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const SequenceId seq = next_id_++;
    const std::optional<int32_t> cached = kv_.allocate_sequence(seq, prompt);
    if (!cached) {
      ++out_of_blocks_;
      return;
    }
    write(seq, *cached);
    shadow_[seq] = prompt;
  }

  void append() {
    const SequenceId seq = random_sequence();
    const std::vector<TokenId> tokens = random_tokens(pick(1, 6));
    const int32_t before = kv_.table(seq).n_tokens();
    const AppendResult r = kv_.append(seq, tokens);
    if (!r.ok()) {
      ++out_of_blocks_;
      free_one(seq);  // what the scheduler does: preempt
      return;
    }
    if (r.copy) {
      ++copies_;
      const int32_t bs = kv_.block_size();
      for (int32_t s = 0; s < r.copy->n_tokens; ++s) {
        slots_[static_cast<size_t>(r.copy->dst) * bs + s] =
            slots_[static_cast<size_t>(r.copy->src) * bs + s];
      }
    }
    write(seq, before);
    shadow_[seq].insert(shadow_[seq].end(), tokens.begin(), tokens.end());
  }

  void fork() {
    if (shadow_.size() >= 12) return;
    const SequenceId parent = random_sequence();
    const SequenceId child = next_id_++;
    kv_.fork(parent, child);
    shadow_[child] = shadow_[parent];
  }

  void truncate() {
    const SequenceId seq = random_sequence();
    const int32_t n = pick(0, static_cast<int32_t>(shadow_[seq].size()));
    kv_.truncate(seq, n);
    shadow_[seq].resize(static_cast<size_t>(n));
  }

  void free_one(SequenceId seq) {
    kv_.free_sequence(seq);
    shadow_.erase(seq);
  }

  std::string check_contents() const {
    if (shared_write_) return "a token was written into a block held by several sequences";
    const int32_t bs = kv_.block_size();
    for (const auto& [seq, tokens] : shadow_) {
      const BlockTable& table = kv_.table(seq);
      if (table.tokens() != tokens) return "sequence " + std::to_string(seq) + ": tokens differ";
      for (size_t i = 0; i < tokens.size(); ++i) {
        const BlockId id = table.blocks()[i / static_cast<size_t>(bs)];
        if (slots_[static_cast<size_t>(id) * bs + i % bs] != tokens[i]) {
          return "sequence " + std::to_string(seq) + ": KV slot of token " + std::to_string(i) +
                 " holds another token";
        }
      }
    }
    return {};
  }

  RandomDraws draws_;
  KvManager kv_;
  std::vector<TokenId> slots_;  // (n_blocks, block_size): the token whose KV each slot holds
  std::vector<std::vector<TokenId>> prefixes_;
  std::map<SequenceId, std::vector<TokenId>> shadow_;
  SequenceId next_id_ = 1;
  bool shared_write_ = false;
  int64_t copies_ = 0;
  int64_t out_of_blocks_ = 0;
};

}  // namespace

void TestKvCache::random_operations_keep_invariants_data() {
  QTest::addColumn<uint32_t>("seed");
  QTest::addColumn<int32_t>("n_blocks");
  QTest::addColumn<int32_t>("block_size");
  QTest::addColumn<int32_t>("steps");
  QTest::newRow("seed 1, 48 × 4") << 1u << 48 << 4 << 6000;
  QTest::newRow("seed 2, 48 × 4") << 2u << 48 << 4 << 6000;
  QTest::newRow("seed 3, 24 × 16") << 3u << 24 << 16 << 5000;
  QTest::newRow("seed 4, 40 × 3") << 4u << 40 << 3 << 3000;
}

void TestKvCache::random_operations_keep_invariants() {
  QFETCH(uint32_t, seed);
  QFETCH(int32_t, n_blocks);
  QFETCH(int32_t, block_size);
  QFETCH(int32_t, steps);
  RandomRun run(seed, n_blocks, block_size);
  for (int32_t i = 0; i < steps; ++i) {
    const std::string problem = run.step();
    if (!problem.empty()) QFAIL(qPrintable(QString("step %1: %2").arg(i).arg(problem.c_str())));
  }
  const std::string problem = run.finish();
  QVERIFY2(problem.empty(), problem.c_str());
  // The run must have exercised what it checks.
  QVERIFY(run.hit_tokens() > 0);
  QVERIFY(run.copies() > 0);
  QVERIFY(run.out_of_blocks() > 0);
  qInfo("%lld prefix-hit tokens, %lld copies-on-write, %lld out-of-blocks",
        static_cast<long long>(run.hit_tokens()), static_cast<long long>(run.copies()),
        static_cast<long long>(run.out_of_blocks()));
}

QTEST_MAIN(TestKvCache)
