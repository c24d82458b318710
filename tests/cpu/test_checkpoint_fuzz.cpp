// The checkpoint loader against damaged files: random edits and truncations of a valid
// config.json, of a safetensors header, random model.safetensors.index.json files, and files
// replaced by directories and links. Every
// case must load or throw asynct::Error; any other exception fails the test (a crash or an
// overflow shows under the sanitizer build). Deterministic (fixed seed) and small: a model of a
// few hundred parameters, 200 cases of each kind, under a second of CPU time in a release build.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "models/weights.h"

namespace asynct {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kCasesPerKind = 200;

ModelConfig micro_config() {
  ModelConfig c = tiny_config(Architecture::AsyncT);
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.max_position_embeddings = 64;
  return c;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

class Fuzzer {
 public:
  explicit Fuzzer(std::uint64_t seed) : rng_(seed) {}
  int below(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  bool chance(int percent) { return below(100) < percent; }

  // A JSON value from the kinds that break loaders: numbers past every integer type, fractions,
  // negative sizes, wrong types.
  json odd_value() {
    static const char* texts[] = {"0", "-1", "1", "3", "8", "128", "4294967424", "4294967298", "2147483648",
                                  "-2147483649", "18446744073709551615", "1e12", "1e400", "-1e400", "128.7",
                                  "0.5", "1e-320", "\"128\"", "\"\"", "null", "true", "[]", "{}", "[1,2]",
                                  "{\"a\":1}", "9223372036854775807", "-9223372036854775808", "65", "4", "16"};
    return json::parse(texts[below(int(std::size(texts)))], nullptr, false);
  }

  // Random byte-level damage: truncation, flipped, inserted or deleted bytes.
  std::string damage(std::string text) {
    const int edits = 1 + below(4);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const std::size_t at = std::size_t(below(int(text.size())));
      switch (below(4)) {
        case 0: text.resize(at); break;
        case 1: text[at] = char(below(256)); break;
        case 2: text.insert(at, 1, "{}[]\",:0123456789-.eE \\"[below(24)]); break;
        default: text.erase(at, 1 + std::size_t(below(8))); break;
      }
    }
    return text;
  }

  // A value inside a JSON document chosen at random, replaced or removed.
  void edit_json(json& j) {
    json* at = &j;
    for (int depth = 0; depth < 3 && (at->is_object() || at->is_array()) && !at->empty(); ++depth) {
      auto it = at->begin();
      std::advance(it, below(int(at->size())));
      if (depth > 0 && chance(30)) break;
      at = &*it;
    }
    if (chance(15)) *at = json();  // null
    else *at = odd_value();
  }

 private:
  std::mt19937_64 rng_;
};

class FuzzDir {
 public:
  FuzzDir() {
    path_ = fs::temp_directory_path() / ("asynct_fuzz_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    save_checkpoint(random_weights(micro_config(), 3), path_.string());
    config_ = read_all(file("config.json"));
    weights_ = read_all(file("model.safetensors"));
  }
  ~FuzzDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string dir() const { return path_.string(); }
  void restore() {
    for (const char* name : {"model.safetensors.index.json", "shard.safetensors"}) fs::remove(file(name));
    write_all(file("config.json"), config_);
    write_all(file("model.safetensors"), weights_);
  }
  const std::string& config() const { return config_; }
  const std::string& weights() const { return weights_; }

 private:
  fs::path path_;
  std::string config_, weights_;
};

// Loads the directory; only asynct::Error may come out.
void expect_load_or_error(const std::string& dir, const std::string& what) {
  try {
    (void)load_weights(dir);
  } catch (const Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << typeid(e).name() << ": " << e.what();
  }
}

TEST(CheckpointFuzz, DamagedConfigsGiveErrors) {
  FuzzDir d;
  Fuzzer f(1);
  for (int i = 0; i < kCasesPerKind; ++i) {
    d.restore();
    std::string text;
    if (f.chance(50)) {
      json j = json::parse(d.config());
      for (int e = 1 + f.below(3); e > 0; --e) f.edit_json(j);
      text = j.dump(1);
    } else {
      text = f.damage(d.config());
    }
    write_all(d.file("config.json"), text);
    expect_load_or_error(d.dir(), "config.json case " + std::to_string(i) + ": " + text);
  }
}

TEST(CheckpointFuzz, DamagedSafetensorsGiveErrors) {
  FuzzDir d;
  Fuzzer f(2);
  const std::string& bytes = d.weights();
  std::uint64_t header_len = 0;
  for (int b = 7; b >= 0; --b) header_len = (header_len << 8) | std::uint8_t(bytes[std::size_t(b)]);
  const std::string header = bytes.substr(8, header_len), data = bytes.substr(8 + header_len);
  for (int i = 0; i < kCasesPerKind; ++i) {
    d.restore();
    std::string out;
    const int kind = f.below(4);
    if (kind == 0) {
      out = bytes.substr(0, std::size_t(f.below(int(bytes.size()))));  // truncated file
    } else {
      std::string h = header;
      if (kind == 1) {
        json j = json::parse(h);
        for (int e = 1 + f.below(3); e > 0; --e) f.edit_json(j);
        h = j.dump();
      } else if (kind == 2) {
        h = f.damage(h);
      }
      std::uint64_t len = h.size();
      if (kind == 3) {  // a header length that lies
        const std::uint64_t lies[] = {0, 1, 7, len + 1, len - 1, std::uint64_t(bytes.size()), ~std::uint64_t(0),
                                      std::uint64_t(1) << 63, (std::uint64_t(100) << 20) + 1};
        len = lies[f.below(int(std::size(lies)))];
      }
      out.resize(8);
      for (int b = 0; b < 8; ++b) out[std::size_t(b)] = char((len >> (8 * b)) & 0xff);
      out += h + data;
    }
    write_all(d.file("model.safetensors"), out);
    expect_load_or_error(d.dir(), "safetensors case " + std::to_string(i));
  }
}

TEST(CheckpointFuzz, RandomIndexFilesGiveErrors) {
  FuzzDir d;
  Fuzzer f(3);
  std::vector<std::string> names;
  for (const auto& [name, shape] : expected_tensors(micro_config())) names.push_back(name);
  const json shards[] = {"model.safetensors", "shard.safetensors", "missing.safetensors", "", "..", "../x",
                         "a/b", ".", 5, nullptr, json::array()};
  for (int i = 0; i < kCasesPerKind; ++i) {
    d.restore();
    if (f.chance(50)) write_all(d.file("shard.safetensors"), d.weights());
    json map = json::object();
    for (const std::string& name : names)
      if (!f.chance(5)) map[name] = f.chance(85) ? json("model.safetensors") : shards[f.below(int(std::size(shards)))];
    if (f.chance(10)) map["model.extra.weight"] = "model.safetensors";
    json index = {{"metadata", {{"total_size", 1}}}, {"weight_map", map}};
    if (f.chance(20)) f.edit_json(index);
    std::string text = index.dump(1);
    if (f.chance(25)) text = f.damage(text);
    write_all(d.file("model.safetensors.index.json"), text);
    expect_load_or_error(d.dir(), "index case " + std::to_string(i) + ": " + text.substr(0, 200));
  }
}

// Each file of a checkpoint replaced by something that is not a regular file (FIFOs, which
// would block an open, are in test_checkpoint_files.cpp with a time limit).
TEST(CheckpointFuzz, FilesReplacedByOtherKindsGiveErrors) {
  FuzzDir d;
  for (const char* name : {"config.json", "model.safetensors", "model.safetensors.index.json"}) {
    for (int kind = 0; kind < 5; ++kind) {
      d.restore();
      const fs::path p = d.file(name);
      fs::remove(p);
      switch (kind) {
        case 0: fs::create_directory(p); break;
        case 1: fs::create_symlink("nowhere", p); break;      // dangling
        case 2: fs::create_symlink(name, p); break;           // a loop
        case 3: fs::create_directory_symlink("/", p); break;  // a directory through a link
        default: write_all(p.string(), ""); break;            // empty
      }
      expect_load_or_error(d.dir(), std::string(name) + " replaced, kind " + std::to_string(kind));
    }
  }
}

}  // namespace
}  // namespace asynct
