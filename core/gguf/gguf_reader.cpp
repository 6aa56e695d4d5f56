#include "core/gguf/gguf_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "core/gguf/gguf_parse.h"

namespace tokenfab::gguf {

namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// A read-only private mapping of a whole file; unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t size) : addr_(addr), size_(size) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr_ != nullptr) ::munmap(addr_, size_);
  }
  std::span<const uint8_t> bytes() const { return {static_cast<const uint8_t*>(addr_), size_}; }

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;
};

// Closes a file descriptor on scope exit.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

std::unique_ptr<Mapping> map_file(const std::filesystem::path& path) {
  const std::string shown = path.string();
  const int fd = ::open(shown.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open " + shown + ": " + errno_text(errno));
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error("cannot open " + shown + ": " + errno_text(errno));
  if (S_ISDIR(st.st_mode)) {
    throw Error("cannot open " + shown + ": it is a directory (expected a GGUF file)");
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error("cannot open " + shown + ": not a regular file (expected a GGUF file)");
  }
  if (st.st_size == 0) throw Error(shown + ": file is empty (expected a GGUF file)");
  const auto size = static_cast<size_t>(st.st_size);
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) throw Error("cannot map " + shown + ": " + errno_text(errno));
  return std::make_unique<Mapping>(addr, size);
}

}  // namespace

struct GgufFile::State {
  std::string name;
  std::unique_ptr<Mapping> mapping;  // null when parse() was given the caller's bytes
  std::span<const uint8_t> bytes;
  ParsedGguf parsed;
};

GgufFile GgufFile::open(const std::filesystem::path& path) {
  auto state = std::make_unique<State>();
  state->name = path.string();
  state->mapping = map_file(path);
  state->bytes = state->mapping->bytes();
  state->parsed = parse_gguf(state->bytes, state->name);
  return GgufFile(std::move(state));
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, std::string name) {
  auto state = std::make_unique<State>();
  state->name = std::move(name);
  state->bytes = bytes;
  state->parsed = parse_gguf(bytes, state->name);
  return GgufFile(std::move(state));
}

GgufFile::GgufFile(std::unique_ptr<State> state) : state_(std::move(state)) {}
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

const std::string& GgufFile::name() const { return state_->name; }
uint32_t GgufFile::version() const { return state_->parsed.version; }
uint64_t GgufFile::alignment() const { return state_->parsed.alignment; }
uint64_t GgufFile::file_size() const { return state_->bytes.size(); }
uint64_t GgufFile::data_offset() const { return state_->parsed.data_offset; }
std::span<const uint8_t> GgufFile::bytes() const { return state_->bytes; }

const std::vector<KeyValue>& GgufFile::metadata() const { return state_->parsed.metadata; }

const Value* GgufFile::find(std::string_view key) const {
  const auto& index = state_->parsed.key_index;
  auto it = index.find(key);
  return it == index.end() ? nullptr : &state_->parsed.metadata[it->second].value;
}

const Value& GgufFile::get(std::string_view key) const {
  if (const Value* v = find(key)) return *v;
  throw Error(state_->name + ": missing metadata key " + std::string(key));
}

const std::vector<TensorInfo>& GgufFile::tensors() const { return state_->parsed.tensors; }

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto& index = state_->parsed.tensor_index;
  auto it = index.find(name);
  return it == index.end() ? nullptr : &state_->parsed.tensors[it->second];
}

const TensorInfo& GgufFile::tensor(std::string_view name) const {
  if (const TensorInfo* t = find_tensor(name)) return *t;
  throw Error(state_->name + ": missing tensor " + std::string(name));
}

}  // namespace tokenfab::gguf
