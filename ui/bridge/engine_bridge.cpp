#include "ui/bridge/engine_bridge.h"

#include <exception>
#include <filesystem>
#include <optional>
#include <string>

#include "core/common/error.h"
#include "core/model/model_files.h"
#include "core/model/model_library.h"
#include "core/training/head_selection.h"

namespace tokenfab::ui {

struct EngineBridge::LoadResult {
  // Member order matters: the engine reads the model's weights, so it is destroyed first.
  std::shared_ptr<const LlamaModel> model;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::unique_ptr<Engine> engine;
  EngineConfig config;
  QString error;

  // Loads the model file, its tokenizer (checked against the model's vocabulary) and an engine;
  // on failure leaves `engine` empty and says why in `error`.
  void load(const std::string& model_path, const EngineConfig& engine_config);
};

namespace {

Engine::EndOfGeneration end_of_generation(const Tokenizer* tokenizer) {
  return [tokenizer](TokenId t) { return tokenizer->is_end_of_generation(t); };
}

}  // namespace

EngineBridge::EngineBridge(QObject* parent) : QObject(parent) {
  qRegisterMetaType<StreamUpdate>();
  qRegisterMetaType<QVector<StreamUpdate>>();
  qRegisterMetaType<SnapshotPtr>();
  stream_timer_.setInterval(1000 / kStreamHz);
  snapshot_timer_.setInterval(1000 / kSnapshotHz);
  connect(&stream_timer_, &QTimer::timeout, this, &EngineBridge::drain_events);
  connect(&snapshot_timer_, &QTimer::timeout, this, &EngineBridge::take_snapshot);
}

EngineBridge::~EngineBridge() {
  stream_timer_.stop();
  snapshot_timer_.stop();
  if (engine_) {
    for (const RequestInfo& r : engine_->snapshot().requests) engine_->cancel(r.id);
    engine_.reset();  // joins its workers; no callback runs after this
  }
  join_loaders();  // a result they post is dropped with this object's pending events
}

void EngineBridge::join_loaders() {
  for (auto& [generation, loader] : loaders_)
    if (loader.joinable()) loader.join();
  loaders_.clear();
}

void EngineBridge::load(const QString& model_path, const EngineConfig& config) {
  stop_engine();
  last_snapshot_.reset();
  // Only the bridge's handles: a training, evaluation or measurement still running keeps its own,
  // and the old model is freed when it ends.
  model_.reset();
  tokenizer_.reset();
  const uint64_t generation = ++load_generation_;
  loading_ = true;
  emit loadStarted(model_path);
  loaders_[generation] = std::thread([this, path = model_path.toStdString(), config, generation] {
    auto result = std::make_shared<LoadResult>();
    result->load(path, config);
    QMetaObject::invokeMethod(
        this, [this, result, generation] { on_load_finished(result, generation); },
        Qt::QueuedConnection);
  });
}

void EngineBridge::LoadResult::load(const std::string& model_path,
                                    const EngineConfig& engine_config) {
  LoadResult& out = *this;
  try {
    std::optional<std::string> requested;
    if (!model_path.empty()) requested = model_path;
    const std::filesystem::path path = resolve_model_path(requested);
    check_fits(path, 0);  // refused with the numbers before anything is allocated
    out.model = LlamaModel::load(path);
    out.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::from_gguf(out.model->file()));
    if (out.tokenizer->n_vocab() > out.model->hparams().n_vocab)
      throw Error(out.model->file().name() + ": the tokenizer has " +
                  std::to_string(out.tokenizer->n_vocab()) + " tokens but token_embd.weight only " +
                  std::to_string(out.model->hparams().n_vocab) + " rows");
    out.engine =
        std::make_unique<Engine>(*out.model, engine_config, end_of_generation(out.tokenizer.get()));
    out.config = engine_config;
    // Draft heads are matched to the model by its file's SHA-256: computed here, off the GUI
    // thread, once per process (the chat's head picker and the heads page then find it cached).
    model_sha256(*out.model);
  } catch (const std::exception& e) {
    out.engine.reset();
    out.error = QString::fromStdString(e.what());
  }
}

void EngineBridge::on_load_finished(const std::shared_ptr<LoadResult>& result,
                                    uint64_t generation) {
  if (const auto it = loaders_.find(generation); it != loaders_.end()) {
    it->second.join();  // it has posted this result: its last act
    loaders_.erase(it);
  }
  if (generation != load_generation_) return;  // superseded by a later load() or cancelled
  loading_ = false;
  if (!result->engine) {
    emit failed(result->error);
    return;
  }
  model_ = std::move(result->model);
  tokenizer_ = std::move(result->tokenizer);
  config_ = result->config;
  start_engine(std::move(result->engine));
  emit loaded();
}

void EngineBridge::cancel_load() {
  if (!loading_) return;
  ++load_generation_;  // the loader's result will not match
  loading_ = false;
  emit loadCancelled();
}

void EngineBridge::start_engine(std::unique_ptr<Engine> engine) {
  engine_ = std::move(engine);
  engine_->subscribe([this](const TokenEvent& event) {
    std::lock_guard lock(events_mutex_);
    events_.push_back(event);
  });
  stream_timer_.start();
  snapshot_timer_.start();
  take_snapshot();
  emit engineStarted();
}

void EngineBridge::stop_engine() {
  if (!engine_) return;
  emit engineStopping();
  stream_timer_.stop();
  snapshot_timer_.stop();
  for (const RequestInfo& r : engine_->snapshot().requests) engine_->cancel(r.id);
  engine_.reset();
  drain_events();  // the cancelled requests' last events; ids restart with the next engine
  detokenizers_.clear();
}

void EngineBridge::reconfigure(const EngineConfig& config) {
  if (!model_) throw Error("no model is loaded yet");
  // Built first: a bad configuration throws here and the running engine stays.
  auto engine = std::make_unique<Engine>(*model_, config, end_of_generation(tokenizer_.get()));
  stop_engine();
  config_ = config;
  start_engine(std::move(engine));
}

RequestId EngineBridge::submit(GenerationRequest request) {
  if (!engine_) throw Error("the engine is not loaded yet");
  return engine_->submit(std::move(request));
}

void EngineBridge::cancel(RequestId id) {
  if (engine_) engine_->cancel(id);
}

void EngineBridge::drain_events() {
  std::vector<TokenEvent> events;
  {
    std::lock_guard lock(events_mutex_);
    events.swap(events_);
  }
  if (events.empty()) return;
  QVector<StreamUpdate> updates;
  std::map<RequestId, qsizetype> index;  // request → its update in `updates`
  for (const TokenEvent& e : events) {
    auto [it, inserted] = index.try_emplace(e.id, updates.size());
    if (inserted) {
      updates.push_back(StreamUpdate{});
      updates.back().id = e.id;
    }
    StreamUpdate& u = updates[it->second];
    auto& detok = detokenizers_[e.id];
    if (!detok && tokenizer_) detok = std::make_unique<IncrementalDetokenizer>(*tokenizer_);
    std::string text;
    for (size_t i = 0; i < e.tokens.size(); ++i) {
      const TokenId t = e.tokens[i];
      u.tokens.push_back(t);
      u.drafted.push_back(i < e.drafted.size() && e.drafted[i]);
      if (detok && !tokenizer_->is_end_of_generation(t)) text += detok->push(t);
    }
    u.state = e.state;
    u.device = QString::fromStdString(e.device);
    if (!e.error.empty()) u.error = QString::fromStdString(e.error);
    if (request_ended(e.state)) {
      if (detok) text += detok->flush();
      detokenizers_.erase(e.id);
    }
    u.text += QString::fromStdString(text);
  }
  emit streamed(updates);
}

void EngineBridge::take_snapshot() {
  if (!engine_) return;
  last_snapshot_ = std::make_shared<const EngineSnapshot>(engine_->snapshot());
  emit snapshotTaken(last_snapshot_);
}

}  // namespace tokenfab::ui
