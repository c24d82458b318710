// Reading and writing safetensors files, and HuggingFace checkpoint directories made of them.
//
// A file is mapped, not read: tensors are views into the mapping (copied only when a tensor's
// bytes are not aligned to its element size). Everything in the header is validated before
// use, and each failure names the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace asynct {

struct TensorInfo {
  DType dtype;
  Shape shape;
  std::uint64_t begin = 0, end = 0;  // byte range inside the data section
};

class SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  // Maps and validates the file; throws Error naming the file and the problem.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  // A read-only view of the tensor's bytes (the view keeps the mapping alive), or an owned
  // copy when the bytes are misaligned for the element type.
  Tensor tensor(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  const std::byte* data_ = nullptr;  // start of the data section
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (host, any dtype) as a safetensors file, names sorted, data 8-byte aligned.
// Replaces a regular file; anything else at the path (a directory, a FIFO) is an Error.
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors);

// The whole of a checkpoint's text file (config.json, the shard index). A path that is missing,
// unreadable or not a regular file is an Error naming it; the type is checked before any read,
// so a FIFO is an error, not a wait for a writer.
std::string read_checkpoint_text(const std::string& path);

// Makes the directory a checkpoint is written to, or accepts an existing one; an Error naming
// it when it exists as something else or cannot be made.
void make_checkpoint_directory(const std::string& directory);

// Throws an Error naming the path when something other than a regular file is there (a file
// about to be written over may be missing or regular).
void check_writable_file_path(const std::string& path);

// A HuggingFace checkpoint directory: model.safetensors, or shards named by
// model.safetensors.index.json ("weight_map": tensor name -> shard file).
class Checkpoint {
 public:
  static Checkpoint open(const std::string& directory);

  const std::string& directory() const { return directory_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The tensor, checked against the expected dtype and shape; a missing tensor or a mismatch
  // is an Error naming the tensor and its file.
  Tensor get(const std::string& name, DType dtype, const Shape& shape) const;
  // The dtype and shape the tensor is stored in (an Error naming it when it is missing).
  DType stored_dtype(const std::string& name) const;
  Shape stored_shape(const std::string& name) const;
  std::string file_of(const std::string& name) const;

 private:
  std::string directory_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> where_;  // name -> its file
};

}  // namespace asynct
