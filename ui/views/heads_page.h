#pragma once
// HeadsPage ("Draft heads"): the registry's heads as a table, a heads × domains heat map of the
// best recorded ACCEPT/STEP (the model's own weights), the selected head's evaluations by target
// weights (the quantization study: ACCEPT/STEP and tok/s on a re-quantized target against the
// model file's own speed), and the long jobs on them — train a head (core/training/
// head_training_job.h, the same job as `tokenfab-cli heads train`), evaluate a head on a domain by
// really generating (core/training/generation_eval.h, as `heads eval` does), delete, export.
//
// Threads: one background job at a time (std::thread); its progress and result reach the GUI
// thread as queued invocations on this page, progress coalesced to at most ~20 per second
// (evaluation steps and the final report always pass). Destroying the page cancels the job and
// joins it, so closing the window mid-training leaves no head file and no registry row.
//
// The dialogs (Train…, Evaluate…, Delete's confirmation, Export…) only collect input; the work is
// in public methods that tests call directly.

#include <QLabel>
#include <QPointF>
#include <QProgressBar>
#include <QPushButton>
#include <QTableWidget>
#include <atomic>
#include <functional>
#include <thread>

#include "core/training/generation_eval.h"
#include "core/training/head_training_job.h"
#include "ui/views/page.h"

class QComboBox;

namespace tokenfab::ui {

class TimeChart;

class HeadsPage : public Page {
  Q_OBJECT

 public:
  explicit HeadsPage(QWidget* parent = nullptr);
  ~HeadsPage() override;  // cancels and joins a running job

  QString title() const override { return "Draft heads"; }
  void attach(EngineBridge* bridge) override;

  // Starts training on a background thread with the bridge's model; false (and nothing started)
  // when the bridge is not ready or another job runs. trainingFinished follows.
  bool start_training(const HeadTrainingRequest& request);
  // Evaluates head `head_id` on `domain`'s validation prompts (at most `max_prompts`, each
  // `max_tokens` long, greedy) by generating with and without the head on an engine of its own
  // (the bridge's model and configuration), with the target's weights re-quantized in memory to
  // `target_quant` unless it is "native" (generation_eval.h), and records the evaluation (a chain
  // of the head's K drafts); evaluationProgress reports each prompt, evaluationFinished follows.
  // False when not ready or busy.
  bool start_evaluation(int64_t head_id, const QString& domain, int max_prompts = 8,
                        int max_tokens = 64, const QString& target_quant = "native");
  // Asks the running job to stop (it stops at its next progress report).
  void cancel_job() { cancel_.store(true); }
  bool busy() const { return busy_; }
  // Removes the head, its evaluations and its file; false when there is no such head.
  bool delete_head(int64_t head_id);
  // Validates the head's file and writes a copy to `path`; throws Error.
  void export_head(int64_t head_id, const QString& path);
  // Re-reads the registry into the table, the heat map and the default-head picker.
  void refresh();
  // The head new chat conversations start with ("none", "auto" or a head name), kept in
  // QSettings; false when the picker does not offer `choice`.
  QString default_head() const;
  bool set_default_head(const QString& choice);

  QTableWidget* heads_table() const { return heads_table_; }
  QTableWidget* matrix() const { return matrix_; }
  QTableWidget* evaluations_table() const { return evaluations_table_; }  // the selected head's
  // The training chart: while a head trains, its live curve; otherwise the selected head's
  // recorded one (its summary's evaluations: TrainingCurve), empty for a head trained before
  // curves were kept, which the title says.
  int chart_points(const QString& series) const;  // "loss", "val_loss", "accept"; -1 when unknown
  QString chart_title() const;
  double progress_fraction() const { return last_fraction_; }

 signals:
  void trainingProgress(double fraction, const QString& phase);
  void trainingFinished(bool ok, const QString& message);
  void evaluationProgress(double fraction);  // prompts done / prompts
  void evaluationFinished(bool ok, const QString& message);

 private:
  void open_train_dialog();
  void open_evaluate_dialog();
  void confirm_delete();
  void choose_export();
  int64_t selected_head_id() const;
  void begin_job(const QString& label);
  void end_job();
  // From the job thread: on the GUI thread, end the job, show `message` and emit `finished`.
  // `select_head` > 0: then select that head (a head just trained).
  void finish_job_later(bool ok, const QString& message,
                        void (HeadsPage::*finished)(bool, const QString&), int64_t select_head = 0);
  void on_training_progress(const HeadTrainingProgress& p);
  void on_evaluation_progress(const GenerationEvalProgress& p);
  // Fills the evaluations table with the selected head's evaluations (empty when none is).
  void show_evaluations();
  // Shows the selected head's recorded training curve, unless a head is training.
  void show_training_curve();
  void join_worker();
  void update_buttons();

  EngineBridge* bridge_ = nullptr;
  QTableWidget* heads_table_ = nullptr;
  QTableWidget* matrix_ = nullptr;
  QTableWidget* evaluations_table_ = nullptr;
  QPushButton *train_button_ = nullptr, *evaluate_button_ = nullptr, *delete_button_ = nullptr,
              *export_button_ = nullptr, *refresh_button_ = nullptr, *cancel_button_ = nullptr;
  QComboBox* default_head_ = nullptr;
  QProgressBar* progress_bar_ = nullptr;
  QLabel* status_label_ = nullptr;
  TimeChart* chart_ = nullptr;
  QList<QPointF> loss_points_, val_points_, accept_points_;
  double last_fraction_ = 0.0;
  bool interactive_ = false;  // the job came from a dialog: report errors in a message box

  std::thread worker_;
  std::atomic<bool> cancel_{false};
  bool busy_ = false;      // GUI thread
  bool training_ = false;  // GUI thread: the job is a training run
};

}  // namespace tokenfab::ui
