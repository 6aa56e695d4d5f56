// Head training's data → traces (training_traces.h).

#include "core/training/training_traces.h"
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include "core/common/atomic_file.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "core/common/sha256.h"
#include "core/model/transformer_pass.h"
#include "core/serving/prompt_sets.h"
#include "core/speculative/draft_head.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/storage/training_runs.h"
#include "core/tokenizer/chat_template.h"
#include "core/training/prompt_writer.h"
#include "core/training/trace_recorder.h"
#include "core/training/trainer.h"

namespace tokenfab {

namespace {

namespace fs = std::filesystem;

// Text of the user's corpus: files, and folders read recursively; JSONL lines contribute their
// "text", "prompt", "completion" and "content" strings; files with NUL bytes are skipped.
std::string read_corpus(const std::vector<std::string>& paths) {
  std::string text;
  auto add_file = [&](const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error("cannot read " + file.string());
    std::stringstream ss;
    ss << in.rdbuf();
    std::string body = ss.str();
    if (body.find('\0') != std::string::npos) return;  // binary
    if (file.extension() == ".jsonl") {
      std::istringstream lines(body);
      std::string line;
      body.clear();
      while (std::getline(lines, line)) {
        try {
          const nlohmann::json j = nlohmann::json::parse(line);
          for (const char* key : {"text", "prompt", "completion", "content"})
            if (j.contains(key) && j[key].is_string()) body += j[key].get<std::string>() + "\n\n";
        } catch (const std::exception&) {
        }
      }
    }
    text += body;
    text += "\n\n";
  };
  for (const std::string& p : paths) {
    if (fs::is_directory(p)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) add_file(f);
    } else if (fs::is_regular_file(p)) {
      add_file(p);
    } else {
      throw Error("--corpus " + p + ": no such file or folder");
    }
  }
  if (text.find_first_not_of(" \n\t\r") == std::string::npos)
    throw Error("the corpus holds no text");
  return text;
}

constexpr int32_t kWrittenTurnTokens = 96;  // a written request not ended by then is dropped

// The requests the target writes after the set's prompts `texts` (prompt_writer.h), cached as a
// JSON array beside the traces under a key of the model, the examples and the options; `cached`
// tells whether they came from that file. `message` is a line for the log, or empty.
std::vector<std::string> written_prompts(const LlamaModel& model, const Tokenizer& tokenizer,
                                         const ChatTemplate& tmpl,
                                         const std::vector<std::string>& texts,
                                         const HeadTrainingRequest& r, const std::string& sha,
                                         const TraceProgress& progress, std::string& message,
                                         bool& cached) {
  PromptWriting w;
  w.count = r.self_prompts;
  w.max_tokens = kWrittenTurnTokens;
  w.seed = r.seed;
  w.threads = r.threads;
  std::string key = "written-prompts-v1;model=" + sha + ";count=" + std::to_string(w.count) +
                    ";max_tokens=" + std::to_string(w.max_tokens) +
                    ";temperature=" + std::to_string(w.temperature) +
                    ";seed=" + std::to_string(w.seed) + ";";
  for (const std::string& t : texts) key += t + "\x1f";
  const fs::path file =
      user_data_dir() / "traces" / (sha256_hex(key).substr(0, 24) + ".prompts.json");
  cached = false;
  std::string unusable;  // reported once the prompts are written, not with every progress line
  if (!r.no_cache && fs::exists(file)) {
    try {
      std::ifstream in(file);
      const auto texts_read = nlohmann::json::parse(in).get<std::vector<std::string>>();
      message = "written prompts: " + std::to_string(texts_read.size()) + " from the cache (" +
                file.string() + ")";
      cached = true;
      return texts_read;
    } catch (const std::exception& e) {
      unusable = std::string("written prompts: the cached file is unusable (") + e.what() +
                 "); written again";
    }
  }
  bool cancelled = false;
  std::vector<std::string> out =
      write_prompts(model, tokenizer, tmpl, texts, w, progress, &cancelled);
  if (cancelled) throw Error("cancelled while writing prompts; no head was saved");
  create_folders_for(file);
  // A temporary file of its own, renamed into place whole: a CLI and the app may write at once.
  write_file_atomically(file, nlohmann::json(out).dump(1));
  message = unusable;
  return out;
}

}  // namespace

// The request's data → traces. The data come in parts — the greedy continuations of the prompts,
// each sampled pass over them, the same for the prompts the target wrote, the corpus — and each
// part is cached on its own under a key of the model, its data and its options, so that adding
// sampled passes, written prompts or files to a run traced before records only what is new.
Traces trace_data(const LlamaModel& model, const Tokenizer& tokenizer, const HeadTrainingRequest& r,
                  const std::string& sha,
                  const std::function<bool(const HeadTrainingProgress&)>& progress) {
  TraceOptions options;
  options.continuation_tokens = r.continuation;
  options.threads = r.threads;
  options.taps = r.taps && r.type == "mtp";
  std::string model_key = "model=" + sha + ";continuation=" + std::to_string(r.continuation) +
                          ";top_k=" + std::to_string(options.top_k) + ";";
  if (options.taps) {
    model_key += "taps=";
    for (const int32_t layer : draft_tap_layers(model.hparams().n_layer))
      model_key += std::to_string(layer) + ",";
    model_key += ";";
  }
  struct Part {
    std::string key;
    int group = 0;         // prompts: 0 the set's, 1 those the target wrote
    int sampled_pass = 0;  // prompts: 0 greedy, p > 0 the p-th sampled pass
    bool corpus = false;
    int64_t tokens = 0;  // positions to record (for progress)
  };
  std::vector<Part> parts;
  std::vector<std::vector<TokenId>> prompts[2];
  std::vector<std::string> texts;
  std::vector<TokenId> corpus_tokens;
  Traces out;
  // Greedy and sampled parts of a group of prompts; the written ones' key says so.
  const auto add_group = [&](int group, const std::vector<std::string>& group_texts,
                             const ChatTemplate& tmpl) {
    std::string key = model_key + (group == 1 ? "written;" : "");
    for (const std::string& t : group_texts) {
      prompts[group].push_back(
          tokenizer.encode(tmpl.apply({{"user", t}}, true), tokenizer.add_bos_token(), true));
      key += t + "\x1f";
    }
    const int64_t tokens = static_cast<int64_t>(group_texts.size()) * r.continuation;
    parts.push_back({key, group, 0, false, tokens});
    for (int pass = 1; pass <= r.samples; ++pass)
      parts.push_back({key + "sampled pass=" + std::to_string(pass) +
                           ";temperature=" + std::to_string(r.sample_temperature) +
                           ";seed=" + std::to_string(r.seed) + ";",
                       group, pass, false, tokens});
  };
  std::optional<ChatTemplate> tmpl;
  if (r.prompt_set) {
    texts = named_prompts(*r.prompt_set, "train");
    if (r.max_prompts > 0 && static_cast<int>(texts.size()) > r.max_prompts)
      texts.resize(r.max_prompts);
    tmpl = ChatTemplate::from_gguf(model.file());
    add_group(0, texts, *tmpl);
    out.source = "prompt-set:" + *r.prompt_set;
  }
  if (!r.corpus.empty()) {
    const std::string text = read_corpus(r.corpus);
    corpus_tokens = tokenizer.encode(text, false, false);
    // v2: the traces keep the text's own next tokens (earlier corpus traces lack them).
    parts.push_back({model_key + "corpus-v2:" + sha256_hex(text), 0, 0, true,
                     static_cast<int64_t>(corpus_tokens.size())});
  }

  const auto start = std::chrono::steady_clock::now();
  int64_t total = 0, before = 0;  // positions of every part, and of the parts done
  const int64_t write_positions =
      r.prompt_set ? static_cast<int64_t>(r.self_prompts) * kWrittenTurnTokens : 0;
  for (const Part& part : parts) total += part.tokens;
  total += write_positions +
           (r.prompt_set ? static_cast<int64_t>(r.self_prompts) * r.continuation * (1 + r.samples)
                         : 0);  // the written prompts' parts, at most
  HeadTrainingProgress p;
  p.phase = "tracing";
  bool cancelled = false, all_cached = true;
  const auto report = [&](int64_t done) {
    done += before;
    const double s = seconds_since(start);
    p.step = static_cast<int32_t>(done);
    p.steps = static_cast<int32_t>(total);
    p.fraction = total > 0 ? kTracingShare * static_cast<double>(done) / total : 0.0;
    p.eta_s = done > 0 ? s * static_cast<double>(total - done) / static_cast<double>(done) : 0.0;
    cancelled = cancelled || !progress(p);
    return !cancelled;
  };
  if (write_positions > 0) {
    const std::vector<std::string> written = written_prompts(
        model, tokenizer, *tmpl, texts, r, sha, [&](int64_t done, int64_t) { return report(done); },
        p.message, all_cached);
    if (!p.message.empty()) {
      report(write_positions);
      p.message.clear();
    }
    if (cancelled) throw Error("cancelled while writing prompts; no head was saved");
    out.written_prompts = static_cast<int64_t>(written.size());
    // The written prompts' parts go after the set's own, before the corpus.
    std::vector<Part> corpus_part;
    if (!parts.empty() && parts.back().corpus) {
      corpus_part.push_back(parts.back());
      parts.pop_back();
    }
    if (!written.empty()) add_group(1, written, *tmpl);
    parts.insert(parts.end(), corpus_part.begin(), corpus_part.end());
    before = write_positions;
    total = write_positions;
    for (const Part& part : parts) total += part.tokens;
    out.source += " (+" + std::to_string(written.size()) + " written)";
  }
  if (r.samples > 0) out.source += " (+" + std::to_string(r.samples) + " sampled)";
  if (!r.corpus.empty()) out.source += out.source.empty() ? "corpus" : "+corpus";
  out.set.seq_begin = {0};
  for (const Part& part : parts) {
    const fs::path file =
        user_data_dir() / "traces" / (sha256_hex(part.key).substr(0, 24) + ".trace");
    std::optional<TraceSet> set;
    if (!r.no_cache && fs::exists(file)) {
      try {
        set = TraceSet::load(file);
        p.message = "traces: " + std::to_string(set->n_pos()) + " positions from the cache (" +
                    file.string() + ")";
      } catch (const Error& e) {
        p.message =
            std::string("traces: the cached file is unusable (") + e.what() + "); recording again";
      }
      report(set ? part.tokens : 0);
      p.message.clear();
      if (cancelled) throw Error("cancelled while tracing; no head was saved");
    }
    if (!set) {
      all_cached = false;
      const auto on_trace = [&](int64_t done, int64_t) { return report(done); };
      if (part.corpus) {
        set = record_corpus(model, corpus_tokens, 256, options, on_trace);
      } else {
        const auto& group = prompts[part.group];
        TraceOptions o = options;
        if (part.sampled_pass > 0) {
          o.sampling = SamplingParams{};
          o.sampling.temperature = r.sample_temperature;
          o.sampling.seed = r.seed + static_cast<uint64_t>(part.sampled_pass) * group.size();
        }
        set = record_continuations(
            model, group, o, [&](TokenId t) { return tokenizer.is_end_of_generation(t); },
            on_trace);
      }
      if (cancelled) throw Error("cancelled while tracing; no head was saved");
      create_folders_for(file);
      set->save(file);
    }
    out.set.append(*set);
    before += part.tokens;
  }
  out.cached = all_cached;
  out.seconds = seconds_since(start);
  return out;
}

}  // namespace tokenfab
