#pragma once
// AtomicFile: a file written under a temporary name of its own beside its final path (unique per
// process and per call, so two processes writing the same file never share one), flushed to disk
// and renamed over the final path. A reader sees the old file or the whole new one; an error, a
// cancelled write or a crash leaves no half file under the final name (a crash may leave a hidden
// `.NAME.tmp-*` file beside it, never read as the file).

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace tokenfab {

class AtomicFile {
 public:
  // Creates the temporary file in the final path's folder, which must exist. Throws Error naming
  // the final path and the system's reason.
  explicit AtomicFile(std::filesystem::path final_path);
  ~AtomicFile();  // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes; throws Error (a full disk, say) naming the final path.
  void write(std::span<const uint8_t> bytes);
  void write(std::string_view text);
  // Flushes the data to disk, renames the file over the final path and makes the rename durable.
  // Throws Error naming the final path; the temporary file is then removed.
  void commit();

  const std::filesystem::path& final_path() const { return final_; }
  int fd() const { return fd_; }

 private:
  std::filesystem::path final_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Creates the folders above `file` that are missing; throws Error naming `file` when it cannot.
void create_folders_for(const std::filesystem::path& file);

// Writes `text` to `path` through an AtomicFile.
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

}  // namespace tokenfab
