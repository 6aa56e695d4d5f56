// Prompt sets (core/serving/prompt_sets.h): the parser's format rules, and the sets compiled into
// the binary from resources/prompts/ meeting the sizes serve-bench relies on (short chat turns of
// 8–60 words, long documents of 700–1200 words).

#include <QtTest>
#include <algorithm>
#include <sstream>
#include <string>

#include "core/common/error.h"
#include "core/serving/prompt_sets.h"

using namespace tokenfab;

namespace {

int word_count(const std::string& text) {
  std::istringstream in(text);
  int n = 0;
  for (std::string word; in >> word;) ++n;
  return n;
}

// Runs `f`, which must throw Error whose message contains every one of `needles`.
template <typename F>
void verify_throws(F f, std::initializer_list<const char*> needles) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* needle : needles) {
      QVERIFY2(message.find(needle) != std::string::npos, message.c_str());
    }
    return;
  }
  QFAIL("expected tokenfab::Error");
}

void verify_word_counts(const PromptSet& set, int min_words, int max_words) {
  for (size_t i = 0; i < set.entries.size(); ++i) {
    const int n = word_count(set.entries[i]);
    const std::string where = set.name + " entry " + std::to_string(i) + " has " +
                              std::to_string(n) + " words: " + set.entries[i].substr(0, 60);
    QVERIFY2(n >= min_words && n <= max_words, where.c_str());
  }
}

}  // namespace

class TestPromptSets : public QObject {
  Q_OBJECT

 private slots:
  void parses_entries_between_separators() {
    const PromptSet set = parse_prompt_set("s", "first entry\n%%\nsecond\nentry\n%%\nthird\n");
    QCOMPARE(set.name, std::string("s"));
    QCOMPARE(set.entries.size(), size_t{3});
    QCOMPARE(set.entries[0], std::string("first entry"));
    QCOMPARE(set.entries[1], std::string("second\nentry"));
    QCOMPARE(set.entries[2], std::string("third"));
  }

  void skips_leading_comment_lines_only() {
    const PromptSet set =
        parse_prompt_set("s", "# a header\n#another\n\nbody line\n# not a comment here\n%%\nx");
    QCOMPARE(set.entries.size(), size_t{2});
    QCOMPARE(set.entries[0], std::string("body line\n# not a comment here"));
    QCOMPARE(set.entries[1], std::string("x"));
  }

  void trims_blank_lines_and_keeps_inner_ones() {
    const PromptSet set = parse_prompt_set("s", "\n\n  \npara one\n\npara two\n \t\n\n%%\n\nb\n\n");
    QCOMPARE(set.entries.size(), size_t{2});
    QCOMPARE(set.entries[0], std::string("para one\n\npara two"));
    QCOMPARE(set.entries[1], std::string("b"));
  }

  void ignores_empty_entries() {
    const PromptSet set = parse_prompt_set("s", "%%\n%%\n\n%%\na\n%%\n  \n%%\nb\n%%\n");
    QCOMPARE(set.entries.size(), size_t{2});
    QCOMPARE(set.entries[0], std::string("a"));
    QCOMPARE(set.entries[1], std::string("b"));
  }

  void separator_must_be_the_whole_line() {
    const PromptSet set = parse_prompt_set("s", "a %%\n %%\n%%%\nb");
    QCOMPARE(set.entries.size(), size_t{1});
    QCOMPARE(set.entries[0], std::string("a %%\n %%\n%%%\nb"));
  }

  void accepts_crlf_and_bom() {
    const PromptSet set =
        parse_prompt_set("s", "\xEF\xBB\xBF# header\r\n\r\none\r\ntwo\r\n%%\r\nthree\r\n");
    QCOMPARE(set.entries.size(), size_t{2});
    QCOMPARE(set.entries[0], std::string("one\ntwo"));
    QCOMPARE(set.entries[1], std::string("three"));
  }

  void no_entries_is_an_error_naming_the_set() {
    verify_throws([] { parse_prompt_set("my_set", ""); }, {"my_set", "no entries"});
    verify_throws([] { parse_prompt_set("my_set", "# only a comment\n\n"); },
                  {"my_set", "no entries"});
    verify_throws([] { parse_prompt_set("my_set", "%%\n \n%%\r\n%%"); }, {"my_set", "no entries"});
  }

  void builtin_names_are_listed() {
    const std::vector<std::string> names = builtin_prompt_set_names();
    QVERIFY(std::find(names.begin(), names.end(), "chat_turns") != names.end());
    QVERIFY(std::find(names.begin(), names.end(), "documents") != names.end());
    QVERIFY(std::is_sorted(names.begin(), names.end()));
  }

  void builtin_chat_turns_are_short() {
    const PromptSet& set = builtin_prompt_set("chat_turns");
    QCOMPARE(set.name, std::string("chat_turns"));
    QVERIFY2(set.entries.size() >= 80, std::to_string(set.entries.size()).c_str());
    verify_word_counts(set, 8, 60);
  }

  void builtin_documents_are_long() {
    const PromptSet& set = builtin_prompt_set("documents");
    QCOMPARE(set.name, std::string("documents"));
    QVERIFY2(set.entries.size() >= 8, std::to_string(set.entries.size()).c_str());
    verify_word_counts(set, 700, 1200);
  }

  void builtin_set_is_parsed_once() {
    QCOMPARE(&builtin_prompt_set("documents"), &builtin_prompt_set("documents"));
  }

  void unknown_builtin_name_throws_listing_known_ones() {
    verify_throws([] { builtin_prompt_set("no_such_set"); },
                  {"no_such_set", "chat_turns", "documents"});
  }
};

QTEST_APPLESS_MAIN(TestPromptSets)
#include "test_prompt_sets.moc"
