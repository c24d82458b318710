#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

namespace asynct {
namespace {

using nlohmann::json;

constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit

bool dtype_from_name(const std::string& name, DType* dtype) {
  static const std::map<std::string, DType> names = {
      {"F32", DType::F32}, {"F64", DType::F64}, {"BF16", DType::BF16}, {"F16", DType::F16},
      {"I32", DType::I32}, {"I64", DType::I64}, {"U8", DType::U8}, {"F8_E4M3", DType::F8E4M3}};
  auto it = names.find(name);
  if (it == names.end()) return false;
  *dtype = it->second;
  return true;
}

std::string dtype_to_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::F8E4M3: return "F8_E4M3";
  }
  return "?";
}

bool is_float_dtype(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16 || dtype == DType::F16 ||
         dtype == DType::F8E4M3;
}

// Opens a file for reading; `where` names it in errors. O_NONBLOCK makes opening a FIFO return
// at once (a plain open waits for a writer), and the file type is then checked on the open
// descriptor. *st receives the file's status.
int open_regular_file(const std::string& path, const std::string& where, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  check(fd >= 0, where, ": cannot open (", std::strerror(errno), ")");
  if (fstat(fd, st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(where + ": cannot stat (" + std::strerror(err) + ")");
  }
  if (!S_ISREG(st->st_mode)) {
    ::close(fd);
    throw Error(where + " is not a regular file");
  }
  return fd;
}

// Whether anything (a dangling link too) is at the path.
bool entry_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

std::string read_checkpoint_text(const std::string& path) {
  constexpr std::uint64_t kMaxBytes = 256u << 20;  // config.json and index files are kilobytes
  struct stat st {};
  const int fd = open_regular_file(path, path, &st);
  std::string text;
  if (std::uint64_t(st.st_size) > kMaxBytes) {
    ::close(fd);
    throw Error(path + ": " + std::to_string(st.st_size) + " bytes is too large for a checkpoint text file");
  }
  text.resize(std::size_t(st.st_size));
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      throw Error(path + ": read failed" + (err ? std::string(" (") + std::strerror(err) + ")" : std::string(" (file shrank)")));
    }
    got += std::size_t(n);
  }
  ::close(fd);
  return text;
}

void make_checkpoint_directory(const std::string& directory) {
  struct stat st {};
  if (::stat(directory.c_str(), &st) == 0) {
    check(S_ISDIR(st.st_mode), "checkpoint directory ", directory, " exists and is not a directory");
    return;
  }
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  check(!ec, "cannot create checkpoint directory ", directory, " (", ec.message(), ")");
}

void check_writable_file_path(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) check(S_ISREG(st.st_mode), "cannot write ", path, ": it is not a regular file");
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const std::string where = "safetensors file " + path;
  struct stat st {};
  const int fd = open_regular_file(path, where, &st);
  const std::uint64_t size = std::uint64_t(st.st_size);
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  if (size > 0) {
    file->map_ = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (file->map_ == MAP_FAILED) file->map_ = nullptr;
  }
  ::close(fd);
  check(size >= 8, where, ": ", size, " bytes is too short for a header length");
  check(file->map_ != nullptr, where, ": cannot map the file");
  file->map_size_ = size;

  const auto* bytes = static_cast<const std::byte*>(file->map_);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::uint64_t(bytes[i]);  // LE
  check(header_len <= kMaxHeaderBytes, where, ": header length ", header_len,
        " is over the format's limit of ", kMaxHeaderBytes);
  check(header_len <= size - 8, where, ": header length ", header_len, " runs past the end of the ",
        size, "-byte file");
  const char* header_text = reinterpret_cast<const char*>(bytes + 8);
  json header = json::parse(header_text, header_text + header_len, nullptr, false);
  check(!header.is_discarded(), where, ": the header is not valid JSON");
  check(header.is_object(), where, ": the header is not a JSON object");

  const std::uint64_t data_size = size - 8 - header_len;
  file->data_ = bytes + 8 + header_len;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      check(entry.is_object(), where, ": __metadata__ is not an object");
      for (auto& [key, value] : entry.items()) {
        check(value.is_string(), where, ": metadata value of '", key, "' is not a string");
        file->metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string what = where + ": tensor '" + name + "'";
    check(entry.is_object(), what, ": entry is not an object");
    check(entry.contains("dtype") && entry["dtype"].is_string(), what, ": missing dtype");
    check(entry.contains("shape") && entry["shape"].is_array(), what, ": missing shape");
    check(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
              entry["data_offsets"].size() == 2,
          what, ": data_offsets must be [begin, end]");
    TensorInfo info;
    const std::string dtype = entry["dtype"].get<std::string>();
    check(dtype_from_name(dtype, &info.dtype), what, ": unsupported dtype ", dtype);
    std::uint64_t numel = 1;
    for (const json& d : entry["shape"]) {
      check(d.is_number_unsigned(), what, ": shape entries must be non-negative integers");
      const std::uint64_t n = d.get<std::uint64_t>();
      check(n <= std::uint64_t(std::numeric_limits<std::int64_t>::max()) &&
                (n == 0 || numel <= std::numeric_limits<std::uint64_t>::max() / n),
            what, ": shape overflows");
      numel *= n;
      info.shape.push_back(std::int64_t(n));
    }
    for (const json& o : entry["data_offsets"])
      check(o.is_number_unsigned(), what, ": data_offsets must be non-negative integers");
    info.begin = entry["data_offsets"][0].get<std::uint64_t>();
    info.end = entry["data_offsets"][1].get<std::uint64_t>();
    check(info.begin <= info.end, what, ": data_offsets [", info.begin, ", ", info.end, "] run backwards");
    check(info.end <= data_size, what, ": data_offsets end ", info.end, " is past the ", data_size,
          "-byte data section");
    check(numel <= std::numeric_limits<std::uint64_t>::max() / dtype_size(info.dtype) &&
              info.end - info.begin == numel * dtype_size(info.dtype),
          what, ": ", dtype, shape_string(info.shape), " needs ", numel * dtype_size(info.dtype),
          " bytes but data_offsets hold ", info.end - info.begin);
    file->infos_[name] = info;
  }
  // Tensors may not share bytes.
  std::vector<std::pair<std::uint64_t, std::string>> starts;
  for (const auto& [name, info] : file->infos_)
    if (info.end > info.begin) starts.push_back({info.begin, name});
  std::sort(starts.begin(), starts.end());
  for (std::size_t i = 1; i < starts.size(); ++i) {
    const TensorInfo& prev = file->infos_[starts[i - 1].second];
    check(prev.end <= starts[i].first, where, ": tensors '", starts[i - 1].second, "' and '",
          starts[i].second, "' overlap");
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_size_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, info] : infos_) out.push_back(name);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  check(it != infos_.end(), "safetensors file ", path_, ": no tensor '", name, "'");
  return it->second;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& i = info(name);
  const std::byte* start = data_ + i.begin;
  if (reinterpret_cast<std::uintptr_t>(start) % dtype_size(i.dtype) == 0)
    return Tensor::view_of(const_cast<std::byte*>(start), i.dtype, i.shape, shared_from_this());
  Tensor copy = Tensor::empty(i.dtype, i.shape);
  std::memcpy(copy.data(), start, i.end - i.begin);
  return copy;
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  json header = json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    check(t.device() == Device::CPU, "write_safetensors: '", name, "' is not a host tensor");
    json shape = json::array();
    for (std::int64_t d : t.shape()) shape.push_back(d);
    header[name] = {{"dtype", dtype_to_name(t.dtype())}, {"shape", shape},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data starts 8-byte aligned
  check_writable_file_path(path);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  check(bool(out), "write_safetensors: cannot create ", path);
  std::uint64_t len = text.size();
  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = char((len >> (8 * i)) & 0xff);
  out.write(len_bytes, 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& [name, t] : tensors)
    out.write(static_cast<const char*>(t.data()), std::streamsize(t.nbytes()));
  check(bool(out), "write_safetensors: writing ", path, " failed");
}

Checkpoint Checkpoint::open(const std::string& directory) {
  namespace fs = std::filesystem;
  Checkpoint c;
  c.directory_ = directory;
  std::error_code ec;
  check(fs::is_directory(directory, ec), "checkpoint ", directory, " is not a directory");
  const fs::path index = fs::path(directory) / "model.safetensors.index.json";
  const fs::path single = fs::path(directory) / "model.safetensors";
  if (entry_exists(index.string())) {
    json j = json::parse(read_checkpoint_text(index.string()), nullptr, false);
    check(!j.is_discarded() && j.is_object(), index.string(), ": not valid JSON");
    check(j.contains("weight_map") && j["weight_map"].is_object(), index.string(),
          ": no weight_map object");
    std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
    for (auto& [name, file] : j["weight_map"].items()) {
      check(file.is_string(), index.string(), ": weight_map entry of '", name, "' is not a file name");
      const std::string shard = file.get<std::string>();
      check(shard.find('/') == std::string::npos && shard != ".." && !shard.empty(), index.string(),
            ": shard name '", shard, "' must be a file in the checkpoint directory");
      auto& f = shards[shard];
      if (!f) f = SafetensorsFile::open((fs::path(directory) / shard).string());
      check(f->contains(name), index.string(), ": tensor '", name, "' is mapped to ", shard,
            ", which does not hold it");
      c.where_[name] = f;
    }
    for (const auto& [shard, f] : shards)
      for (const std::string& name : f->names())
        check(c.where_.count(name) && c.where_[name] == f, "checkpoint ", directory, ": shard ", shard,
              " holds '", name, "', which the index does not map to it");
  } else {
    check(entry_exists(single.string()), "checkpoint ", directory,
          " has neither model.safetensors nor model.safetensors.index.json");
    auto f = SafetensorsFile::open(single.string());
    for (const std::string& name : f->names()) c.where_[name] = f;
  }
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : where_) out.push_back(name);
  return out;
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string("(none)") : it->second->path();
}

DType Checkpoint::stored_dtype(const std::string& name) const {
  auto it = where_.find(name);
  check(it != where_.end(), "checkpoint ", directory_, ": missing tensor '", name, "'");
  return it->second->info(name).dtype;
}

Shape Checkpoint::stored_shape(const std::string& name) const {
  auto it = where_.find(name);
  check(it != where_.end(), "checkpoint ", directory_, ": missing tensor '", name, "'");
  return it->second->info(name).shape;
}

Tensor Checkpoint::get(const std::string& name, DType dtype, const Shape& shape) const {
  auto it = where_.find(name);
  check(it != where_.end(), "checkpoint ", directory_, ": missing tensor '", name, "'");
  const TensorInfo& info = it->second->info(name);
  check(info.shape == shape, it->second->path(), ": tensor '", name, "' has shape ",
        shape_string(info.shape), ", the config implies ", shape_string(shape));
  check(is_float_dtype(info.dtype) == is_float_dtype(dtype), it->second->path(), ": tensor '", name,
        "' is stored as ", dtype_name(info.dtype), ", which cannot be read as ", dtype_name(dtype));
  Tensor t = it->second->tensor(name);
  if (t.dtype() == dtype) return t;
  return t.to(dtype);
}

}  // namespace asynct
