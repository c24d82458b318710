#include "jobs/scenarios.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"
#include "jobs/warm_up.h"
#include "models/runner_factory.h"
#include "models/weights.h"

namespace asynct {
namespace {

struct Scenario {
  const char* name;
  int requests;
  int prompt_min, prompt_max;  // prompt lengths, seeded uniform in [min, max]
  int output;                  // tokens generated per request, EOS ignored
  bool by_name_only = false;   // not one of the default set: runs when --scenario names it
  bool sampled = false;        // requests draw with sampled_params() instead of greedily
};

// A serving user's sampling: temperature, top-k, top-p and the three penalties, a seed per request.
SamplingParams sampled_params(int request) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.3f;
  p.frequency_penalty = 0.2f;
  p.seed = std::uint64_t(request);
  return p;
}

// docs/DESIGN.md §7, then single-stream decode (one user's latency; the decode-step GEMMs at one row).
const Scenario kScenarios[] = {
    {"long_prefill_b4", 4, 8192, 8192, 1},
    {"prefill_heavy_b16", 16, 1024, 2048, 8},
    {"decode_heavy_b32", 32, 256, 256, 512},
    {"long_decode_b32", 32, 8192, 8192, 256},
    {"decode_b1", 1, 256, 256, 512, true},
    // decode_heavy_b32 with sampled_params(): what drawing on the device adds to a decode step.
    {"decode_heavy_b32_sampled", 32, 256, 256, 512, true, true},
    // bench/bench_serve.py's load in process: 256 requests of 1024 prompt / 256 output tokens,
    // 64 running at once (EngineOptions::max_num_seqs), as 64 concurrent streams through HTTP.
    {"serve_load_c64", 256, 1024, 1024, 256, true},
};

struct Run {
  double seconds = 0;
  std::int64_t tokens = 0;  // prompt + generated
  std::int64_t steps = 0;
  // Steps in which every sequence decoded one token (no prompt tokens) and their median time:
  // the decode step's own time, which the mean over all steps mixes with the prefill steps'
  // (and the median keeps apart from the few steps that capture a CUDA graph). A step's time
  // is the engine's EngineStats::last_step_ms, the host time spent building, submitting,
  // waiting for and reading that step. It is not the interval between two step() calls: a
  // pipelined step is submitted during the step() before, so that interval holds the next
  // step's submit instead of its own (on the CPU backend, where submit() runs the forward
  // pass, a whole step: the first decode step after a prefill took ~0 ms and the prefill step
  // two steps' time). In a steady GPU decode loop the two agree: each step() submits one step
  // and waits for one, so both are the time between consecutive decode steps.
  std::int64_t decode_steps = 0;
  double decode_step_ms = 0;
  std::int64_t pipelined_steps = 0;  // queued before the step they continue was read
  // Speculative decoding (EngineStats): sequence-steps with drafts, tokens drafted and kept.
  std::int64_t draft_rounds = 0, drafted_tokens = 0, accepted_tokens = 0;
  // Where the time went, in ms over the whole run: "host_*" phases are host wall-clock time
  // and split a step's wall time; the others are GPU time between events (CUDA backend), which
  // runs during host_launch and host_wait.
  std::map<std::string, double> phase_ms;
};

// Random weights are made once per model and shared by the scenarios (tensors share storage).
const ModelWeights& weights_for(Architecture arch, const ScenarioOptions& o) {
  static std::map<Architecture, ModelWeights> made;
  auto it = made.find(arch);
  if (it == made.end()) {
    ModelConfig config = builtin_config(arch, o.config);
    config.max_position_embeddings = std::max(config.max_position_embeddings, 16384);
    std::fprintf(stderr, "  making random %s weights (%lld parameters)\n", config.architecture_name().c_str(),
                 static_cast<long long>(config.parameter_count()));
    it = made.emplace(arch, random_weights(config, o.seed)).first;
  }
  return it->second;
}

// Untimed, on the engine the scenario then runs on (warm_up.h): as many requests as the
// scenario, with prompts that fill one prefill step of the token budget together, and a few
// decode steps: the shapes the scenario uses most. Graphs for the longer contexts the scenario
// reaches are still captured inside the timed run, as in serving.
void warm_up(Engine& engine, const Scenario& s, int prompt_min, int output, const ScenarioOptions& o, int vocab) {
  WarmUp w;
  w.requests = s.requests;
  w.prompt_tokens = std::max(1, std::min(prompt_min, o.max_batched_tokens / s.requests));
  w.output_tokens = std::min(output, 4);
  if (s.sampled) w.sampling = sampled_params;
  warm_up_engine(engine, w, vocab);
}

// One line: a run's time per step, host phases first (they add up to the wall time, less what
// "unaccounted" shows), then the GPU phases.
std::string breakdown(const char* scenario, const char* model, const Run& run) {
  const double steps = double(std::max<std::int64_t>(run.steps, 1));
  const double wall = run.seconds * 1e3 / steps;
  char part[96];
  std::snprintf(part, sizeof part, "  %s %s per step (ms): wall %.3f; host", scenario, model, wall);
  std::string line = part, gpu;
  double host = 0;
  for (const auto& [phase, ms] : run.phase_ms) {
    const bool is_host = phase.rfind("host_", 0) == 0;
    std::snprintf(part, sizeof part, " %s %.3f", is_host ? phase.c_str() + 5 : phase.c_str(), ms / steps);
    (is_host ? line : gpu) += part;
    if (is_host) host += ms / steps;
  }
  std::snprintf(part, sizeof part, ", unaccounted %.3f", wall - host);
  line += part;
  if (!gpu.empty()) line += "; GPU" + gpu;
  if (run.decode_steps > 0) {
    std::snprintf(part, sizeof part, "\n  %s %s decode steps: %lld, median %.3f ms", scenario, model,
                  static_cast<long long>(run.decode_steps), run.decode_step_ms);
    line += part;
  }
  if (run.draft_rounds > 0) {
    std::snprintf(part, sizeof part, "\n  %s %s drafts: %lld drafted, %lld kept (%.1f%%), %.2f kept a round", scenario, model,
                  static_cast<long long>(run.drafted_tokens), static_cast<long long>(run.accepted_tokens),
                  100.0 * double(run.accepted_tokens) / double(run.drafted_tokens),
                  double(run.accepted_tokens) / double(run.draft_rounds));
    line += part;
  }
  return line;
}

// One timed run of the scenario on `weights` (`label` names the model in the progress lines).
Run run_scenario(const Scenario& s, const ModelWeights& weights, const char* label, const ScenarioOptions& o) {
  const ModelConfig& config = weights.config;
  std::mt19937_64 rng(o.seed);  // the same prompts for both models
  const int prompt_min = std::max(1, s.prompt_min / o.scale), prompt_max = std::max(1, s.prompt_max / o.scale);
  const int output = std::max(1, s.output / o.scale);
  std::vector<Request> requests;
  int blocks = 0, longest = 0;
  for (int i = 0; i < s.requests; ++i) {
    Request r;
    const int len = std::uniform_int_distribution<int>(prompt_min, prompt_max)(rng);
    for (int t = 0; t < len; ++t) r.prompt.push_back(std::uniform_int_distribution<int>(0, config.vocab_size - 1)(rng));
    r.max_tokens = output;  // no end-of-sequence tokens: every request generates `output`
    if (s.sampled) r.sampling = sampled_params(i);
    blocks += (len + output + o.block_size - 1) / o.block_size;
    longest = std::max(longest, len + output);
    requests.push_back(std::move(r));
  }
  check(longest <= config.max_position_embeddings, "bench: ", s.name, " needs ", longest, " positions");
  EngineOptions eo;
  eo.max_num_batched_tokens = o.max_batched_tokens;
  eo.max_model_len = longest;
  eo.pipeline_steps = o.pipeline;
  eo.speculative = o.speculative;
  std::string backend;
  RunnerOptions ro;
  ro.device = o.device;
  ro.num_blocks = blocks;
  ro.block_size = o.block_size;
  ro.max_tokens_per_step = o.max_batched_tokens;
  ro.profile = o.profile;
  ro.cuda_graphs = o.cuda_graphs;
  ro.kv_cache_dtype = o.kv_cache_dtype;
  ro.quantization = o.quantization;
  ro.cpu_reference = o.cpu_reference;
  Engine engine(make_runner(weights, ro, &backend), config.vocab_size, eo, make_draft_model(o.speculative, config, ro));
  if (o.warmup) warm_up(engine, s, prompt_min, output, o, config.vocab_size);
  Run run;
  for (Request& r : requests) {
    run.tokens += std::int64_t(r.prompt.size()) + r.max_tokens;
    engine.add_request(r);
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();  // wall time from submission to last token
  auto shown = t0;
  // On a terminal the progress line is rewritten in place a few times a second; to a file or
  // a pipe each update is a line of its own, every 10 s.
  const bool terminal = isatty(fileno(stderr)) == 1;
  const auto interval = terminal ? std::chrono::milliseconds(250) : std::chrono::milliseconds(10000);
  const auto show = [&](const EngineStats& st) {
    std::fprintf(stderr, "%s  %-18s %-7s step %5lld, %7lld prefill + %6lld decode tokens%s", terminal ? "\r" : "",
                 s.name, label, static_cast<long long>(st.steps),
                 static_cast<long long>(st.prefill_tokens), static_cast<long long>(st.decode_tokens),
                 terminal ? "" : "\n");
  };
  std::vector<double> decode_step_ms;
  EngineStats before;
  engine.run_to_completion([&](const EngineStats& st) {  // a few lines a second, not one per step
    if (st.steps == before.steps + 1 && st.prefill_tokens == before.prefill_tokens)
      decode_step_ms.push_back(st.last_step_ms);
    before = st;
    const auto now = Clock::now();
    if (now - shown < interval) return;
    shown = now;
    show(st);
  });
  run.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const EngineStats& st = engine.stats();
  show(st);
  if (terminal) std::fprintf(stderr, "\n");
  run.steps = st.steps;
  run.pipelined_steps = st.pipelined_steps;
  run.draft_rounds = st.draft_rounds;
  run.drafted_tokens = st.drafted_tokens;
  run.accepted_tokens = st.accepted_tokens;
  run.decode_steps = std::int64_t(decode_step_ms.size());
  if (!decode_step_ms.empty()) {
    const auto middle = decode_step_ms.begin() + std::ptrdiff_t(decode_step_ms.size() / 2);
    std::nth_element(decode_step_ms.begin(), middle, decode_step_ms.end());
    run.decode_step_ms = *middle;
  }
  run.phase_ms = engine.runner().phase_times_ms();
  // The engine's own host time; the runner's forward() is split by the runner when it times
  // its parts (CUDA), else it is one phase.
  run.phase_ms["host_schedule"] = st.schedule_ms;
  run.phase_ms["host_sample"] = st.sample_ms;
  if (!run.phase_ms.contains("host_wait")) run.phase_ms["host_forward"] = st.forward_ms;
  return run;
}

// The run whose time is the median of the runs (the lower middle one for an even count).
const Run& median_run(const std::vector<Run>& runs) {
  std::vector<const Run*> sorted;
  for (const Run& r : runs) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(), [](const Run* x, const Run* y) { return x->seconds < y->seconds; });
  return *sorted[(sorted.size() - 1) / 2];
}

std::vector<double> seconds_of(const std::vector<Run>& runs) {
  std::vector<double> seconds;
  for (const Run& r : runs) seconds.push_back(r.seconds);
  return seconds;
}

// The AsyncT/Qwen3 ratio of each repeat (run r of one model against run r of the other, which
// ran right before or after it): their spread says whether a median ratio near 1.0 is a tie.
std::vector<double> ratio_each_run(const std::vector<Run>& asynct_runs, const std::vector<Run>& qwen3_runs) {
  std::vector<double> ratios;
  for (std::size_t r = 0; r < asynct_runs.size() && r < qwen3_runs.size(); ++r)
    ratios.push_back(asynct_runs[r].seconds / qwen3_runs[r].seconds);
  return ratios;
}

}  // namespace

std::vector<std::string> scenario_names() {
  std::vector<std::string> names;
  for (const Scenario& s : kScenarios) names.push_back(s.name);
  return names;
}

namespace {

void write_json(const nlohmann::json& out, const std::string& path) {
  std::ofstream f(path);
  check(bool(f), "bench: cannot write ", path);
  f << out.dump(2) << "\n";
  check(bool(f.flush()), "bench: writing ", path, " failed");
  std::printf("\nwrote %s\n", path.c_str());
}

// --model: the chosen scenario on one checkpoint (no second model to compare with).
int run_checkpoint_scenarios(const ScenarioOptions& o) {
  std::fprintf(stderr, "  loading %s\n", o.model_dir.c_str());
  const ModelWeights weights = load_weights(o.model_dir);
  const std::string name = weights.config.architecture_name();
  std::printf("asynct bench: %s (%s), lengths / %d, device %s, median of %d run%s\n", o.model_dir.c_str(), name.c_str(),
              o.scale, o.device.c_str(), o.repeat, o.repeat == 1 ? "" : "s");
  std::printf("\n%-18s %10s %12s %16s\n", "scenario", "seconds", "tokens/s", "output tokens/s");
  nlohmann::json results = nlohmann::json::array();
  std::vector<std::string> lines;
  for (const Scenario& s : kScenarios) {
    if (o.only.empty() ? s.by_name_only : o.only != s.name) continue;
    if (o.warmup && o.device == "cuda") run_scenario(s, weights, "untimed", o);  // loads the scenario's kernels
    std::vector<Run> runs;
    for (int r = 0; r < o.repeat; ++r) runs.push_back(run_scenario(s, weights, "timed", o));
    const Run& m = median_run(runs);
    const double output_tokens = double(s.requests) * std::max(1, s.output / o.scale);
    char line[160];
    std::snprintf(line, sizeof line, "%-18s %10.3f %12.1f %16.1f", s.name, m.seconds, double(m.tokens) / m.seconds,
                  output_tokens / m.seconds);
    lines.push_back(line);
    lines.push_back(breakdown(s.name, name.c_str(), m));
    results.push_back({{"scenario", s.name}, {"seconds", m.seconds}, {"tokens", m.tokens},
                       {"output_tokens_per_second", output_tokens / m.seconds}, {"steps", m.steps},
                       {"decode_steps", m.decode_steps}, {"decode_step_ms", m.decode_step_ms},
                       {"drafted_tokens", m.drafted_tokens}, {"accepted_tokens", m.accepted_tokens},
                       {"phase_ms", m.phase_ms}, {"seconds_each_run", seconds_of(runs)}});
  }
  for (const std::string& l : lines) std::printf("%s\n", l.c_str());
  if (!o.json_path.empty())
    write_json({{"model", o.model_dir}, {"architecture", name}, {"scale", o.scale}, {"device", o.device},
                {"results", results}}, o.json_path);
  return 0;
}

}  // namespace

int run_scenarios(const ScenarioOptions& options) {
  // Every option is checked before anything is printed or made (a 1.7B model's random weights
  // take most of a minute on a few cores).
  if (!options.only.empty()) {
    const std::vector<std::string> names = scenario_names();
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    check(std::find(names.begin(), names.end(), options.only) != names.end(), "bench: no scenario named '",
          options.only, "' (the scenarios: ", list, ")");
  }
  // The scenarios are defined at the 1.7B size; on the CPU that takes hours, so there the
  // defaults are the tiny model at 1/64 of the lengths.
  ScenarioOptions o = options;
  o.device = resolve_device(o.device, o.cpu_reference);
  require_device(o.device);
  const bool gpu = o.device == "cuda";
  {
    RunnerOptions options_check;
    options_check.kv_cache_dtype = o.kv_cache_dtype;
    options_check.quantization = o.quantization;
    options_check.cpu_reference = o.cpu_reference;
    check_runner_options(options_check, o.device);  // before any weights are made
    validate_speculative(o.speculative, /*allow_forced=*/true);
  }
  if (o.config == "auto") o.config = gpu ? "1.7b" : "tiny";
  if (o.scale == 0) o.scale = gpu ? 1 : 64;
  check(o.config == "tiny" || o.config == "1.7b", "bench: --config must be tiny, 1.7b or auto");
  check(o.scale >= 1, "bench: --scale must be >= 1");
  check(o.repeat >= 1, "bench: --repeat must be >= 1");
  if (!o.model_dir.empty()) {
    check(!o.only.empty(), "bench: --model runs one scenario: name it with --scenario");
    return run_checkpoint_scenarios(o);
  }
  std::printf("asynct bench: %s config, lengths / %d, device %s, median of %d run%s per model\n", o.config.c_str(),
              o.scale, o.device.c_str(), o.repeat, o.repeat == 1 ? "" : "s");
  nlohmann::json results = nlohmann::json::array();
  std::printf("\n%-18s %10s %10s %10s %12s %12s  %s\n", "scenario", "asynct s", "qwen3 s", "ratio",
              "asynct tok/s", "qwen3 tok/s", "ratio per repeat (min-max)");
  std::vector<std::string> lines;
  for (const Scenario& s : kScenarios) {
    if (o.only.empty() ? s.by_name_only : o.only != s.name) continue;
    // Each model `repeat` times, the order alternating so that neither always runs first;
    // the run with the median time stands for the model.
    std::vector<Run> asynct_runs, qwen3_runs;
    if (o.warmup && gpu) {
      // CUDA loads a kernel on its first launch (lazy loading). A scenario's odd chunk sizes
      // pick GEMM kernels that the warm-up's shapes do not, and whichever model ran first paid
      // for loading them inside its timed run (prefill_heavy on the H200: +17 ms of host
      // launch and +19 ms of GEMM time over 10 steps for the first model). One untimed run of
      // the scenario loads them for both. (Loading every kernel at start-up instead,
      // CUDA_MODULE_LOADING=EAGER, measured ~100 s per start.)
      std::fprintf(stderr, "  %s: untimed first run\n", s.name);
      run_scenario(s, weights_for(Architecture::AsyncT, o), "asynct", o);
    }
    for (int r = 0; r < o.repeat; ++r) {
      if (r % 2 == 0) {
        asynct_runs.push_back(run_scenario(s, weights_for(Architecture::AsyncT, o), "asynct", o));
        qwen3_runs.push_back(run_scenario(s, weights_for(Architecture::Qwen3, o), "qwen3", o));
      } else {
        qwen3_runs.push_back(run_scenario(s, weights_for(Architecture::Qwen3, o), "qwen3", o));
        asynct_runs.push_back(run_scenario(s, weights_for(Architecture::AsyncT, o), "asynct", o));
      }
    }
    const Run& a = median_run(asynct_runs);
    const Run& q = median_run(qwen3_runs);
    const std::vector<double> ratios = ratio_each_run(asynct_runs, qwen3_runs);
    const auto [lowest, highest] = std::minmax_element(ratios.begin(), ratios.end());
    char line[256];
    std::snprintf(line, sizeof line, "%-18s %10.3f %10.3f %9.3fx %12.1f %12.1f  %.3f-%.3f", s.name, a.seconds,
                  q.seconds, a.seconds / q.seconds, double(a.tokens) / a.seconds, double(q.tokens) / q.seconds, *lowest,
                  *highest);
    lines.push_back(line);
    results.push_back({{"scenario", s.name}, {"asynct_seconds", a.seconds}, {"qwen3_seconds", q.seconds},
                       {"ratio", a.seconds / q.seconds}, {"tokens", a.tokens}, {"asynct_steps", a.steps},
                       {"qwen3_steps", q.steps}, {"asynct_step_ms", a.seconds * 1e3 / double(std::max<std::int64_t>(a.steps, 1))},
                       {"qwen3_step_ms", q.seconds * 1e3 / double(std::max<std::int64_t>(q.steps, 1))},
                       {"asynct_decode_steps", a.decode_steps}, {"qwen3_decode_steps", q.decode_steps},
                       {"asynct_decode_step_ms", a.decode_step_ms}, {"qwen3_decode_step_ms", q.decode_step_ms},
                       {"asynct_pipelined_steps", a.pipelined_steps}, {"qwen3_pipelined_steps", q.pipelined_steps},
                       {"asynct_drafted_tokens", a.drafted_tokens}, {"asynct_accepted_tokens", a.accepted_tokens},
                       {"qwen3_drafted_tokens", q.drafted_tokens}, {"qwen3_accepted_tokens", q.accepted_tokens},
                       {"asynct_phase_ms", a.phase_ms}, {"qwen3_phase_ms", q.phase_ms},
                       {"asynct_seconds_each_run", seconds_of(asynct_runs)},
                       {"qwen3_seconds_each_run", seconds_of(qwen3_runs)}, {"ratio_each_run", ratios}});
    for (const auto& [label, run] : {std::pair{"asynct", &a}, std::pair{"qwen3", &q}})
      lines.push_back(breakdown(s.name, label, *run));
  }
  for (const std::string& l : lines) std::printf("%s\n", l.c_str());
  if (o.json_path.empty()) return 0;
  write_json({{"config", o.config}, {"scale", o.scale}, {"device", o.device}, {"results", results}}, o.json_path);
  return 0;
}

}  // namespace asynct
