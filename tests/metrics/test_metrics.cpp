// Metrics: TTFT / ITL / TPOT / E2E from synthetic timestamps (hand-computed), percentiles equal to
// numpy's default 'linear' method, the log histogram's bounds, sliding-window rates on a synthetic
// event stream, goodput, the serve-bench JSON shape, and concurrent appends.

#include <QtTest/QtTest>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/common/error.h"
#include "core/metrics/aggregate.h"
#include "core/metrics/percentiles.h"
#include "core/metrics/request_metrics.h"
#include "core/metrics/time_series.h"

namespace {

using namespace std::chrono_literals;
using tokenfab::MetricsTime;

constexpr double kTol = 1e-9;

// A fixed origin; the tests only ever use offsets from it.
MetricsTime at(std::chrono::nanoseconds offset) {
  return MetricsTime{} + 1h + offset;
}

bool near(double a, double b, double tol = kTol) {
  return std::abs(a - b) <= tol;
}

tokenfab::Slo slo(std::optional<double> ttft_s, std::optional<double> tpot_s,
                  std::optional<double> e2e_s) {
  tokenfab::Slo s;
  s.ttft_s = ttft_s;
  s.tpot_s = tpot_s;
  s.e2e_s = e2e_s;
  return s;
}

std::set<std::string> keys_of(const nlohmann::json& j) {
  std::set<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.insert(it.key());
  return keys;
}

// Request A of the aggregate tests: submitted at 0, tokens at 100, 130, 170, 250 ms.
tokenfab::RequestMetrics request_a() {
  tokenfab::RequestTimeline t(at(0ms));
  for (auto ms : {100ms, 130ms, 170ms, 250ms}) t.on_emission(at(ms), 1);
  return t.compute();
}

}  // namespace

class TestMetrics : public QObject {
  Q_OBJECT

 private slots:
  void plain_decode_latencies() {
    const tokenfab::RequestMetrics m = request_a();
    QCOMPARE(m.output_tokens, int64_t{4});
    QVERIFY(near(*m.ttft_s, 0.100));
    QCOMPARE(m.itl_s.size(), size_t{3});
    QVERIFY(near(m.itl_s[0], 0.030) && near(m.itl_s[1], 0.040) && near(m.itl_s[2], 0.080));
    QVERIFY(near(*m.tpot_s, (0.250 - 0.100) / 3));  // (end - first token) / (4 - 1)
    QVERIFY(near(*m.e2e_s, 0.250));
    QCOMPARE(m.tokens_per_step, (std::vector<int32_t>{1, 1, 1}));
    QVERIFY(near(*m.accept_per_step(), 1.0));
  }

  // Speculative steps emit several tokens at one instant: the first gets the gap, the rest 0.
  void speculative_emissions() {
    tokenfab::RequestTimeline t(at(0ms));
    t.on_emission(at(50ms), 1);   // prefill's token
    t.on_emission(at(80ms), 3);   // 2 accepted + bonus
    t.on_emission(at(100ms), 1);  // all drafts rejected, bonus only
    t.on_emission(at(140ms), 4);
    const tokenfab::RequestMetrics m = t.compute();
    QCOMPARE(m.output_tokens, int64_t{9});
    const std::vector<double> expected = {0.030, 0, 0, 0.020, 0.040, 0, 0, 0};
    QCOMPARE(m.itl_s.size(), expected.size());
    double sum = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      QVERIFY2(near(m.itl_s[i], expected[i]), qPrintable(QString::number(i)));
      sum += m.itl_s[i];
    }
    QVERIFY(near(*m.tpot_s, 0.090 / 8));
    QVERIFY(near(sum / 8, *m.tpot_s));  // mean ITL == TPOT by construction
    QVERIFY(near(*m.ttft_s, 0.050));
    QVERIFY(near(*m.e2e_s, 0.140));
    QCOMPARE(m.tokens_per_step, (std::vector<int32_t>{3, 1, 4}));
    QVERIFY(near(*m.accept_per_step(), 8.0 / 3.0));
  }

  void single_and_no_token() {
    tokenfab::RequestTimeline one(at(0ms));
    one.on_emission(at(70ms), 1);
    const tokenfab::RequestMetrics m1 = one.compute();
    QVERIFY(!m1.tpot_s.has_value());
    QVERIFY(m1.itl_s.empty());
    QVERIFY(!m1.accept_per_step().has_value());
    QVERIFY(near(*m1.ttft_s, 0.070) && near(*m1.e2e_s, 0.070));

    const tokenfab::RequestMetrics m0 = tokenfab::RequestTimeline(at(0ms)).compute();
    QCOMPARE(m0.output_tokens, int64_t{0});
    QVERIFY(!m0.ttft_s && !m0.tpot_s && !m0.e2e_s && m0.itl_s.empty());
  }

  void timeline_rejects_bad_input() {
    tokenfab::RequestTimeline t(at(10ms));
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, t.on_emission(at(5ms), 1));
    t.on_emission(at(20ms), 1);
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, t.on_emission(at(15ms), 1));
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, t.on_emission(at(30ms), 0));
  }

  // Golden values from numpy 2.4.6, default method ('linear'):
  //   python3 -c "import numpy as np; print([float(np.percentile(V, q))
  //               for q in (0, 25, 50, 95, 99, 100)])"
  void percentiles_match_numpy_linear_data() {
    QTest::addColumn<std::vector<double>>("values");
    QTest::addColumn<std::vector<double>>("expected");  // at q = 0, 25, 50, 95, 99, 100
    QTest::newRow("five") << std::vector<double>{15, 20, 35, 40, 50}
                          << std::vector<double>{15, 20, 35, 48, 49.6, 50};
    QTest::newRow("eleven unsorted")
        << std::vector<double>{3.2, 0.5, 7.75, 1.0, 12.5, 4.4, 9.9, 0.05, 6.0, 2.25, 8.125}
        << std::vector<double>{0.05, 1.625, 4.4, 11.2, 12.24, 12.5};
    QTest::newRow("one") << std::vector<double>{42} << std::vector<double>(6, 42.0);
    QTest::newRow("two") << std::vector<double>{1, 2}
                         << std::vector<double>{1, 1.25, 1.5, 1.95, 1.99, 2};
  }
  void percentiles_match_numpy_linear() {
    QFETCH(std::vector<double>, values);
    QFETCH(std::vector<double>, expected);
    const double qs[] = {0, 25, 50, 95, 99, 100};
    for (size_t i = 0; i < 6; ++i) {
      const double got = tokenfab::percentile(values, qs[i]);
      QVERIFY2(near(got, expected[i], 1e-12 * std::max(1.0, std::abs(expected[i]))),
               qPrintable(QString("q=%1 got %2 want %3").arg(qs[i]).arg(got).arg(expected[i])));
    }
    const tokenfab::PercentileSummary s = tokenfab::summarize_percentiles(values);
    QCOMPARE(s.count, static_cast<int64_t>(values.size()));
    QVERIFY(near(*s.p50, expected[2], 1e-12 * 50) && near(*s.p95, expected[3], 1e-12 * 50) &&
            near(*s.p99, expected[4], 1e-12 * 50));
    QCOMPARE(*s.max, *std::max_element(values.begin(), values.end()));
  }

  void percentile_edge_cases() {
    const std::vector<double> empty;
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, tokenfab::percentile(empty, 50));
    const std::vector<double> v = {1, 2, 3};
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, tokenfab::percentile(v, -1));
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, tokenfab::percentile(v, 100.5));
    const tokenfab::PercentileSummary s = tokenfab::summarize_percentiles({});
    QVERIFY(s.count == 0 && !s.p50 && !s.p95 && !s.p99 && !s.max);
  }

  void log_histogram_buckets() {
    tokenfab::LogHistogram h(1e-3, 1.0, 10);  // 1 ms .. 1 s, 30 regular buckets
    QCOMPARE(h.bucket_count(), 32);
    QVERIFY(std::isinf(h.bucket_lower(0)) && std::isinf(h.bucket_upper(31)));
    QVERIFY(near(h.bucket_lower(1), 1e-3, 1e-15) && near(h.bucket_upper(30), 1.0, 1e-12));
    QCOMPARE(h.bucket_index(0.0), 0);
    QCOMPARE(h.bucket_index(5.0), 31);
    QVERIFY(!h.approx_percentile(50).has_value());
    // Every value lies within its bucket's edges.
    for (double v = 1e-3; v < 1.0; v *= 1.07) {
      const int i = h.bucket_index(v);
      QVERIFY(h.bucket_lower(i) <= v && v < h.bucket_upper(i));
    }
    for (int i = 1; i <= 100; ++i) h.add(i * 1e-3);  // 1 .. 100 ms
    QCOMPARE(h.count(), int64_t{100});
    // Nearest-rank p50 is 50 ms, p99 99 ms; the reported upper edge is >= it and < 10^0.1 times it.
    const double r = std::pow(10.0, 0.1);
    const double p50 = *h.approx_percentile(50), p99 = *h.approx_percentile(99);
    QVERIFY(p50 >= 0.050 && p50 < 0.050 * r);
    QVERIFY(p99 >= 0.099 && p99 < 0.099 * r);
    h.clear();
    QCOMPARE(h.count(), int64_t{0});
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, tokenfab::LogHistogram(1.0, 0.5, 10));
  }

  // 2 tokens every 10 ms from 10 ms to 1000 ms after the origin: a steady 200 tokens/s.
  void sliding_window_rate() {
    tokenfab::TimeSeries s(1000, at(0ms));
    for (int i = 1; i <= 100; ++i) s.append(at(i * 10ms), 2.0);

    tokenfab::WindowRate r = s.rate(at(1000ms), 500ms);  // (500, 1000]: 50 events
    QCOMPARE(r.events, int64_t{50});
    QVERIFY(near(r.sum, 100) && near(r.span_s, 0.5) && near(r.per_second, 200) && !r.truncated);

    r = s.rate(at(1000ms), 2s);  // reaches before the origin: span is 1 s, not 2
    QVERIFY(near(r.span_s, 1.0) && near(r.per_second, 200) && r.events == 100);

    r = s.rate(at(505ms), 100ms);  // (405, 505]: 410 .. 500 ms; later events ignored
    QVERIFY(r.events == 10 && near(r.per_second, 200));

    // A burst: 50 tokens at 1200 ms. The rate over (1000, 1250] shows it as it is.
    s.append(at(1200ms), 50.0);
    r = s.rate(at(1250ms), 250ms);
    QVERIFY(r.events == 1 && near(r.per_second, 200));  // 50 tokens / 0.25 s
    r = s.rate(at(1150ms), 150ms);
    QVERIFY(r.events == 0 && near(r.per_second, 0) && near(r.span_s, 0.15));
  }

  void ring_drops_oldest_and_marks_truncation() {
    tokenfab::TimeSeries s(10, at(0ms));
    for (int i = 1; i <= 100; ++i) s.append(at(i * 10ms), 2.0);
    QCOMPARE(s.size(), size_t{10});
    QCOMPARE(s.total_appended(), int64_t{100});
    const std::vector<tokenfab::TimeSample> snap = s.snapshot();
    QCOMPARE(snap.size(), size_t{10});
    for (size_t i = 0; i < snap.size(); ++i) QVERIFY(snap[i].time == at((91 + int(i)) * 10ms));
    // Samples up to 900 ms were dropped, so a 500 ms window can only cover (900, 1000].
    const tokenfab::WindowRate r = s.rate(at(1000ms), 500ms);
    QVERIFY(r.truncated && near(r.span_s, 0.1) && r.events == 10 && near(r.per_second, 200));
  }

  // TTFT / ITL / TPOT / E2E of requests A, B, C (hand-computed, in ms):
  //   A: submit 0, tokens 100, 130, 170, 250 -> ttft 100, itl 30 40 80, tpot 50, e2e 250
  //   B: submit 100, tokens 300, 400         -> ttft 200, itl 100,      tpot 100, e2e 300
  //   C: submit 200, token 500               -> ttft 300, no itl/tpot,           e2e 300
  // plus one failed request, 2 preemptions, 4/10 prefix hits, transfers 1 GB / 0.5 s and
  // 0.5 GB / 0.25 s (2 GB/s), over 2 s.
  void summary_and_json() {
    tokenfab::ServingMetrics sm(at(0ms));
    fill_abc(sm);
    const tokenfab::ServingSummary s = sm.summary(at(2s));
    QCOMPARE(s.requests, int64_t{4});
    QCOMPARE(s.completed, int64_t{3});
    QCOMPARE(s.failed, int64_t{1});
    QCOMPARE(s.preemptions, int64_t{2});
    QCOMPARE(s.output_tokens, int64_t{7});
    QVERIFY(near(s.duration_s, 2.0) && near(*s.throughput_tok_s, 3.5));
    // numpy linear: ttft [100,200,300] -> p95 = 200 + 0.9 * 100; itl [30,40,80,100] -> p50 60,
    // p95 at h = 2.85 -> 80 + 0.85 * 20 = 97, p99 at h = 2.97 -> 99.4; tpot [50,100].
    const double t = 1e-6;
    QVERIFY(near(*s.ttft_ms.p50, 200, t) && near(*s.ttft_ms.p95, 290, t) &&
            near(*s.ttft_ms.p99, 298, t));
    QVERIFY(near(*s.itl_ms.p50, 60, t) && near(*s.itl_ms.p95, 97, t) &&
            near(*s.itl_ms.p99, 99.4, t));
    QVERIFY(near(*s.tpot_ms.p50, 75, t) && near(*s.tpot_ms.p95, 97.5, t) &&
            near(*s.tpot_ms.p99, 99.5, t));
    QVERIFY(near(*s.e2e_ms.p50, 300, t) && near(*s.e2e_ms.p99, 300, t));
    QVERIFY(near(*s.prefix_hit_rate, 0.4));
    QVERIFY(s.transfer.count == 3 && s.transfer.bytes == 1'500'000'000);
    QCOMPARE(s.transfer.handed_over_blocks, int64_t{7});
    QVERIFY(near(*s.transfer.gb_per_s(), 2.0));
    QVERIFY(near(*s.accept_per_step, 1.0));

    const nlohmann::json j = tokenfab::to_json(s);
    QCOMPARE(keys_of(j),
             (std::set<std::string>{"requests", "completed", "failed", "preemptions", "duration_s",
                                    "throughput_tok_s", "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms",
                                    "prefix_hit_rate", "transfer"}));
    const std::set<std::string> pct = {"p50", "p95", "p99", "max"};
    for (const char* k : {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"}) QCOMPARE(keys_of(j[k]), pct);
    QCOMPARE(keys_of(j["transfer"]),
             (std::set<std::string>{"count", "handed_over_blocks", "bytes", "gb_s", "copy_s",
                                    "waited_s", "layers_overlapped_fraction"}));
    QVERIFY(near(j["transfer"]["copy_s"].get<double>(), 0.75));
    QVERIFY(near(j["transfer"]["waited_s"].get<double>(), 0.1));
    QVERIFY(near(j["transfer"]["layers_overlapped_fraction"].get<double>(), 12.0 / 90.0));
    QCOMPARE(j["transfer"]["handed_over_blocks"].get<int64_t>(), int64_t{7});
    QCOMPARE(j["requests"].get<int64_t>(), int64_t{4});
    QVERIFY(near(j["itl_ms"]["p95"].get<double>(), 97, t));
    QVERIFY(near(j["itl_ms"]["max"].get<double>(), *s.itl_ms.max));
    QVERIFY(near(j["transfer"]["gb_s"].get<double>(), 2.0));
  }

  // A figure with nothing behind it is null, never a made-up 0.
  void empty_summary_is_null() {
    tokenfab::ServingMetrics sm(at(0ms));
    const nlohmann::json j = tokenfab::to_json(sm.summary(at(0ms)));
    QCOMPARE(j["completed"].get<int64_t>(), int64_t{0});
    QVERIFY(j["throughput_tok_s"].is_null() && j["prefix_hit_rate"].is_null());
    QVERIFY(j["ttft_ms"]["p50"].is_null() && j["transfer"]["gb_s"].is_null());
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, sm.on_prefix_lookup(1, 2));
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, sm.on_transfer(-1, 0.1));
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, sm.on_transfer(1, 0.1, -0.5));
    QVERIFY_THROWS_EXCEPTION(tokenfab::Error, sm.on_transfer(1, 0.1, 0.0, 4, 5));
    QVERIFY(j["transfer"]["layers_overlapped_fraction"].is_null());
  }

  // vLLM's goodput: good = meets every SLO set (<=); one-token requests have TPOT 0.
  void goodput_against_slos() {
    tokenfab::ServingMetrics sm(at(0ms));
    fill_abc(sm);
    // A meets both; B misses TPOT (100 ms); C misses TTFT (300 ms).
    tokenfab::Goodput g = sm.goodput(slo(0.25, 0.06, std::nullopt), at(2s));
    QVERIFY(g.good == 1 && g.ended == 4 && near(*g.fraction, 0.25) && near(*g.rate_per_s, 0.5));
    // Looser: all three completed are good (C's single token counts as TPOT 0); failed is not.
    g = sm.goodput(slo(0.31, 0.101, std::nullopt), at(2s));
    QVERIFY(g.good == 3 && near(*g.fraction, 0.75) && near(*g.rate_per_s, 1.5));
    g = sm.goodput(slo(std::nullopt, std::nullopt, 0.26), at(2s));  // only A's E2E (250 ms) fits
    QCOMPARE(g.good, int64_t{1});
    const nlohmann::json j = tokenfab::to_json(g);
    QCOMPARE(keys_of(j), (std::set<std::string>{"good", "ended", "fraction", "rate_per_s"}));
  }

  void live_rate_and_histogram() {
    tokenfab::ServingMetrics sm(at(0ms));
    for (int i = 1; i <= 100; ++i) sm.on_emission(at(i * 10ms), 1);
    QVERIFY(near(sm.output_rate(at(1000ms), 1s).per_second, 100));
    QCOMPARE(sm.emission_snapshot().size(), size_t{100});
    sm.on_completed(request_a());
    QCOMPARE(sm.itl_histogram().count(), int64_t{3});
  }

  // The accept-length histogram counts each step of completed requests under the number of tokens
  // it emitted; per-position draft counts add up element-wise over requests of different lengths;
  // draft and verify time average over the verifying steps.
  void accept_length_histogram_and_positions() {
    tokenfab::ServingMetrics sm(at(0ms));
    tokenfab::RequestMetrics r1, r2;
    r1.output_tokens = 12;
    r1.tokens_per_step = {1, 3, 3, 5};
    r2.output_tokens = 3;
    r2.tokens_per_step = {2, 1};
    const std::vector<int64_t> p1 = {4, 4, 4, 4}, a1 = {3, 2, 1, 1};
    const std::vector<int64_t> p2 = {2, 1}, a2 = {1, 0};
    sm.on_completed(r1, p1, a1, {3, 0.003, 0.030});
    sm.on_completed(r2, p2, a2, {1, 0.001, 0.010});
    sm.on_completed(request_a());  // no head: no per-position counts, no draft time
    const tokenfab::ServingSummary s = sm.summary(at(1s));
    // request_a's steps: one token each (see request_a()).
    const int64_t a_steps = static_cast<int64_t>(request_a().tokens_per_step.size());
    QCOMPARE(s.steps_by_tokens, (std::vector<int64_t>{0, 2 + a_steps, 1, 2, 0, 1}));
    QCOMPARE(s.draft_proposed_at, (std::vector<int64_t>{6, 5, 4, 4}));
    QCOMPARE(s.draft_accepted_at, (std::vector<int64_t>{4, 2, 1, 1}));
    // Per verifying step of the two heads' requests: 4 ms proposing and 40 ms verifying in 4.
    QVERIFY(s.draft_ms_per_step && near(*s.draft_ms_per_step, 1.0));
    QVERIFY(s.verify_ms_per_step && near(*s.verify_ms_per_step, 10.0));
    tokenfab::ServingMetrics none(at(0ms));
    none.on_completed(request_a());
    QVERIFY(!none.summary(at(1s)).draft_ms_per_step && !none.summary(at(1s)).verify_ms_per_step);
  }

  // Two threads append at once; nothing is lost and a concurrent snapshot stays consistent.
  void concurrent_appends() {
    constexpr int kPerThread = 20000;
    tokenfab::TimeSeries series(2 * kPerThread, at(0ms));
    tokenfab::ServingMetrics sm(at(0ms));
    const tokenfab::RequestMetrics a = request_a();
    auto writer = [&](int offset) {
      for (int i = 0; i < kPerThread; ++i) {
        series.append(at(std::chrono::microseconds(2 * i + offset + 1)), 1.0);
        sm.on_emission(at(std::chrono::microseconds(2 * i + offset + 1)), 1);
        if (i % 100 == 0) sm.on_completed(a);
      }
    };
    std::thread t1(writer, 0), t2(writer, 1);  // interleaved times, all after the origin
    for (int i = 0; i < 50; ++i) QVERIFY(series.snapshot().size() <= size_t{2 * kPerThread});
    t1.join();
    t2.join();
    QCOMPARE(series.total_appended(), int64_t{2 * kPerThread});
    QCOMPARE(series.snapshot().size(), size_t{2 * kPerThread});
    QVERIFY(near(series.rate(at(1s), 1s).sum, 2.0 * kPerThread));
    QCOMPARE(sm.summary(at(1s)).completed, int64_t{2 * kPerThread / 100});
  }

 private:
  static void fill_abc(tokenfab::ServingMetrics& sm) {
    for (int i = 0; i < 4; ++i) sm.on_submitted();
    sm.on_completed(request_a());
    tokenfab::RequestTimeline b(at(100ms));
    b.on_emission(at(300ms), 1);
    b.on_emission(at(400ms), 1);
    sm.on_completed(b.compute());
    tokenfab::RequestTimeline c(at(200ms));
    c.on_emission(at(500ms), 1);
    sm.on_completed(c.compute());
    sm.on_failed();
    sm.on_preemption();
    sm.on_preemption();
    sm.on_prefix_lookup(6, 1);
    sm.on_prefix_lookup(4, 3);
    sm.on_transfer(1'000'000'000, 0.5, 0.0, 30, 0);
    sm.on_transfer(500'000'000, 0.25, 0.1, 30,
                   12);                     // streamed: 12 layers copied during the prefill
    sm.on_transfer(0, 0.0, 0.0, 30, 0, 7);  // 7 blocks handed over within one shared storage
  }
};

QTEST_APPLESS_MAIN(TestMetrics)
#include "test_metrics.moc"
