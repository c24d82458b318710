// The C++ side of bench/bench_tokenizer.py: encodes a list of documents (a JSON list of strings
// in a file) with a tokenizer.json, `repeat` times, and prints one JSON line: the best
// pass's seconds, the bytes per pass, the ids per pass and a checksum of the ids (FNV-1a over
// each id, so the script can check them against HuggingFace tokenizers'). Loading is not timed.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON DOCUMENTS_JSON REPEAT\n", argv[0]);
    return 1;
  }
  try {
    const auto tokenizer = asynct::text::Tokenizer::from_file(argv[1]);
    std::ifstream in(argv[2], std::ios::binary);
    std::ostringstream buffer;
    buffer << in.rdbuf();
    const auto docs = nlohmann::json::parse(buffer.str()).get<std::vector<std::string>>();
    const int repeat = std::stoi(argv[3]);
    std::size_t bytes = 0;
    for (const auto& d : docs) bytes += d.size();
    double best = 1e30;
    std::uint64_t checksum = 0;
    std::size_t count = 0;
    std::vector<std::int32_t> ids;
    for (int r = 0; r < repeat; ++r) {
      checksum = 1469598103934665603ull;
      count = 0;
      const auto start = std::chrono::steady_clock::now();
      for (const auto& d : docs) {
        ids.clear();
        tokenizer.encode(d, ids);
        for (const std::int32_t id : ids) checksum = (checksum ^ std::uint32_t(id)) * 1099511628211ull;
        count += ids.size();
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::printf("{\"seconds\": %.6f, \"bytes\": %zu, \"ids\": %zu, \"checksum\": %llu}\n", best, bytes, count,
                static_cast<unsigned long long>(checksum));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 2;
  }
}
