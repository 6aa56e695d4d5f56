#include "core/speculative/domain_classifier.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/common/error.h"

namespace tokenfab {

DomainClassifier DomainClassifier::fit(std::span<const Example> examples) {
  std::map<std::string, std::unordered_map<TokenId, int64_t>> counts;
  std::map<std::string, int64_t> totals;
  std::unordered_map<TokenId, int> vocabulary;
  for (const Example& e : examples) {
    auto& c = counts[e.domain];
    for (const TokenId t : e.tokens) {
      ++c[t];
      ++totals[e.domain];
      vocabulary.emplace(t, 0);
    }
  }
  if (counts.size() < 2) throw Error("domain classifier: needs at least two domains");
  DomainClassifier d;
  for (const auto& [name, c] : counts) {
    if (totals[name] == 0) throw Error("domain classifier: domain '" + name + "' has no tokens");
    d.domains_.push_back(name);
  }
  const auto v = static_cast<double>(vocabulary.size());
  for (const auto& [token, unused] : vocabulary) {
    std::vector<float>& row = d.log_p_[token];
    for (const std::string& name : d.domains_) {
      const auto& c = counts[name];
      const auto it = c.find(token);
      const double n = it == c.end() ? 0.0 : static_cast<double>(it->second);
      row.push_back(
          static_cast<float>(std::log((n + 1.0) / (static_cast<double>(totals[name]) + v))));
    }
  }
  return d;
}

DomainClassifier::Result DomainClassifier::classify(std::span<const TokenId> tokens) const {
  std::vector<double> score(domains_.size(), 0.0);
  int64_t known = 0;
  for (const TokenId t : tokens) {
    const auto it = log_p_.find(t);
    if (it == log_p_.end()) continue;
    ++known;
    for (size_t d = 0; d < score.size(); ++d) score[d] += it->second[d];
  }
  Result r;
  const auto best =
      static_cast<size_t>(std::max_element(score.begin(), score.end()) - score.begin());
  r.domain = domains_[best];
  if (known > 0) {
    double second = -std::numeric_limits<double>::infinity();
    for (size_t d = 0; d < score.size(); ++d)
      if (d != best) second = std::max(second, score[d]);
    r.margin = (score[best] - second) / static_cast<double>(known);
  }
  return r;
}

}  // namespace tokenfab
