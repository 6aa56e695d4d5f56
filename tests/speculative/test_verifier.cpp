// The verifier (core/speculative/verifier.h) on scripted judges, without an engine: a chain keeps
// drafts while the target accepts them, replaces the first rejected one, and adds the target's own
// token after a fully accepted chain; a tree follows the accepted child from the root; the judge is
// asked row by row in path order; draft depths, acceptance counts and the logits row of each token.

#include <QtTest>
#include <map>
#include <string>
#include <vector>

#include "core/speculative/draft_tree.h"
#include "core/speculative/verifier.h"

using namespace tokenfab;

namespace {

// The target's token at each row (what it would choose, or put in place of a rejected draft);
// a draft is accepted when it equals the target's token. Records every question in order.
struct ScriptedJudge {
  std::map<int64_t, TokenId> target;
  std::vector<std::string> asked;
  bool accept(int64_t row, TokenId draft) {
    asked.push_back("accept " + std::to_string(row) + " " + std::to_string(draft));
    return target.at(row) == draft;
  }
  TokenId rejected(int64_t row, TokenId draft) {
    asked.push_back("rejected " + std::to_string(row) + " " + std::to_string(draft));
    return target.at(row);
  }
  TokenId choose(int64_t row) {
    asked.push_back("choose " + std::to_string(row));
    return target.at(row);
  }
};

}  // namespace

class TestVerifier : public QObject {
  Q_OBJECT

 private slots:
  void chain_accepts_a_prefix_then_the_targets_token();
  void fully_accepted_chain_adds_a_bonus_token();
  void chain_without_drafts_is_a_plain_step();
  void tree_follows_the_accepted_child();
  void depth_counts_and_rows();
  void static_tree_shape();
};

void TestVerifier::chain_accepts_a_prefix_then_the_targets_token() {
  ScriptedJudge judge{{{0, 10}, {1, 11}, {2, 99}, {3, 13}}, {}};
  const std::vector<TokenId> drafts = {10, 11, 12, 13};
  const Verdict v = verify_chain(drafts, judge);
  QCOMPARE(v.tokens, (std::vector<TokenId>{10, 11, 99}));
  QCOMPARE(v.path, (std::vector<int32_t>{1, 2}));
  // Row by row, and nothing after the rejection (a sampler draws in this order).
  QCOMPARE(judge.asked, (std::vector<std::string>{"accept 0 10", "accept 1 11", "accept 2 12",
                                                  "rejected 2 12"}));
}

void TestVerifier::fully_accepted_chain_adds_a_bonus_token() {
  ScriptedJudge judge{{{0, 5}, {1, 6}, {2, 7}}, {}};
  const std::vector<TokenId> drafts = {5, 6};
  const Verdict v = verify_chain(drafts, judge);
  QCOMPARE(v.tokens, (std::vector<TokenId>{5, 6, 7}));
  QCOMPARE(v.path, (std::vector<int32_t>{1, 2}));
  QCOMPARE(judge.asked.back(), std::string("choose 2"));
}

void TestVerifier::chain_without_drafts_is_a_plain_step() {
  ScriptedJudge judge{{{0, 42}}, {}};
  const Verdict v = verify_chain(std::span<const TokenId>(), judge);
  QCOMPARE(v.tokens, (std::vector<TokenId>{42}));
  QVERIFY(v.path.empty());
}

void TestVerifier::tree_follows_the_accepted_child() {
  // Rows: 0 the last token; 1 and 2 its children (tokens 20, 21); 3 and 4 children of row 2
  // (tokens 30, 31); 5 a child of row 1. The target picks 21 at row 0, 31 at row 2, 50 at row 4.
  const std::vector<int32_t> parent = {-1, 0, 0, 2, 2, 1};
  const std::vector<TokenId> tokens = {7, 20, 21, 30, 31, 40};
  ScriptedJudge judge{{{0, 21}, {2, 31}, {4, 50}}, {}};
  const Verdict v = verify_tree(parent, tokens, judge);
  QCOMPARE(v.tokens, (std::vector<TokenId>{21, 31, 50}));
  QCOMPARE(v.path, (std::vector<int32_t>{2, 4}));
  QCOMPARE(logits_row(0, v.path), int64_t{0});
  QCOMPARE(logits_row(1, v.path), int64_t{2});
  QCOMPARE(logits_row(2, v.path), int64_t{4});
}

void TestVerifier::depth_counts_and_rows() {
  QCOMPARE(draft_depth(4, {}), 4);
  const std::vector<int32_t> parent = {-1, 0, 0, 2, 2, 1, 5};
  QCOMPARE(draft_depth(6, parent), 3);  // 0 → 1 → 5 → 6
  std::vector<int64_t> proposed, accepted;
  count_acceptance(3, 1, proposed, accepted);
  count_acceptance(2, 2, proposed, accepted);
  QCOMPARE(proposed, (std::vector<int64_t>{2, 2, 1}));
  QCOMPARE(accepted, (std::vector<int64_t>{2, 1, 0}));
  // A chain's token k came from row k.
  const std::vector<int32_t> chain_path = {1, 2, 3};
  for (size_t k = 0; k <= chain_path.size(); ++k)
    QCOMPARE(logits_row(k, chain_path), static_cast<int64_t>(k));
}

void TestVerifier::static_tree_shape() {
  const std::vector<std::vector<TokenId>> levels = {{1, 2}, {3, 4, 5}};
  std::vector<TokenId> draft;
  std::vector<int32_t> parent;
  build_draft_tree(levels, draft, parent);
  QCOMPARE(draft, (std::vector<TokenId>{1, 2, 3, 4, 5, 3, 4, 5}));
  QCOMPARE(parent, (std::vector<int32_t>{-1, -1, 0, 0, 0, 1, 1, 1}));
  draft.clear();
  parent.clear();
  build_draft_tree(levels, draft, parent, 4);  // at most 4 nodes
  QCOMPARE(draft.size(), size_t{4});
}

QTEST_GUILESS_MAIN(TestVerifier)
#include "test_verifier.moc"
