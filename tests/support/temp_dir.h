// A directory of its own for one test, removed with everything in it when the test ends. The
// name carries the process id and a counter, so tests running in parallel processes never share one.
#pragma once

#include <filesystem>
#include <string>

#include <unistd.h>

namespace asynct::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "asynct_test") {
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string dir() const { return path_.string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

}  // namespace asynct::testing
