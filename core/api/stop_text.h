#pragma once
// StopText: cuts generated text at the first stop string, which is not returned. Text that might
// be the start of a stop string is held back until the next piece shows whether it is, so a
// stream never sends text that a stop string then takes back.

#include <string>
#include <vector>

namespace tokenfab::api {

class StopText {
 public:
  explicit StopText(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Appends `piece`; returns the text now safe to send. After a stop string is found, stopped()
  // is true and further pieces return nothing.
  std::string push(const std::string& piece);
  // The end of the generation: whatever is held back (no stop string can complete any more).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // a suffix that is a prefix of some stop string
  bool stopped_ = false;
};

}  // namespace tokenfab::api
