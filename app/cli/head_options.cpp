#include "head_options.h"

#include <filesystem>
#include <map>
#include <mutex>

#include "core/common/error.h"
#include "core/common/sha256.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"

namespace tokenfab::cli {

void add_head_options(CLI::App& cmd, HeadOptions& o) {
  cmd.add_option("--head", o.head, "draft head for speculative decoding: ID, NAME, PATH or none")
      ->capture_default_str();
  cmd.add_option("--spec", o.spec, "speculation shape: chain")->capture_default_str();
  cmd.add_option("--draft-len", o.draft_len, "tokens proposed per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
}

std::string model_sha256(const LlamaModel& model) {
  static std::mutex mutex;
  static std::map<std::string, std::string> known;
  const std::string path = model.file().name();
  std::lock_guard lock(mutex);
  auto it = known.find(path);
  if (it == known.end()) it = known.emplace(path, sha256_file(path)).first;
  return it->second;
}

std::shared_ptr<const MedusaHead> resolve_head(const HeadOptions& o, const LlamaModel& model) {
  if (o.head == "none" || o.head.empty()) return nullptr;
  if (o.spec != "chain")
    throw Error("--spec " + o.spec + ": only chain speculation is available (tree comes later)");
  if (o.head == "auto")
    throw Error(
        "--head auto: per-request head selection is not available yet; give a head ID, "
        "NAME or PATH");
  std::filesystem::path file;
  if (std::filesystem::is_regular_file(o.head)) {
    file = o.head;
  } else {
    const auto db = Database::open_default();
    Registry registry(*db);
    const std::optional<HeadRecord> record = registry.find_head(o.head);
    if (!record)
      throw Error("--head " + o.head + ": no such head in " + db->path().string() +
                  " and no such file (see `tokenfab-cli heads list`)");
    file = registry.head_file(*record);
  }
  MedusaHead head = load_draft_head(file);
  check_head_matches(head.info, model_sha256(model), model.hparams().n_embd,
                     model.hparams().n_vocab, model.file().name());
  return std::make_shared<const MedusaHead>(std::move(head));
}

}  // namespace tokenfab::cli
