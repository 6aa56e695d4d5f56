// DomainClassifier (core/speculative/domain_classifier.h), the first step of `--head auto`:
// fitted on the built-in domains' train prompts, it must name the domain of held-out validation
// prompts; and it refuses data it cannot fit.

#include <QtTest>
#include <filesystem>

#include "core/common/error.h"
#include "core/model/llama_model.h"
#include "core/model/model_files.h"
#include "core/serving/prompt_sets.h"
#include "core/speculative/domain_classifier.h"
#include "core/tokenizer/tokenizer.h"

using namespace tokenfab;

class DomainClassifierTest : public QObject {
  Q_OBJECT

 private slots:
  void classifies_validation_prompts();
  void refuses_what_it_cannot_fit();
};

void DomainClassifierTest::classifies_validation_prompts() {
  const auto path = default_model_path();
  if (!std::filesystem::exists(path))
    QFAIL(qPrintable(QString("the default model is missing (%1); run `tokenfab-cli fetch`")
                         .arg(QString::fromStdString(path.string()))));
  const auto model = LlamaModel::load(path);
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  std::vector<DomainClassifier::Example> train;
  for (const std::string& d : builtin_domains())
    for (const std::string& text : domain_prompt_set(d, "train").entries)
      train.push_back({d, tokenizer.encode(text, false, false)});
  const DomainClassifier classifier = DomainClassifier::fit(train);
  QCOMPARE(classifier.domains().size(), builtin_domains().size());
  // Each domain: at least 80% of its validation prompts recognised (the test prints the rates).
  for (const std::string& d : builtin_domains()) {
    const auto& entries = domain_prompt_set(d, "validation").entries;
    int right = 0;
    for (const std::string& text : entries)
      right += classifier.classify(tokenizer.encode(text, false, false)).domain == d;
    const double rate = static_cast<double>(right) / static_cast<double>(entries.size());
    qInfo("%s: %d of %zu validation prompts (%.0f%%)", d.c_str(), right, entries.size(),
          100 * rate);
    QVERIFY2(rate >= 0.8, d.c_str());
  }
}

void DomainClassifierTest::refuses_what_it_cannot_fit() {
  const std::vector<DomainClassifier::Example> one = {{"code", {1, 2, 3}}};
  QVERIFY_THROWS_EXCEPTION(Error, DomainClassifier::fit(one));
  const std::vector<DomainClassifier::Example> two = {{"code", {1, 2, 3}}, {"prose", {4, 5, 5}}};
  const DomainClassifier c = DomainClassifier::fit(two);
  QCOMPARE(c.classify(std::vector<TokenId>{1, 2, 9}).domain, std::string("code"));
  QCOMPARE(c.classify(std::vector<TokenId>{5, 5}).domain, std::string("prose"));
  QCOMPARE(c.classify(std::vector<TokenId>{99}).margin, 0.0);  // nothing known
}

QTEST_APPLESS_MAIN(DomainClassifierTest)
#include "test_domain_classifier.moc"
