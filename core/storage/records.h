#pragma once
// The rows of the registry (core/storage/registry.h), one struct per table. Timestamps are unix
// seconds; 0 in a record being added means "now".

#include <cstdint>
#include <string>
#include <vector>

namespace tokenfab {

struct ModelRecord {
  int64_t id = 0;
  std::string sha256;  // of the model file, lowercase hex; the model's identity
  std::string name;
  std::string path;
  int64_t added_unix = 0;
};

struct DomainRecord {
  int64_t id = 0;
  std::string name;
  std::string description;
  std::string source;  // "builtin" | "user"
};

// A trained draft head for speculative decoding.
struct HeadRecord {
  int64_t id = 0;
  std::string name;    // unique, not all digits (an all-digit string looks a head up by id)
  std::string domain;  // the domain it was trained on
  std::string type;    // "medusa" | "mtp"
  std::string base_model_sha256;
  std::string file;  // absolute, or relative to the database's directory
  int64_t created_unix = 0;
  std::string training_config_json;  // a JSON value; empty is stored as {}
  std::string summary_json;          // a JSON value; empty is stored as {}
};

// One measurement of a head on a prompt set.
struct EvaluationRecord {
  int64_t id = 0;
  int64_t head_id = 0;
  std::string domain;                // a domain name, or "file:<path>" for a user's prompt file
  std::string spec;                  // "chain" | "tree"
  double accept_per_step = 0;        // mean tokens accepted per verification step
  std::vector<double> per_position;  // acceptance rate at each draft position
  double decode_tok_s = 0;           // with the head
  double baseline_decode_tok_s = 0;  // without speculation, same target
  std::string target_quant;          // "native", or the target's quantisation ("q8_0", ...)
  // The model file's own decode tok/s without speculation, measured in the same run: the
  // baseline for a native target, the unquantized model for the quantization study; 0 where it
  // was not measured (evaluations recorded before schema version 4).
  double native_decode_tok_s = 0;
  // The devices it generated on, as the engine was configured: "cpu:0", "cuda:0", or
  // "prefill cpu:0, decode cuda:0" (EngineConfig::devices_text); "" for evaluations recorded before
  // schema version 5.
  std::string devices;
  int64_t prompts = 0;
  int64_t tokens = 0;
  int64_t created_unix = 0;
};

}  // namespace tokenfab
