// The History page (ui/views/history_page.h) on the offscreen platform: its run model passes
// QAbstractItemModelTester; runs added through RunStore appear after refresh(), two selected runs
// fill the side-by-side comparison (keys of both summaries, B/A ratio for numbers), deleting
// removes a row, draft-head evaluations appear as kind "heads-eval" and are not deleted here, and a
// database that cannot be opened is reported in the page. TOKENFAB_HOME points at a temporary
// directory before anything opens the database.

#include <QAbstractItemModelTester>
#include <QtTest>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/storage/runs.h"
#include "ui/models/run_table_model.h"
#include "ui/views/history_page.h"

using namespace tokenfab;
using namespace tokenfab::ui;

namespace {

RunRecord make_run(const std::string& title, int64_t created_at_ms, double tok_s,
                   const std::string& extra_summary) {
  RunRecord r;
  r.kind = "serve-bench";
  r.title = title;
  r.model = "SmolLM2-135M-Instruct-Q4_1.gguf";
  r.config_json = R"({"requests":36,"devices":"cpu:0"})";
  r.summary_json =
      "{\"throughput_tok_s\":" + std::to_string(tok_s) +
      ",\"ttft_ms\":{\"p50\":40.0,\"p99\":90.0},\"itl_ms\":{\"p50\":8.0,\"p99\":20.0}" +
      extra_summary + "}";
  r.created_at_ms = created_at_ms;
  return r;
}

// Every leaf of the comparison tree: "group/key" → {A, B, B/A}.
std::map<QString, QStringList> comparison_rows(const QTreeWidget* tree) {
  std::map<QString, QStringList> rows;
  for (int g = 0; g < tree->topLevelItemCount(); ++g) {
    const QTreeWidgetItem* group = tree->topLevelItem(g);
    for (int i = 0; i < group->childCount(); ++i) {
      const QTreeWidgetItem* item = group->child(i);
      rows[group->text(0) + "/" + item->text(0)] = {item->text(1), item->text(2), item->text(3)};
    }
  }
  return rows;
}

}  // namespace

class GuiHistoryTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void model_passes_the_tester();
  void flatten_names_nested_keys();
  void lists_compares_and_deletes_runs();
  void evaluations_are_listed_and_filtered_but_not_deleted();
  void a_bad_database_is_reported_in_the_page();

 private:
  QTemporaryDir home_;
};

void GuiHistoryTest::initTestCase() {
  QVERIFY(home_.isValid());
  qputenv("TOKENFAB_HOME", home_.path().toUtf8());
}

void GuiHistoryTest::model_passes_the_tester() {
  RunTableModel model;
  QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
  model.set_runs({make_run("a", 1000, 100.0, ""), make_run("b", 2000, 150.0, "")});
  QCOMPARE(model.rowCount(), 2);
  QCOMPARE(model.columnCount(), int(RunTableModel::kColumnCount));
  QCOMPARE(model.index(1, RunTableModel::kTokPerS).data().toString(), QString("150.0"));
  QCOMPARE(model.index(0, RunTableModel::kItlP99).data(RunTableModel::kValueRole).toDouble(), 20.0);
  QVERIFY(!model.index(0, RunTableModel::kSpeedup).data(RunTableModel::kValueRole).isValid());
  QCOMPARE(model.index(0, RunTableModel::kTitle).data().toString(), QString("a"));
  model.set_runs({});
  QCOMPARE(model.rowCount(), 0);
}

void GuiHistoryTest::flatten_names_nested_keys() {
  const auto pairs = flatten_json(R"({"b":1,"a":{"p50":2.5,"name":"x"},"list":[true,null]})");
  QCOMPARE(pairs.size(), size_t(5));
  QCOMPARE(pairs[0].first, QString("b"));  // document order
  QCOMPARE(pairs[1].first, QString("a.p50"));
  QCOMPARE(pairs[1].second.toDouble(), 2.5);
  QCOMPARE(pairs[2].second.toString(), QString("x"));
  QCOMPARE(pairs[3].first, QString("list.0"));
  QVERIFY(!pairs[4].second.isValid());
  QVERIFY(flatten_json("[1,2]").empty());
  QVERIFY(flatten_json("{not json").empty());
}

void GuiHistoryTest::lists_compares_and_deletes_runs() {
  int64_t older = 0, newer = 0;
  {
    const auto db = Database::open_default();
    RunStore store(*db);
    older = store.add(make_run("older", 1'700'000'000'000, 100.0, R"(,"only_in_a":1)"));
    newer = store.add(make_run("newer", 1'700'000'100'000, 150.0, R"(,"only_in_b":"yes")"));
  }
  HistoryPage page;
  QCOMPARE(page.title(), QString("History"));
  page.resize(1000, 700);
  page.show();  // showEvent refreshes
  QCOMPARE(page.model()->rowCount(), 2);
  QVERIFY(page.error().isEmpty());
  QCOMPARE(page.model()->run(0).id, newer);  // newest first
  QCOMPARE(page.model()->run(1).id, older);

  page.select_rows({0, 1});
  const auto rows = comparison_rows(page.comparison());
  // Run A is the older run, B the newer; ratios are B/A.
  QVERIFY(rows.count("summary/throughput_tok_s"));
  QCOMPARE(rows.at("summary/throughput_tok_s").at(0), QString("100"));
  QCOMPARE(rows.at("summary/throughput_tok_s").at(1), QString("150"));
  QCOMPARE(rows.at("summary/throughput_tok_s").at(2), QString("1.500"));
  QCOMPARE(rows.at("summary/itl_ms.p99").at(2), QString("1.000"));
  QCOMPARE(rows.at("summary/only_in_a").at(1), QString("—"));
  QCOMPARE(rows.at("summary/only_in_b").at(0), QString("—"));
  QCOMPARE(rows.at("summary/only_in_b").at(1), QString("yes"));
  QVERIFY(rows.at("summary/only_in_b").at(2).isEmpty());  // no ratio for text
  QCOMPARE(rows.at("config/requests").at(2), QString("1.000"));
  QCOMPARE(rows.at("run/title").at(0), QString("older"));
  QVERIFY(page.comparison()->headerItem()->text(1).startsWith("A: serve-bench"));
  QCOMPARE(page.comparison()->headerItem()->text(3), QString("B/A"));

  // One row selected: no comparison; delete removes it from the table and the database.
  page.select_rows({0});
  QVERIFY(!comparison_rows(page.comparison()).count("summary/throughput_tok_s"));
  QCOMPARE(page.delete_selected(), 1);
  QCOMPARE(page.model()->rowCount(), 1);
  QCOMPARE(page.model()->run(0).id, older);
  const auto db = Database::open_default();
  QVERIFY(!RunStore(*db).get(newer).has_value());
  RunStore(*db).remove(older);
}

void GuiHistoryTest::evaluations_are_listed_and_filtered_but_not_deleted() {
  {
    const auto db = Database::open_default();
    Registry registry(*db);
    HeadRecord head;
    head.name = "history-head";
    head.domain = "code";
    head.type = "medusa";
    head.base_model_sha256 = std::string(64, 'a');
    head.file = "/nonexistent/history-head.gguf";
    const int64_t head_id = registry.add_head(head);
    EvaluationRecord e;
    e.head_id = head_id;
    e.domain = "code";
    e.spec = "chain";
    e.accept_per_step = 2.5;
    e.per_position = {0.75, 0.5};
    e.decode_tok_s = 90.0;
    e.baseline_decode_tok_s = 60.0;
    e.target_quant = "native";
    e.prompts = 8;
    e.tokens = 512;
    registry.add_evaluation(e);
    // The quantization study: the same head on a re-quantized target, beside the model's own.
    e.target_quant = "q4_0";
    e.accept_per_step = 2.0;
    e.native_decode_tok_s = 75.0;
    e.created_unix = 1;  // older: listed after the native evaluation
    registry.add_evaluation(e);
    RunStore(*db).add(make_run("bench", 0, 120.0, ""));
  }
  HistoryPage page;
  page.refresh();
  QCOMPARE(page.model()->rowCount(), 3);
  page.set_kind_filter(HistoryPage::kHeadsEvalKind);
  QCOMPARE(page.model()->rowCount(), 2);
  QCOMPARE(page.model()->run(1).title, std::string("history-head on code (chain, target q4_0)"));
  const auto study = nlohmann::json::parse(page.model()->run(1).summary_json);
  QCOMPARE(study["native_decode_tok_s"].get<double>(), 75.0);
  QCOMPARE(study["net_speedup_vs_native"].get<double>(), 1.2);
  QVERIFY(!nlohmann::json::parse(page.model()->run(0).summary_json).contains("native_decode_tok_s"));
  QCOMPARE(page.model()->run(0).kind, std::string(HistoryPage::kHeadsEvalKind));
  QCOMPARE(page.model()->index(0, RunTableModel::kAcceptPerStep).data().toString(),
           QString("2.50"));
  QCOMPARE(
      page.model()->index(0, RunTableModel::kSpeedup).data(RunTableModel::kValueRole).toDouble(),
      1.5);
  page.select_rows({0});
  QCOMPARE(page.delete_selected(), 0);  // evaluations go with their head
  QCOMPARE(page.model()->rowCount(), 2);
  page.set_kind_filter("serve-bench");
  QCOMPARE(page.model()->rowCount(), 1);
  QCOMPARE(page.model()->run(0).title, std::string("bench"));
  page.set_kind_filter({});
  QCOMPARE(page.model()->rowCount(), 3);
}

void GuiHistoryTest::a_bad_database_is_reported_in_the_page() {
  QTemporaryDir bad_home;
  QVERIFY(bad_home.isValid());
  std::ofstream(std::filesystem::path(bad_home.path().toStdString()) / "tokenfab.db")
      << "this is not a SQLite database, just text that is long enough to have a header";
  qputenv("TOKENFAB_HOME", bad_home.path().toUtf8());
  HistoryPage page;
  page.refresh();
  qputenv("TOKENFAB_HOME", home_.path().toUtf8());
  QVERIFY(!page.error().isEmpty());
  QCOMPARE(page.model()->rowCount(), 0);
  QVERIFY(page.error().contains("tokenfab.db"));
}

QTEST_MAIN(GuiHistoryTest)
#include "test_gui_history.moc"
