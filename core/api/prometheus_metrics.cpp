#include "core/api/prometheus_metrics.h"

#include <charconv>
#include <cmath>
#include <utility>
#include <vector>

namespace tokenfab::api {

namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back exactly
  return std::string(buf, r.ptr);
}

std::string number(int64_t v) {
  return std::to_string(v);
}

class Exposition {
 public:
  explicit Exposition(std::string model) : model_(std::move(model)) {}

  // A metric family's HELP and TYPE lines; `name` without the _total a counter's samples carry.
  void family(const std::string& name, const char* type, const char* help) {
    out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }

  void sample(const std::string& name, const Labels& labels, const std::string& value) {
    out_ += name + "{model_name=\"" + escape_label_value(model_) + "\"";
    for (const auto& [k, v] : labels) out_ += "," + k + "=\"" + escape_label_value(v) + "\"";
    out_ += "} " + value + "\n";
  }

  void counter(const std::string& name, const char* help, int64_t value, const Labels& l = {}) {
    family(name, "counter", help);
    sample(name + "_total", l, number(value));
  }

  void histogram(const std::string& name, const char* help, const BucketHistogram& h) {
    family(name, "histogram", help);
    const std::vector<int64_t> cumulative = h.cumulative();
    for (size_t i = 0; i < h.bounds().size(); ++i)
      sample(name + "_bucket", {{"le", number(h.bounds()[i])}}, number(cumulative[i]));
    sample(name + "_bucket", {{"le", "+Inf"}}, number(cumulative.back()));
    sample(name + "_sum", {}, number(h.sum()));
    sample(name + "_count", {}, number(h.count()));
  }

  std::string take() { return std::move(out_); }

 private:
  std::string model_;
  std::string out_;
};

constexpr const char* kPrefix = "tokenfab:";

std::string named(const char* suffix) {
  return std::string(kPrefix) + suffix;
}

void device_gauges(Exposition& x, const EngineSnapshot& s) {
  x.family(named("num_requests_running"), "gauge",
           "Requests in prefill or decode on the device (a step computes them).");
  for (const DeviceSnapshot& d : s.devices)
    x.sample(named("num_requests_running"), {{"device", d.name}}, number(int64_t{d.running}));
  x.family(named("num_requests_waiting"), "gauge",
           "Requests queued on the device (waiting for blocks or their turn), and KV transfers "
           "on their way to it.");
  for (const DeviceSnapshot& d : s.devices)
    x.sample(named("num_requests_waiting"), {{"device", d.name}},
             number(int64_t{d.waiting} + d.receiving));
  x.family(named("kv_cache_usage_perc"), "gauge",
           "KV-cache usage of the device: blocks owned by sequences / all blocks (1 = full).");
  for (const DeviceSnapshot& d : s.devices) {
    const double usage =
        d.kv.n_blocks > 0 ? static_cast<double>(d.kv.n_owned) / d.kv.n_blocks : 0.0;
    x.sample(named("kv_cache_usage_perc"), {{"device", d.name}}, number(usage));
  }
  x.family(named("kv_cache_blocks"), "gauge",
           "KV-cache blocks of the device by state: free, owned by a sequence, or cached "
           "(a freed prefix kept for reuse).");
  for (const DeviceSnapshot& d : s.devices) {
    x.sample(named("kv_cache_blocks"), {{"device", d.name}, {"state", "free"}},
             number(int64_t{d.kv.n_free}));
    x.sample(named("kv_cache_blocks"), {{"device", d.name}, {"state", "owned"}},
             number(int64_t{d.kv.n_owned}));
    x.sample(named("kv_cache_blocks"), {{"device", d.name}, {"state", "cached"}},
             number(int64_t{d.kv.n_cached}));
  }
}

void request_counters(Exposition& x, const LiveCounters& c, const ServingSummary& s) {
  x.counter(named("prompt_tokens"), "Prompt tokens of submitted requests.", c.prompt_tokens);
  x.counter(named("generation_tokens"), "Generated tokens emitted.", c.generation_tokens);
  x.family(named("request_success"), "counter",
           "Requests ended, by finish reason: stop (end of generation or a stop string), length "
           "(max_tokens), abort (cancelled: the client went away).");
  for (const char* reason : {kFinishStop, kFinishLength, kFinishAbort}) {
    const auto it = c.ended_by_reason.find(reason);
    x.sample(named("request_success_total"), {{"finished_reason", reason}},
             number(it != c.ended_by_reason.end() ? it->second : 0));
  }
  const auto failed = c.ended_by_reason.find(kFinishError);
  x.counter(named("request_failure"), "Requests that failed (a device error).",
            failed != c.ended_by_reason.end() ? failed->second : 0);
  x.counter(named("num_preemptions"),
            "Preemptions: a running request's blocks taken back to let others run.", s.preemptions);
  x.counter(named("prefix_cache_queries"), "Prompt tokens looked up in the prefix cache.",
            s.prefix_lookups);
  x.counter(named("prefix_cache_hits"), "Prompt tokens found in the prefix cache.", s.prefix_hits);
}

void transfer_counters(Exposition& x, const ServingSummary& s) {
  x.counter(named("kv_transfers"), "KV-cache transfers between devices that completed.",
            s.transfer.count);
  x.counter(named("kv_transfer_bytes"), "Bytes the KV transfers copied.", s.transfer.bytes);
  x.family(named("kv_transfer_seconds"), "counter",
           "Seconds the KV transfers spent copying (waits for the producer left out).");
  x.sample(named("kv_transfer_seconds_total"), {}, number(s.transfer.seconds));
}

void speculation_counters(Exposition& x, const LiveCounters& c) {
  struct Figure {
    const char* name;
    const char* help;
    int64_t SpeculationCounters::*field;
  };
  const Figure figures[] = {
      {"spec_decode_num_drafts", "Verification steps that checked drafts.",
       &SpeculationCounters::drafts},
      {"spec_decode_num_draft_tokens", "Draft tokens checked.", &SpeculationCounters::draft_tokens},
      {"spec_decode_num_accepted_tokens", "Draft tokens accepted.",
       &SpeculationCounters::accepted_tokens},
  };
  for (const Figure& f : figures) {
    x.family(named(f.name), "counter", f.help);
    for (const auto& [head, s] : c.speculation_by_head)
      x.sample(named(f.name) + "_total", {{"head", head.empty() ? "lookup" : head}},
               number(s.*f.field));
  }
  x.family(named("spec_decode_num_accepted_tokens_per_pos"), "counter",
           "Draft tokens accepted at each draft position (0: the first drafted token).");
  for (const auto& [head, s] : c.speculation_by_head)
    for (size_t k = 0; k < s.accepted_per_position.size(); ++k)
      x.sample(named("spec_decode_num_accepted_tokens_per_pos_total"),
               {{"head", head.empty() ? "lookup" : head}, {"position", std::to_string(k)}},
               number(s.accepted_per_position[k]));
}

}  // namespace

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (const char ch : value) {
    if (ch == '\\')
      out += "\\\\";
    else if (ch == '"')
      out += "\\\"";
    else if (ch == '\n')
      out += "\\n";
    else
      out += ch;
  }
  return out;
}

std::string prometheus_text(const MetricsInput& in) {
  Exposition x(in.model_name);
  x.family(named("api_requests_in_flight"), "gauge",
           "API generation requests in flight (running, queued or streaming).");
  x.sample(named("api_requests_in_flight"), {}, number(int64_t{in.api_in_flight}));
  if (in.snapshot == nullptr || in.counters == nullptr) return x.take();
  device_gauges(x, *in.snapshot);
  request_counters(x, *in.counters, in.snapshot->summary);
  transfer_counters(x, in.snapshot->summary);
  speculation_counters(x, *in.counters);
  x.histogram(named("time_to_first_token_seconds"), "Time to first token: submitted → first token.",
              in.counters->ttft_s);
  x.histogram(named("inter_token_latency_seconds"),
              "Gaps between a request's consecutive output tokens (tokens of one speculative step "
              "leave together: the first gets the gap, the rest 0).",
              in.counters->itl_s);
  x.histogram(named("e2e_request_latency_seconds"), "End-to-end latency: submitted → last token.",
              in.counters->e2e_s);
  return x.take();
}

}  // namespace tokenfab::api
