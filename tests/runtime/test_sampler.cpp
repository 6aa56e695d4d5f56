// Sampler: greedy, reproducibility, each filter's property, empirical frequencies against the
// exact (renormalised) softmax, parameter validation, no allocation after the first call, and
// candidate rows (what a GPU sends back) drawing exactly the tokens their whole rows draw.

#include <QtTest/QtTest>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "core/common/error.h"
#include "core/runtime/sampler.h"

// Counts global allocations so a test can assert that a stretch of code made none. Replacing
// operator new is program-wide; the counter is only read around the code under test.
namespace {
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace {

using tokenfab::Sampler;
using tokenfab::SamplingParams;

constexpr int kSmallVocab = 8;
constexpr int kDraws = 20000;
constexpr int kBigVocab = 49152;  // SmolLM2's vocabulary

// Upper 0.1% points of the chi-square distribution, by degrees of freedom (standard tables).
// With a fixed seed each test is deterministic; the bound says the frequencies are what a fair
// draw from the expected distribution would give in all but 1 run in 1000.
double chi_square_critical_p001(int dof) {
  static const double kTable[] = {0, 10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322};
  return kTable[dof];
}

SamplingParams unfiltered(float temperature, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

// Exact softmax of logits / temperature, in double.
std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp((logits[i] - max_logit) / temperature);
    total += p[i];
  }
  for (double& x : p) x /= total;
  return p;
}

// Logits whose softmax (temperature 1) is exactly the given probabilities.
std::vector<float> logits_of(const std::vector<double>& probabilities) {
  std::vector<float> logits;
  for (double p : probabilities) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::vector<float> random_logits(int n, uint64_t seed, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(rng);
  return logits;
}

std::vector<int> histogram(Sampler& sampler, const std::vector<float>& logits, int draws) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[sampler.sample(logits)];
  return counts;
}

// Pearson chi-square of counts against expected probabilities. Tokens with expected probability
// 0 must have count 0 (checked by the caller) and add no degree of freedom.
double chi_square(const std::vector<int>& counts, const std::vector<double>& expected, int draws,
                  int* dof) {
  double stat = 0.0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0.0) continue;
    const double e = expected[i] * draws;
    stat += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  *dof = cells - 1;
  return stat;
}

// Renormalises probabilities over the kept tokens (others become 0).
std::vector<double> restricted(const std::vector<double>& p, const std::vector<bool>& keep) {
  std::vector<double> r(p.size(), 0.0);
  double total = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (keep[i]) total += p[i];
  }
  for (size_t i = 0; i < p.size(); ++i) {
    if (keep[i]) r[i] = p[i] / total;
  }
  return r;
}

void verify_frequencies(const std::vector<int>& counts, const std::vector<double>& expected,
                        int draws) {
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0.0) QCOMPARE(counts[i], 0);
  }
  int dof = 0;
  const double stat = chi_square(counts, expected, draws, &dof);
  QVERIFY2(stat < chi_square_critical_p001(dof),
           qPrintable(QStringLiteral("chi-square %1 with %2 dof over %3 draws (bound %4)")
                          .arg(stat)
                          .arg(dof)
                          .arg(draws)
                          .arg(chi_square_critical_p001(dof))));
}

QString error_message(const SamplingParams& params) {
  try {
    params.validate();
  } catch (const tokenfab::Error& e) {
    return QString::fromStdString(e.what());
  }
  return {};
}

}  // namespace

class TestSampler : public QObject {
  Q_OBJECT

 private slots:
  void greedy_picks_argmax() {
    SamplingParams p;
    p.temperature = 0.0f;
    Sampler sampler(p);
    const std::vector<float> logits = random_logits(kBigVocab, 7, 3.0f);
    const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
    for (int i = 0; i < 5; ++i) QCOMPARE(sampler.sample(logits), static_cast<int32_t>(argmax));
  }

  void greedy_breaks_ties_by_lowest_index() {
    SamplingParams p;
    p.temperature = 0.0f;
    Sampler sampler(p);
    const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 2.0f};
    QCOMPARE(sampler.sample(logits), 1);
  }

  void same_seed_is_reproducible() {
    const std::vector<float> logits = random_logits(kBigVocab, 11, 2.0f);
    SamplingParams p;  // defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05
    p.seed = 1234;
    Sampler a(p);
    Sampler b(p);
    for (int i = 0; i < 500; ++i) QCOMPARE(a.sample(logits), b.sample(logits));
  }

  void different_seeds_differ() {
    const std::vector<float> logits(100, 0.0f);  // uniform: each draw matches with p = 1/100
    Sampler a(unfiltered(1.0f, 1));
    Sampler b(unfiltered(1.0f, 2));
    int same = 0;
    for (int i = 0; i < 200; ++i) same += a.sample(logits) == b.sample(logits);
    QVERIFY2(same < 20, qPrintable(QStringLiteral("%1 of 200 draws equal").arg(same)));
  }

  void top_k_one_equals_greedy() {
    SamplingParams g;
    g.temperature = 0.0f;
    Sampler greedy(g);
    SamplingParams k = unfiltered(1.5f, 99);
    k.top_k = 1;
    Sampler top1(k);
    for (uint64_t s = 0; s < 20; ++s) {
      const std::vector<float> logits = random_logits(kBigVocab, 100 + s, 1.0f);
      QCOMPARE(top1.sample(logits), greedy.sample(logits));
    }
  }

  void top_k_never_returns_outside_top_k() {
    const std::vector<float> logits = random_logits(kBigVocab, 5, 1.0f);
    constexpr int kTopK = 40;
    std::vector<int32_t> order(kBigVocab);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    const std::set<int32_t> allowed(order.begin(), order.begin() + kTopK);

    SamplingParams p = unfiltered(2.0f, 3);  // a high temperature flattens the top 40
    p.top_k = kTopK;
    Sampler sampler(p);
    std::set<int32_t> seen;
    for (int i = 0; i < 4000; ++i) {
      const int32_t t = sampler.sample(logits);
      QVERIFY2(allowed.count(t), qPrintable(QStringLiteral("token %1 not in top 40").arg(t)));
      seen.insert(t);
    }
    QVERIFY(seen.size() > 30);  // it samples within the top k, not just its head
  }

  void top_k_frequencies_match_renormalised_softmax() {
    const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f, 0.0f, 1.5f, -0.5f, 0.2f};
    SamplingParams p = unfiltered(1.0f, 21);
    p.top_k = 3;  // tokens 1, 5, 3
    Sampler sampler(p);
    std::vector<bool> keep(logits.size(), false);
    keep[1] = keep[5] = keep[3] = true;
    verify_frequencies(histogram(sampler, logits, kDraws), restricted(softmax(logits, 1.0), keep),
                       kDraws);
  }

  void min_p_excludes_low_probability_tokens() {
    // p = 0.5, 0.3, 0.15, 0.05; min_p 0.2 → bound 0.2 * 0.5 = 0.1: only token 3 goes.
    const std::vector<double> probabilities = {0.5, 0.3, 0.15, 0.05};
    SamplingParams p = unfiltered(1.0f, 8);
    p.min_p = 0.2f;
    Sampler sampler(p);
    const std::vector<float> logits = logits_of(probabilities);
    verify_frequencies(histogram(sampler, logits, kDraws),
                       restricted(probabilities, {true, true, true, false}), kDraws);
  }

  void top_p_excludes_the_tail() {
    // p = 0.5, 0.3, 0.15, 0.05; top_p 0.75 → {0, 1} (cumulative 0.8 is the first to reach it).
    const std::vector<double> probabilities = {0.5, 0.3, 0.15, 0.05};
    SamplingParams p = unfiltered(1.0f, 9);
    p.top_p = 0.75f;
    Sampler sampler(p);
    const std::vector<float> logits = logits_of(probabilities);
    verify_frequencies(histogram(sampler, logits, kDraws),
                       restricted(probabilities, {true, true, false, false}), kDraws);
  }

  void top_p_keeps_at_least_one_token() {
    const std::vector<double> probabilities = {0.9, 0.05, 0.05};
    SamplingParams p = unfiltered(1.0f, 10);
    p.top_p = 0.01f;
    Sampler sampler(p);
    const std::vector<float> logits = logits_of(probabilities);
    for (int i = 0; i < 100; ++i) QCOMPARE(sampler.sample(logits), 0);
  }

  void top_p_on_full_vocab_stays_in_nucleus() {
    // top_k off: the sampler must handle all 49152 tokens itself. With logits ~ N(0, 2^2) the
    // top-0.5 nucleus holds hundreds of tokens, past the sampler's first sorted chunk.
    const std::vector<float> logits = random_logits(kBigVocab, 13, 2.0f);
    const std::vector<double> probabilities = softmax(logits, 1.0);
    std::vector<int32_t> order(kBigVocab);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return probabilities[a] > probabilities[b]; });
    constexpr double kTopP = 0.5;
    size_t nucleus = 0;
    double cumulative = 0.0;
    while (cumulative < kTopP) cumulative += probabilities[order[nucleus++]];
    std::vector<int32_t> rank(kBigVocab);
    for (int32_t r = 0; r < kBigVocab; ++r) rank[order[r]] = r;
    QVERIFY(nucleus > 200);

    SamplingParams p = unfiltered(1.0f, 14);
    p.top_p = static_cast<float>(kTopP);
    Sampler sampler(p);
    size_t deepest = 0;
    for (int i = 0; i < 1000; ++i) {
      deepest = std::max(deepest, static_cast<size_t>(rank[sampler.sample(logits)]));
    }
    // One token of slack for float rounding at the nucleus boundary; and the draws do reach deep
    // into the nucleus, not only its head.
    QVERIFY2(deepest <= nucleus && deepest > nucleus / 2,
             qPrintable(QStringLiteral("deepest rank %1, nucleus %2").arg(deepest).arg(nucleus)));
  }

  void frequencies_match_softmax_data() {
    QTest::addColumn<float>("temperature");
    QTest::newRow("T=1") << 1.0f;
    QTest::newRow("T=0.5") << 0.5f;
    QTest::newRow("T=2") << 2.0f;
  }
  void frequencies_match_softmax() {
    QFETCH(float, temperature);
    // The rarest cell (token 7 at T=0.5, p ≈ 2.1e-4) still expects ~4 of the 20000 draws.
    const std::vector<float> logits = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -2.0f};
    Sampler sampler(unfiltered(temperature, 2024));
    verify_frequencies(histogram(sampler, logits, kDraws), softmax(logits, temperature), kDraws);
  }

  void validate_rejects_out_of_range_fields() {
    QVERIFY(error_message(SamplingParams{}).isEmpty());
    QVERIFY(error_message(unfiltered(0.0f, 0)).isEmpty());

    SamplingParams p;
    p.temperature = -0.1f;
    QVERIFY(error_message(p).contains("temperature"));
    p.temperature = std::nanf("");
    QVERIFY(error_message(p).contains("temperature"));
    p.temperature = 1e-39f;  // its inverse overflows
    QVERIFY(error_message(p).contains("temperature"));

    p = {};
    p.top_p = 0.0f;
    QVERIFY(error_message(p).contains("top_p"));
    p.top_p = 1.5f;
    QVERIFY(error_message(p).contains("top_p"));

    p = {};
    p.min_p = -0.1f;
    QVERIFY(error_message(p).contains("min_p"));
    p.min_p = 1.1f;
    QVERIFY(error_message(p).contains("min_p"));

    p = {};
    p.top_p = 1.5f;
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, Sampler{p});
  }

  void no_allocation_after_first_call() {
    const std::vector<float> logits = random_logits(kBigVocab, 17, 2.0f);
    SamplingParams with_top_k;  // defaults
    SamplingParams full_vocab = unfiltered(0.9f, 5);
    full_vocab.top_p = 0.9f;
    full_vocab.min_p = 0.01f;
    Sampler a(with_top_k);
    Sampler b(full_vocab);
    a.sample(logits);
    b.sample(logits);
    const long before = g_allocations.load();
    for (int i = 0; i < 50; ++i) {
      a.sample(logits);
      b.sample(logits);
    }
    const long allocations = g_allocations.load() - before;
    QCOMPARE(allocations, 0L);
  }

  // A device that filters rows (kernels::filter_candidates under candidate_filter(params)) sends
  // candidates instead of whole rows; the sampler must then draw the same tokens, accept the same
  // drafts and resample the same rejections, from the same seed. Rows with ties, -0, NaN and
  // -inf; every filter on and off.
  void candidate_rows_draw_exactly_as_whole_rows() {
    std::mt19937_64 rng(2026);
    int filtered_rows = 0;
    int rows = 0;
    for (const float temperature : {0.0f, 0.3f, 1.0f, 2.5f})
      for (const int32_t top_k : {0, 1, 7, 40, 600, 100000})
        for (const float top_p : {1.0f, 0.9f, 0.3f})
          for (const float min_p : {0.0f, 0.05f, 0.6f}) {
            SamplingParams p;
            p.temperature = temperature;
            p.top_k = top_k;
            p.top_p = top_p;
            p.min_p = min_p;
            p.seed = rng();
            Sampler whole(p);
            Sampler candidates(p);
            const tokenfab::kernels::CandidateFilter filter = tokenfab::candidate_filter(p);
            for (int r = 0; r < 6; ++r) {
              const int n = 500 + static_cast<int>(rng() % 1500);
              // Logits on a 1/8 grid (ties), with a few -0, NaN and -inf.
              std::vector<float> logits = random_logits(n, rng(), 2.0f + static_cast<float>(r));
              for (float& l : logits) l = std::round(l * 8.0f) / 8.0f;
              for (int j = 0; j < 5; ++j) {
                logits[rng() % n] = -0.0f;
                logits[rng() % n] = std::nanf("");
                logits[rng() % n] = -std::numeric_limits<float>::infinity();
              }
              std::vector<float> cand_logits;
              std::vector<int32_t> cand_ids;
              const int32_t count = tokenfab::kernels::filter_candidates(
                  logits.data(), n, filter, tokenfab::kernels::candidate_slots(filter, n),
                  cand_logits, cand_ids);
              ++rows;
              if (count < 0) continue;  // goes whole: nothing to compare
              ++filtered_rows;
              const tokenfab::LogitRow row(
                  std::span<const float>(cand_logits.data(), static_cast<size_t>(count)),
                  std::span<const int32_t>(cand_ids.data(), static_cast<size_t>(count)),
                  tokenfab::kernels::top_k_limits(filter, n));
              for (int draw = 0; draw < 8; ++draw) {
                const auto draft = static_cast<int32_t>(
                    draw % 2 == 0 ? cand_ids[rng() % static_cast<size_t>(count)] : rng() % n);
                const bool accepted = whole.accept_draft(logits, draft);
                QCOMPARE(candidates.accept_draft(row, draft), accepted);
                if (!accepted)
                  QCOMPARE(candidates.sample_rejected(row, draft),
                           whole.sample_rejected(logits, draft));
                QCOMPARE(candidates.sample(row), whole.sample(logits));
              }
            }
          }
    // With top-k or min-p on (the defaults have both) rows are filtered, not sent whole.
    QVERIFY2(filtered_rows > rows * 3 / 4,
             qPrintable(QString("%1 of %2 rows filtered").arg(filtered_rows).arg(rows)));
  }

  // The default sampling parameters (top_k 40, min_p 0.05) leave at most 40 candidates, so a GPU
  // sends 40 pairs instead of the 49,152 logits of SmolLM2's vocabulary.
  void default_params_filter_a_full_vocabulary_to_top_k() {
    const SamplingParams defaults;
    const tokenfab::kernels::CandidateFilter filter = tokenfab::candidate_filter(defaults);
    QCOMPARE(tokenfab::kernels::candidate_slots(filter, kBigVocab), defaults.top_k);
    for (const float stddev : {0.1f, 2.0f, 8.0f}) {
      const std::vector<float> logits = random_logits(kBigVocab, 5, stddev);
      std::vector<float> cand_logits;
      std::vector<int32_t> cand_ids;
      const int32_t count = tokenfab::kernels::filter_candidates(
          logits.data(), kBigVocab, filter, defaults.top_k, cand_logits, cand_ids);
      QVERIFY(count >= 1 && count <= defaults.top_k);
      // Best first: the first candidate is the row's argmax.
      QCOMPARE(cand_ids[0], static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                                 logits.begin()));
    }
  }
};

QTEST_APPLESS_MAIN(TestSampler)
#include "test_sampler.moc"
