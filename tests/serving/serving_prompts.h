#pragma once
// Prompts shared by the engine and speculative-decoding suites: sixteen of varied length, from a
// few tokens to a few hundred, landing inside, on and across KV block boundaries. Written for
// these tests.

#include <string>
#include <vector>

namespace tokenfab::test {

inline std::vector<std::string> prompt_texts() {
  std::vector<std::string> texts = {
      "The capital of France is",
      "Once upon a time, in a small village by the sea, there lived",
      "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
      "List three uses of copper:",
      "Q: What is 12 times 12?\nA:",
      "The quick brown fox",
      "In 1969, the first humans to walk on the Moon were",
      "A recipe for bread needs flour, water, salt and",
      "Photosynthesis is the process by which plants",
      "Dear team, the meeting on Friday is moved to",
      "The three primary colors are",
      "To install the package, run",
  };
  std::string long_text = "Here is a long note about rivers. ";
  for (int i = 0; i < 12; ++i)
    long_text +=
        "Rivers carry water from the hills to the sea, shaping valleys and feeding towns. ";
  texts.push_back(long_text + "In short, rivers");
  std::string longer = "Meeting minutes. ";
  for (int i = 0; i < 30; ++i)
    longer += "Item " + std::to_string(i) + ": the committee reviewed the budget and agreed. ";
  texts.push_back(longer + "The next item was");
  texts.push_back("Translate to French: good morning ->");
  texts.push_back("Why is the sky blue? Because");
  return texts;
}

}  // namespace tokenfab::test
