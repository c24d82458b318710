// Checkpoint files that are not what they claim to be: config integers past int's range or
// with a fraction, directories and FIFOs where files belong, an existing file as the output
// directory, an integer tensor where a weight belongs. Each is an asynct::Error that names the
// file (and the key or tensor), never another exception or a hang.
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "models/weights.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace asynct {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

using testing::TempDir;

// A tiny AsyncT checkpoint whose config.json holds `text` for `key`, written as is.
void write_config_with(const TempDir& s, const std::string& key, const std::string& text) {
  save_checkpoint(random_weights(tiny_config(Architecture::AsyncT), 1), s.dir());
  std::ifstream in(s.file("config.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j[key] = "@@";
  std::string dumped = j.dump(1);
  dumped.replace(dumped.find("\"@@\""), 4, text);
  std::ofstream(s.file("config.json")) << dumped;
}

TEST(ConfigIntegers, ValuesPastIntOrWithAFractionAreErrorsQuotingTheText) {
  TempDir s;
  const struct {
    const char* key;
    const char* text;
  } cases[] = {
      {"hidden_size", "4294967424"},        // 2^32 + 128: wrapped to 128
      {"num_hidden_layers", "4294967298"},  // 2^32 + 2: wrapped to 2
      {"hidden_size", "128.7"},             // truncated to 128
      {"vocab_size", "1e12"},               // became -727379968
      {"num_attention_heads", "-4294967292"},
      {"head_dim", "64.5"},
      {"max_position_embeddings", "2147483648"},
      {"attn_pool_window", "3.0000001"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + c.text);
    write_config_with(s, c.key, c.text);
    expect_error([&] { load_config(s.file("config.json")); }, std::string("'") + c.key + "' must be an integer");
    expect_error([&] { load_config(s.file("config.json")); }, c.text);
    expect_error([&] { load_config(s.file("config.json")); }, "config.json");
  }
  // An integer written with a zero fraction is that integer.
  write_config_with(s, "hidden_size", "128.0");
  EXPECT_EQ(load_config(s.file("config.json")).hidden_size, 128);
  write_config_with(s, "hidden_size", "1.28e2");
  EXPECT_EQ(load_config(s.file("config.json")).hidden_size, 128);
}

// The end-of-sequence tokens, as HF reads them: generation_config.json's eos_token_id (an int
// or a list of ints) when it has one, else config.json's; a missing generation_config.json is
// fine, a malformed one an error naming it.
TEST(EosTokens, FromGenerationConfigElseConfigJson) {
  TempDir s;
  save_checkpoint(random_weights(tiny_config(Architecture::AsyncT), 1), s.dir());
  EXPECT_TRUE(load_checkpoint_config(s.dir()).eos_token_ids.empty());  // neither file names one
  write_config_with(s, "eos_token_id", "7");
  EXPECT_EQ(load_checkpoint_config(s.dir()).eos_token_ids, std::vector<std::int32_t>({7}));
  EXPECT_EQ(load_weights(s.dir()).config.eos_token_ids, std::vector<std::int32_t>({7}));
  write_config_with(s, "eos_token_id", "[9, 3]");
  EXPECT_EQ(load_checkpoint_config(s.dir()).eos_token_ids, std::vector<std::int32_t>({9, 3}));
  std::ofstream(s.file("generation_config.json")) << R"({"bos_token_id": 1, "eos_token_id": [255, 0, 4]})";
  EXPECT_EQ(load_checkpoint_config(s.dir()).eos_token_ids, std::vector<std::int32_t>({255, 0, 4}));
  std::ofstream(s.file("generation_config.json")) << R"({"eos_token_id": 5})";
  EXPECT_EQ(load_weights(s.dir()).config.eos_token_ids, std::vector<std::int32_t>({5}));
  std::ofstream(s.file("generation_config.json")) << R"({"do_sample": true})";  // none here: config.json's
  EXPECT_EQ(load_checkpoint_config(s.dir()).eos_token_ids, std::vector<std::int32_t>({9, 3}));

  const std::string gen = s.file("generation_config.json");
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"{\"eos_token_id\": 5", gen + ": not a JSON object"},
           {"[5]", gen + ": not a JSON object"},
           {R"({"eos_token_id": 256})", gen + ": 'eos_token_id' token 256 is outside the vocabulary [0, 256)"},
           {R"({"eos_token_id": [1, -1]})", gen + ": 'eos_token_id' token -1 is outside the vocabulary [0, 256)"},
           {R"({"eos_token_id": "2"})", gen + ": 'eos_token_id' must be a token id or a list of token ids, got \"2\""},
           {R"({"eos_token_id": [1, 2.5]})", gen + ": 'eos_token_id' must be a token id or a list of token ids"},
           {R"({"eos_token_id": 18446744073709551615})", gen + ": 'eos_token_id' token 18446744073709551615 is outside"}}) {
    std::ofstream(gen) << text;
    SCOPED_TRACE(text);
    expect_error([&] { load_checkpoint_config(s.dir()); }, message);
  }
  fs::remove(gen);
  write_config_with(s, "eos_token_id", "[1, 300]");
  expect_error([&] { load_checkpoint_config(s.dir()); }, "config.json: 'eos_token_id' token 300 is outside the vocabulary");
}

TEST(CheckpointFiles, ADirectoryAsConfigJsonIsAnError) {
  TempDir s;
  save_checkpoint(random_weights(tiny_config(Architecture::Qwen3), 1), s.dir());
  fs::remove(s.file("config.json"));
  fs::create_directory(s.file("config.json"));
  expect_error([&] { load_weights(s.dir()); }, "config.json is not a regular file");
}

TEST(CheckpointFiles, ADirectoryAsTheWeightsOrTheIndexIsAnError) {
  TempDir s;
  save_checkpoint(random_weights(tiny_config(Architecture::Qwen3), 1), s.dir());
  fs::remove(s.file("model.safetensors"));
  fs::create_directory(s.file("model.safetensors"));
  expect_error([&] { load_weights(s.dir()); }, "model.safetensors is not a regular file");
  fs::create_directory(s.file("model.safetensors.index.json"));
  expect_error([&] { load_weights(s.dir()); }, "model.safetensors.index.json is not a regular file");
}

// Runs f on another thread; a call still blocked after 10 s fails the test, and `unblock` is
// then called so that the thread can finish.
void expect_error_in_time(const std::function<void()>& f, const std::string& fragment,
                          const std::function<void()>& unblock) {
  auto done = std::async(std::launch::async, [&] { expect_error(f, fragment); });
  if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "still blocked after 10 s (expected an error mentioning '" << fragment << "')";
    unblock();
  }
  done.get();
}

// Opening a FIFO for writing without blocking succeeds once a reader waits on it, which lets
// a reader blocked in open() go on (it then reads end of file).
void release_fifo(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
  if (fd >= 0) ::close(fd);
}

TEST(CheckpointFiles, FifosInsteadOfFilesAreErrorsNotHangs) {
  TempDir s;
  save_checkpoint(random_weights(tiny_config(Architecture::Qwen3), 1), s.dir());
  fs::remove(s.file("model.safetensors"));
  ASSERT_EQ(::mkfifo(s.file("model.safetensors").c_str(), 0600), 0);
  expect_error_in_time([&] { load_weights(s.dir()); }, "model.safetensors is not a regular file",
                       [&] { release_fifo(s.file("model.safetensors")); });

  fs::remove(s.file("config.json"));
  ASSERT_EQ(::mkfifo(s.file("config.json").c_str(), 0600), 0);
  expect_error_in_time([&] { load_weights(s.dir()); }, "config.json is not a regular file",
                       [&] { release_fifo(s.file("config.json")); });

  ASSERT_EQ(::mkfifo(s.file("model.safetensors.index.json").c_str(), 0600), 0);
  expect_error_in_time([&] { Checkpoint::open(s.dir()); }, "model.safetensors.index.json is not a regular file",
                       [&] { release_fifo(s.file("model.safetensors.index.json")); });
}

TEST(CheckpointFiles, WritingOverAnExistingFileIsAnError) {
  TempDir s;
  { std::ofstream(s.file("taken")) << "x"; }
  const ModelConfig config = tiny_config(Architecture::AsyncT);
  expect_error([&] { write_random_checkpoint(config, 1, s.file("taken")); }, "is not a directory");
  expect_error([&] { save_checkpoint(random_weights(config, 1), s.file("taken")); }, "is not a directory");
  // A directory under a file cannot be made either.
  expect_error([&] { write_random_checkpoint(config, 1, s.file("taken/sub")); }, "cannot create");
  // A directory where config.json goes.
  fs::create_directories(s.file("out/config.json"));
  expect_error([&] { write_random_checkpoint(config, 1, s.file("out")); }, "config.json");
}

TEST(CheckpointFiles, AnIntegerTensorOfTheRightShapeIsNamed) {
  TempDir s;
  save_checkpoint(random_weights(tiny_config(Architecture::AsyncT), 2), s.dir());
  auto original = SafetensorsFile::open(s.file("model.safetensors"));
  std::map<std::string, Tensor> tensors;
  for (const std::string& name : original->names()) tensors[name] = original->tensor(name).to(original->info(name).dtype);
  original.reset();
  tensors["model.norm.weight"] = Tensor::from_vector<std::int32_t>(std::vector<std::int32_t>(128, 1), {128});
  write_safetensors(s.file("model.safetensors"), tensors);
  expect_error([&] { load_weights(s.dir()); }, "model.safetensors: tensor 'model.norm.weight' is stored as int32");
  tensors["model.norm.weight"] = Tensor::from_vector<std::uint8_t>(std::vector<std::uint8_t>(128, 1), {128});
  write_safetensors(s.file("model.safetensors"), tensors);
  expect_error([&] { load_weights(s.dir()); }, "tensor 'model.norm.weight' is stored as uint8");
}

}  // namespace
}  // namespace asynct
