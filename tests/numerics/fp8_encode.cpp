// Reads float32 values (raw, little-endian) on stdin and writes each one's e4m3 byte
// (float_to_fp8_e4m3) to stdout, then the 256 patterns decoded as float32: what
// tests/numerics/check_fp8.py compares with ml_dtypes.
#include <cstdio>
#include <vector>

#include "core/fp8.h"

int main() {
  std::vector<float> values;
  float buffer[4096];
  std::size_t n;
  while ((n = std::fread(buffer, sizeof(float), 4096, stdin)) > 0) values.insert(values.end(), buffer, buffer + n);
  std::vector<unsigned char> bytes(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bytes[i] = asynct::float_to_fp8_e4m3(values[i]);
  std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  for (int b = 0; b < 256; ++b) {
    const float f = asynct::fp8_e4m3_to_float(std::uint8_t(b));
    std::fwrite(&f, sizeof f, 1, stdout);
  }
  return std::ferror(stdout) ? 1 : 0;
}
