// The GPU's own timeline of every kernel a process runs, CUDA graph nodes included: a CUPTI
// injection library (loaded by the CUDA driver through CUDA_INJECTION64_PATH, no change to the
// program) that records each kernel's start and end on the device clock and writes them out at
// exit. Nsight Compute times kernels one at a time, which hides how a chain of dependent
// launches overlaps; this shows it. bench/timeline_step.py reads the file.
//
//   g++ -std=c++20 -O2 -shared -fPIC bench/kernel_timeline.cpp -I$CUDA/include -L$CUPTI_LIB -lcupti \
//       -o libkernel_timeline.so
//   ASYNCT_TIMELINE_OUT=t.csv CUDA_INJECTION64_PATH=$PWD/libkernel_timeline.so asynct bench ...
//
// Output: one CSV line per kernel, in completion-buffer order: start_ns,end_ns,grid,block,
// dynamic_smem,graph_id,name (demangled, commas replaced).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelSpan {
  std::uint64_t start, end;
  int grid[3], block[3];
  int dynamic_smem;
  std::uint32_t graph_id;
  std::string name;
};

std::mutex g_mutex;
std::vector<KernelSpan> g_spans;
constexpr std::size_t kBufferBytes = 8 << 20;

#define TIMELINE_CHECK(call)                                                             \
  do {                                                                                   \
    CUptiResult status_ = (call);                                                        \
    if (status_ != CUPTI_SUCCESS) {                                                      \
      const char* message_ = nullptr;                                                    \
      cuptiGetResultString(status_, &message_);                                          \
      std::fprintf(stderr, "kernel_timeline: %s failed: %s\n", #call, message_ ? message_ : "?"); \
    }                                                                                    \
  } while (0)

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* readable = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && readable ? readable : name;
  std::free(readable);
  for (char& c : out)
    if (c == ',') c = ';';
  return out;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<KernelSpan> spans;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    spans.push_back(KernelSpan{k->start, k->end, {k->gridX, k->gridY, k->gridZ}, {k->blockX, k->blockY, k->blockZ},
                               k->dynamicSharedMemory, k->graphId, demangled(k->name)});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_spans.insert(g_spans.end(), spans.begin(), spans.end());
}

void write_out() {
  TIMELINE_CHECK(cuptiActivityFlushAll(1));
  const char* path = std::getenv("ASYNCT_TIMELINE_OUT");
  std::FILE* f = std::fopen(path && *path ? path : "kernel_timeline.csv", "w");
  if (f == nullptr) {
    std::fprintf(stderr, "kernel_timeline: cannot write %s\n", path ? path : "kernel_timeline.csv");
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(f, "start_ns,end_ns,grid,block,dynamic_smem,graph_id,name\n");
  for (const KernelSpan& s : g_spans)
    std::fprintf(f, "%llu,%llu,%dx%dx%d,%dx%dx%d,%d,%u,%s\n", (unsigned long long)s.start, (unsigned long long)s.end,
                 s.grid[0], s.grid[1], s.grid[2], s.block[0], s.block[1], s.block[2], s.dynamic_smem, s.graph_id,
                 s.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "kernel_timeline: %zu kernels\n", g_spans.size());
}

}  // namespace

extern "C" int InitializeInjection() {
  TIMELINE_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  TIMELINE_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  std::atexit(write_out);
  return 1;
}
