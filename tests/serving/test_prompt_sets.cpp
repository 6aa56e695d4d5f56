// Prompt sets (core/serving/prompt_sets.h): the parser's format rules, the sets compiled into the
// binary from resources/prompts/ meeting the sizes serve-bench relies on (short chat turns of
// 8–60 words, long documents of 700–1200 words), and the draft-head domain sets of
// resources/domains/ meeting the sizes their brief sets (≥128 train and ≥32 validation entries of
// 8–80 words, 5–80 for Korean; held-out validation entries that never appear in train).

#include <QtTest>
#include <algorithm>
#include <set>
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

// True when `text` (UTF-8) holds a Hangul syllable (U+AC00..U+D7A3).
bool contains_hangul(const std::string& text) {
  for (size_t i = 0; i + 2 < text.size(); ++i) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    if ((b0 & 0xF0) != 0xE0) continue;  // not the lead byte of a 3-byte sequence
    const char32_t cp = (char32_t{b0} & 0x0F) << 12 |
                        (char32_t{static_cast<unsigned char>(text[i + 1])} & 0x3F) << 6 |
                        (char32_t{static_cast<unsigned char>(text[i + 2])} & 0x3F);
    if (cp >= 0xAC00 && cp <= 0xD7A3) return true;
  }
  return false;
}

const std::vector<std::string> kExpectedDomains = {"code", "korean", "math", "prose", "structured"};

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

  void builtin_domains_are_the_five_sorted() { QCOMPARE(builtin_domains(), kExpectedDomains); }

  void domain_splits_are_builtin_sets_under_domain_names() {
    QCOMPARE(&domain_prompt_set("code", "train"), &builtin_prompt_set("domains/code/train"));
    QCOMPARE(domain_prompt_set("math", "validation").name, std::string("domains/math/validation"));
  }

  void domain_splits_have_enough_entries_of_bounded_length() {
    for (const std::string& domain : kExpectedDomains) {
      const int min_words = domain == "korean" ? 5 : 8;  // Korean words are longer (particles)
      const PromptSet& train = domain_prompt_set(domain, "train");
      const PromptSet& validation = domain_prompt_set(domain, "validation");
      QVERIFY2(train.entries.size() >= 128, (domain + " train").c_str());
      QVERIFY2(validation.entries.size() >= 32, (domain + " validation").c_str());
      verify_word_counts(train, min_words, 80);
      verify_word_counts(validation, min_words, 80);
    }
  }

  void domain_entries_are_distinct_and_validation_is_held_out() {
    for (const std::string& domain : kExpectedDomains) {
      const PromptSet& train = domain_prompt_set(domain, "train");
      const PromptSet& validation = domain_prompt_set(domain, "validation");
      const std::set<std::string> train_entries(train.entries.begin(), train.entries.end());
      const std::set<std::string> validation_entries(validation.entries.begin(),
                                                     validation.entries.end());
      QVERIFY2(train_entries.size() == train.entries.size(), (domain + " train").c_str());
      QVERIFY2(validation_entries.size() == validation.entries.size(),
               (domain + " validation").c_str());
      for (const std::string& entry : validation.entries) {
        QVERIFY2(!train_entries.contains(entry), (domain + ": " + entry.substr(0, 60)).c_str());
      }
    }
  }

  void korean_entries_are_in_hangul() {
    for (const char* split : {"train", "validation"}) {
      for (const std::string& entry : domain_prompt_set("korean", split).entries) {
        QVERIFY2(contains_hangul(entry), entry.substr(0, 60).c_str());
      }
    }
  }

  void unknown_domain_or_split_throws_listing_known_ones() {
    verify_throws([] { domain_prompt_set("no_such_domain", "train"); },
                  {"no_such_domain", "train", "code", "korean", "structured", "validation"});
    verify_throws([] { domain_prompt_set("code", "test"); }, {"code", "test", "validation"});
  }
};

QTEST_APPLESS_MAIN(TestPromptSets)
#include "test_prompt_sets.moc"
