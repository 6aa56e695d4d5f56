#pragma once
// EngineBridge: the GUI's one handle on the engine (DESIGN.md: ui talks to core only through
// core/serving/engine.h and metric snapshots). It lives on the GUI thread and owns the model,
// its tokenizer and the Engine.
//
// Ownership: the model and its tokenizer are shared. Work that runs on threads of its own and may
// outlive a reload (training and evaluating heads, measuring the machine's limits) holds them
// through shared_model() / shared_tokenizer(): load() drops the bridge's handles, and the old
// model is freed when the last such job ends.
//
// Threads: the model loads on a background thread (load() returns at once; loaded() or failed()
// follows). Token events arrive on engine worker threads; the bridge only queues them there, and
// a GUI-thread timer drains the queue ~30 times a second, coalescing each request's tokens into
// one StreamUpdate (detokenized incrementally on the GUI thread). Another timer takes
// Engine::snapshot() ~10 times a second and emits it. Nothing here ever blocks the GUI thread on
// the engine: submit() and cancel() only enqueue.

#include <QObject>
#include <QString>
#include <QTimer>
#include <QVector>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/model/llama_model.h"
#include "core/serving/engine.h"
#include "core/tokenizer/tokenizer.h"

namespace tokenfab::ui {

// What one request produced since the last update (coalesced token events).
// `tokens` are every token the engine emitted (end-of-generation tokens included, so their count
// matches RequestInfo::output); `text` leaves end-of-generation tokens out.
struct StreamUpdate {
  RequestId id = 0;
  QString text;                                  // newly completed text (UTF-8-safe, incremental)
  std::vector<TokenId> tokens;                   // the tokens behind it
  std::vector<bool> drafted;                     // per token: accepted from the draft head
  RequestState state = RequestState::kDecoding;  // latest
  QString device;
  QString error;  // kFailed
  bool ended() const { return request_ended(state); }
};

using SnapshotPtr = std::shared_ptr<const EngineSnapshot>;

class EngineBridge : public QObject {
  Q_OBJECT

 public:
  static constexpr int kStreamHz = 30;
  static constexpr int kSnapshotHz = 10;

  explicit EngineBridge(QObject* parent = nullptr);
  ~EngineBridge() override;  // cancels every request and stops the engine

  // Loads `model_path` (empty: the embedded default) and starts an engine with `config` on a
  // background thread; emits loaded() or failed(message). Cancels and replaces a running engine.
  void load(const QString& model_path, const EngineConfig& config);
  // Restarts the engine with another configuration (devices, roles, pools) keeping the model;
  // requests in flight are cancelled. Throws Error for a bad configuration (the old engine stays).
  void reconfigure(const EngineConfig& config);

  bool ready() const { return engine_ != nullptr; }
  bool loading() const { return loading_; }
  // Abandons the load in progress: its result, when the loader thread finishes, is dropped (the
  // thread itself cannot be interrupted mid-read), and loadCancelled() follows at once. A load()
  // after it starts at once, beside the abandoned reader, without waiting for it.
  void cancel_load();
  const LlamaModel* model() const { return model_.get(); }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  // The same, owned jointly: for work on other threads that must outlive a reload.
  std::shared_ptr<const LlamaModel> shared_model() const { return model_; }
  std::shared_ptr<const Tokenizer> shared_tokenizer() const { return tokenizer_; }
  const EngineConfig& config() const { return config_; }
  Engine* engine() { return engine_.get(); }  // nullptr until loaded

  // Thread-safe enqueue into the engine; throws Error for a bad request or when not loaded.
  RequestId submit(GenerationRequest request);
  void cancel(RequestId id);
  SnapshotPtr last_snapshot() const { return last_snapshot_; }

 signals:
  void loadStarted(const QString& model_path);  // "" : the embedded default
  void loaded();
  void failed(const QString& message);
  void loadCancelled();  // cancel_load(): no model is loaded
  // An engine started (after a load or a reconfiguration; engine() is it), and one is about to be
  // destroyed (its requests not yet cancelled). Emitted synchronously on the GUI thread.
  void engineStarted();
  void engineStopping();
  void streamed(const QVector<tokenfab::ui::StreamUpdate>& updates);  // ~30 Hz, GUI thread
  void snapshotTaken(const tokenfab::ui::SnapshotPtr& snapshot);      // ~10 Hz, GUI thread

 private:
  struct LoadResult;  // what the loader thread hands to the GUI thread

  void on_load_finished(const std::shared_ptr<LoadResult>& result, uint64_t generation);
  void start_engine(std::unique_ptr<Engine> engine);
  // Cancels every request of the running engine, destroys it and emits its last events.
  void stop_engine();
  void drain_events();  // stream timer: queued TokenEvents → one StreamUpdate per request
  void take_snapshot();
  void join_loaders();  // every loader thread, the abandoned ones included

  std::shared_ptr<const LlamaModel> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;  // destroyed before model_ (it reads the weights)
  EngineConfig config_;
  SnapshotPtr last_snapshot_;

  // Loader threads by load generation: the current load's and those of cancelled or superseded
  // loads still reading (each is joined when its result arrives).
  std::map<uint64_t, std::thread> loaders_;
  uint64_t load_generation_ = 0;  // a load's result is applied only if no later load() began
  bool loading_ = false;          // a load() whose result is still awaited

  std::mutex events_mutex_;         // guards events_ (filled on engine worker threads)
  std::vector<TokenEvent> events_;  // in arrival order
  std::map<RequestId, std::unique_ptr<IncrementalDetokenizer>> detokenizers_;  // GUI thread

  QTimer stream_timer_;
  QTimer snapshot_timer_;
};

}  // namespace tokenfab::ui

Q_DECLARE_METATYPE(tokenfab::ui::StreamUpdate)
Q_DECLARE_METATYPE(tokenfab::ui::SnapshotPtr)
