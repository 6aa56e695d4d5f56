#pragma once
// The registry of models, domains, draft heads and their evaluations, on a Database's connection.
// Each write is one transaction (or a savepoint inside the caller's sqlite::Transaction).

#include <filesystem>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "core/storage/database.h"
#include "core/storage/records.h"

namespace tokenfab {

class Registry {
 public:
  explicit Registry(Database& db) : db_(db) {}

  // Upserts by sha256 (a re-added model keeps its id and added_unix); returns the id.
  int64_t add_model(const ModelRecord& model);
  std::optional<ModelRecord> find_model(std::string_view sha256);

  // Upserts by name; returns the id.
  int64_t add_domain(const DomainRecord& domain);
  // Ordered by name.
  std::vector<DomainRecord> domains();

  // Throws Error "a head named 'x' already exists (id 3)" for a taken name, and for a malformed
  // record. Returns the new id.
  int64_t add_head(HeadRecord head);
  // "ID|NAME": all digits looks up by id, anything else by name.
  std::optional<HeadRecord> find_head(std::string_view id_or_name);
  // Newest first.
  std::vector<HeadRecord> heads();
  // Also removes its evaluations; false when there was no such head. The head's file is the
  // caller's to delete.
  bool remove_head(int64_t id);
  // The head's file (a relative one resolved against the database's directory); throws Error
  // when it is missing.
  std::filesystem::path head_file(const HeadRecord& head) const;

  // Throws Error for an unknown head_id or a malformed record. Returns the new id.
  int64_t add_evaluation(const EvaluationRecord& evaluation);
  // Newest first.
  std::vector<EvaluationRecord> evaluations(int64_t head_id);
  // The evaluation with the highest accept_per_step on `domain` with `spec` and the native target
  // among heads whose base model is `base_model_sha256`, with its head; nullopt when none.
  std::optional<std::pair<HeadRecord, EvaluationRecord>> best_head_for(
      std::string_view domain, std::string_view base_model_sha256, std::string_view spec);
  // Every head with such an evaluation, each with its best one, best first.
  std::vector<std::pair<HeadRecord, EvaluationRecord>> heads_for(
      std::string_view domain, std::string_view base_model_sha256, std::string_view spec);

 private:
  Database& db_;
};

}  // namespace tokenfab
