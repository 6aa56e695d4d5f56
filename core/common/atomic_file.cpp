#include "core/common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <system_error>

#include "core/common/error.h"

namespace tokenfab {

namespace {

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

std::filesystem::path directory_of(const std::filesystem::path& p) {
  return p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
}

}  // namespace

AtomicFile::AtomicFile(std::filesystem::path final_path) : final_(std::move(final_path)) {
  const std::filesystem::path dir = directory_of(final_);
  static std::atomic<uint64_t> counter{0};
  int err = 0;
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    temp_ = dir / ("." + final_.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                   std::to_string(counter++));
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    err = errno;
    if (fd_ < 0 && err != EEXIST) break;
  }
  if (fd_ < 0) throw Error("cannot write " + final_.string() + ": " + errno_text(err));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::write(std::span<const uint8_t> bytes) {
  const uint8_t* data = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t w = ::write(fd_, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + final_.string() + ": " + errno_text(errno));
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::write(std::string_view text) {
  write(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

void AtomicFile::commit() {
  const std::string shown = final_.string();
  if (::fsync(fd_) != 0) throw Error("cannot write " + shown + ": " + errno_text(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw Error("cannot write " + shown + ": " + errno_text(errno));
  if (::rename(temp_.c_str(), final_.c_str()) != 0)
    throw Error("cannot write " + shown + ": cannot rename the finished file into place (" +
                errno_text(errno) + ")");
  committed_ = true;
  // Makes the rename itself durable; a failure here still leaves a complete file, so it is ignored.
  const int dfd = ::open(directory_of(final_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void create_folders_for(const std::filesystem::path& file) {
  std::error_code ec;
  std::filesystem::create_directories(directory_of(file), ec);
  if (ec)
    throw Error("cannot write " + file.string() + ": cannot create its folder (" + ec.message() +
                ")");
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  AtomicFile file(path);
  file.write(text);
  file.commit();
}

}  // namespace tokenfab
