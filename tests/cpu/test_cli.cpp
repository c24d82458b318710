// The asynct command line as a user meets it, run as a child process: errors are readable and
// come before any work, exit codes say what happened (0 done, 1 a bad command line, 2 an
// error, 3 a bug), --help shows every default, bench writes files only where asked and writes
// plain lines to a pipe. Ends with random argument vectors, each of which must exit 0, 1 or 2
// within a time limit.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#ifndef ASYNCT_BINARY
#error "ASYNCT_BINARY must name the asynct executable"
#endif

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int code = -1;       // exit status, or -1 when killed by a signal
  int signal = 0;      // the signal that ended it
  bool timed_out = false;
  std::string out, err;
  double seconds = 0;
  std::string describe() const {
    std::string s = timed_out ? "timed out" : signal ? "signal " + std::to_string(signal) : "exit " + std::to_string(code);
    return s + "\n--- stdout ---\n" + out.substr(0, 2000) + "\n--- stderr ---\n" + err.substr(0, 2000);
  }
};

// Runs asynct with the arguments in `cwd`, stdin from /dev/null, stdout and stderr to pipes,
// with no GPU visible (CUDA_VISIBLE_DEVICES empty: the same jobs on every machine); killed
// after timeout_s.
Outcome run_asynct(const std::vector<std::string>& args, const std::string& cwd, double timeout_s = 60) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) throw std::runtime_error("pipe failed");
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(120);
    const int null_in = ::open("/dev/null", O_RDONLY);
    dup2(null_in, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    std::vector<char*> argv;
    std::string binary = ASYNCT_BINARY;
    argv.push_back(binary.data());
    std::vector<std::string> copies = args;
    for (std::string& a : copies) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(121);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  Outcome o;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&o.out, &o.err};
  int open_pipes = 2;
  while (open_pipes > 0) {
    const double left = timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (left <= 0) {
      o.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, int(left * 1000) + 1) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[65536];
      const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, std::size_t(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_pipes;
      }
    }
  }
  for (const pollfd& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  waitpid(pid, &status, 0);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) o.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
  return o;
}

class Scratch {
 public:
  Scratch() {
    path_ = fs::temp_directory_path() / ("asynct_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() { fs::remove_all(path_); }
  std::string dir() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path_)) names.push_back(e.path().filename().string());
    return names;
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Cli, InitCheckpointOverAnExistingFileIsAnError) {
  Scratch s;
  { std::ofstream(s.file("taken")) << "x"; }
  const Outcome o = run_asynct({"init-checkpoint", "--out", s.file("taken")}, s.dir());
  EXPECT_EQ(o.code, 2) << o.describe();
  EXPECT_TRUE(contains(o.err, "is not a directory")) << o.describe();
  EXPECT_FALSE(contains(o.err, "internal error")) << o.describe();
}

TEST(Cli, AnUnknownScenarioListsTheNamesBeforeAnyOutput) {
  Scratch s;
  const Outcome o = run_asynct({"bench", "--scenario", "foo", "--scale", "4096"}, s.dir());
  EXPECT_TRUE(o.code == 1 || o.code == 2) << o.describe();
  for (const char* name : {"long_prefill_b4", "prefill_heavy_b16", "decode_heavy_b32", "long_decode_b32", "decode_b1"})
    EXPECT_TRUE(contains(o.err, name)) << name << "\n" << o.describe();
  EXPECT_FALSE(contains(o.out, "asynct s")) << "the table header came before the error\n" << o.describe();
}

TEST(Cli, BenchChecksTheDeviceBeforeMakingWeights) {
  Scratch s;
  const Outcome o = run_asynct({"bench", "--device", "cuda", "--config", "tiny", "--scale", "4096", "--scenario",
                                "decode_b1"},
                               s.dir());
  EXPECT_EQ(o.code, 2) << o.describe();
  EXPECT_FALSE(contains(o.err, "making random")) << o.describe();
  EXPECT_FALSE(contains(o.out, "asynct s")) << o.describe();
  EXPECT_TRUE(contains(o.err, "cuda") || contains(o.err, "CUDA") || contains(o.err, "GPU")) << o.describe();
}

TEST(Cli, OutOfRangeAndMalformedNumbersGiveReadableErrors) {
  Scratch s;
  const std::vector<std::vector<std::string>> cases = {
      {"generate", "--top-k", "-1"},       {"generate", "--num-blocks", "-1"},
      {"generate", "--max-tokens", "abc"}, {"generate", "--max-tokens", "0"},
      {"generate", "--temperature", "x"},  {"demo", "--q-heads", "1.5"},
      {"bench", "--repeat", "-3"},         {"generate", "--seed", "-1"}};
  for (const auto& args : cases) {
    const Outcome o = run_asynct(args, s.dir());
    SCOPED_TRACE(args[1] + " " + args[2]);
    EXPECT_EQ(o.code, 1) << o.describe();
    EXPECT_TRUE(contains(o.err, args[1])) << o.describe();    // names the option
    EXPECT_TRUE(contains(o.err, "'" + args[2] + "'")) << o.describe();  // quotes the value
    EXPECT_FALSE(std::regex_search(o.err, std::regex("[0-9]{30}"))) << "a 300-digit bound\n" << o.describe();
    EXPECT_LT(o.err.size(), 600u) << o.describe();
  }
  const Outcome abc = run_asynct({"generate", "--max-tokens", "abc"}, s.dir());
  EXPECT_FALSE(contains(abc.err, "range")) << "'abc' is not a number, not a number out of range\n" << abc.describe();
  EXPECT_TRUE(contains(abc.err, "integer")) << abc.describe();
}

TEST(Cli, HelpShowsEveryDefault) {
  Scratch s;
  for (const char* command : {"generate", "bench", "demo", "init-checkpoint"}) {
    const Outcome o = run_asynct({command, "--help"}, s.dir());
    ASSERT_EQ(o.code, 0) << o.describe();
    std::istringstream lines(o.out);
    std::string line;
    int options = 0;
    while (std::getline(lines, line)) {
      // An option that takes a value: "  --name TYPE[:check][=default] ..." (flags have no TYPE).
      std::smatch m;
      if (!std::regex_search(line, m, std::regex("^\\s+(--[a-z-]+) ((INT|UINT|FLOAT|TEXT)\\S*)"))) continue;
      ++options;
      // Options whose absence is the default: their descriptions say what that means.
      static const std::set<std::string> unset = {"--model", "--prompt", "--logits", "--out", "--scenario", "--json"};
      if (unset.count(m[1])) continue;
      EXPECT_NE(m[2].str().find('='), std::string::npos) << command << ": no default shown in\n" << line;
    }
    EXPECT_GT(options, 1) << command << "\n" << o.out;
  }
  const Outcome gen = run_asynct({"generate", "--help"}, s.dir());
  EXPECT_TRUE(std::regex_search(gen.out, std::regex("--max-tokens [^ \n]*=16\\s"))) << gen.out;
  const Outcome bench = run_asynct({"bench", "--help"}, s.dir());
  EXPECT_TRUE(std::regex_search(bench.out, std::regex("--device [^ \n]*=auto\\s"))) << bench.out;
}

TEST(Cli, BenchWritesJsonOnlyWhereAskedAndPlainLinesToAPipe) {
  Scratch s;
  const Outcome o = run_asynct({"bench", "--scale", "4096", "--scenario", "decode_b1"}, s.dir());
  ASSERT_EQ(o.code, 0) << o.describe();
  EXPECT_TRUE(s.entries().empty()) << "bench wrote " << s.entries().front() << " in the working directory";
  EXPECT_FALSE(contains(o.err, "\r")) << "carriage returns in the progress written to a pipe\n" << o.describe();
  EXPECT_TRUE(contains(o.err, "decode_b1")) << o.describe();  // a progress line per run

  const Outcome with_json = run_asynct({"bench", "--scale", "4096", "--scenario", "decode_b1", "--json", "r.json"}, s.dir());
  ASSERT_EQ(with_json.code, 0) << with_json.describe();
  EXPECT_TRUE(fs::exists(s.file("r.json")));
}

TEST(Cli, CommandLineErrorsExitWithOne) {
  Scratch s;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--nope"}, {"generate", "--device", "gpu"}, {"init-checkpoint"}, {"bench", "extra"},
        {"generate", "--max-tokens"}}) {
    const Outcome o = run_asynct(args, s.dir());
    EXPECT_EQ(o.code, 1) << args[0] << "\n" << o.describe();
    EXPECT_FALSE(o.err.empty()) << o.describe();
  }
}

// Random argument vectors: a subcommand, then options with values drawn from cheap valid values
// and broken ones. Each run must end by itself with 0, 1 or 2 (never a signal, a sanitizer
// report or an internal error). Options that would start long jobs (the 1.7B size, full-length
// scenarios, a million tokens) only get values that keep the job small; no GPU is visible to
// the child. Bounded: at most kRuns runs or kBudget seconds, whichever comes first.
TEST(CliFuzz, RandomArgumentsExitWithZeroOneOrTwo) {
  constexpr int kRuns = 150;
  constexpr double kBudget = 20.0, kPerRun = 20.0;
  Scratch s;
  const std::vector<std::string> junk = {"", "-", "--", "-x", "--=", "--max-tokens=3", "abc", "1", "-1", "\xff\xfe", "--help"};
  const std::vector<std::string> counts = {"0", "1", "2", "3", "-1", "abc", "", "1e3", "2.5", "99999999999999999999",
                                           "2147483648", "0x10", " 7"};
  const std::vector<std::string> reals = {"0", "0.5", "1", "-1", "nan", "inf", "-inf", "1e39", "abc", "", "101"};
  const std::vector<std::string> paths = {"out", "out.json", "", ".", "/dev/null", "nodir/x", "out/../out2"};
  struct Opt {
    std::string name;
    std::vector<std::string> values;  // empty: a flag
  };
  const std::vector<std::pair<std::string, std::vector<Opt>>> commands = {
      {"generate",
       {{"--model", {"", ".", "/dev/null", "nowhere"}},
        {"--builtin", {"asynct", "qwen3", "llama"}},
        {"--prompt", {"1,2,3", "1,x", "", ",", "99999", "255", "-1", "0", "1,,2", "4294967296"}},
        {"--max-tokens", {"1", "4", "0", "-1", "abc", "1048577"}},
        {"--temperature", reals},
        {"--top-k", {"0", "1", "5", "-1", "300", "abc"}},
        {"--top-p", reals},
        {"--seed", {"0", "7", "-1", "18446744073709551615", "18446744073709551616", "abc"}},
        {"--block-size", {"1", "16", "4096", "0", "-5", "abc"}},
        {"--num-blocks", {"0", "2", "64", "-1", "abc"}},
        {"--max-batched-tokens", {"1", "2", "64", "0", "abc"}},
        {"--eos", {"-1", "0", "3", "abc", "99999"}},
        {"--no-ignore-eos", {}},
        {"--no-cuda-graphs", {}},
        {"--no-pipeline", {}},
        {"--device", {"auto", "cpu", "cuda", "gpu"}},
        {"--logits", paths}}},
      {"demo",
       {{"--q-heads", {"1", "8", "3", "0", "-1", "abc", "257"}},
        {"--kv-heads", {"1", "2", "3", "0"}},
        {"--head-dim", {"1", "2", "64", "7", "0", "1025"}},
        {"--block-size", {"1", "16", "0"}},
        {"--window", {"1", "3", "64", "0", "65"}},
        {"--seed", {"0", "5", "-1"}}}},
      {"init-checkpoint",
       {{"--arch", {"asynct", "qwen3", "llama"}},
        {"--config", {"tiny", "huge", ""}},
        {"--seed", {"0", "3", "abc"}},
        {"--out", paths}}},
      {"bench",
       {{"--config", {"auto", "tiny", "huge"}},
        {"--scale", {"4096", "abc", "-1", "99999999999"}},
        {"--scenario", {"decode_b1", "foo", ""}},
        {"--json", paths},
        {"--seed", {"0", "1", "abc"}},
        {"--profile", {}},
        {"--no-cuda-graphs", {}},
        {"--no-pipeline", {}},
        {"--no-warmup", {}},
        {"--repeat", {"1", "2", "0", "101", "x"}},
        {"--device", {"auto", "cpu", "cuda", "tpu"}}}},
      {"", {}},
      {"nope", {}}};
  std::mt19937 rng(2024);
  auto pick = [&](std::size_t n) { return std::size_t(std::uniform_int_distribution<std::size_t>(0, n - 1)(rng)); };
  const auto start = std::chrono::steady_clock::now();
  int runs = 0, by_code[3] = {0, 0, 0};
  for (; runs < kRuns; ++runs) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kBudget) break;
    const auto& [command, options] = commands[pick(commands.size())];
    std::vector<std::string> args;
    if (!command.empty()) args.push_back(command);
    const std::size_t n = pick(5);
    for (std::size_t i = 0; i < n; ++i) {
      if (options.empty() || pick(8) == 0) {
        args.push_back(junk[pick(junk.size())]);
        continue;
      }
      const Opt& opt = options[pick(options.size())];
      args.push_back(opt.name);
      if (!opt.values.empty() && pick(10) != 0) args.push_back(opt.values[pick(opt.values.size())]);
      else if (opt.values.empty() && pick(10) == 0) args.push_back(counts[pick(counts.size())]);
    }
    // Scenarios at full length run for minutes on the CPU, and even at 1/4096 of the lengths
    // the default set takes ~25 s in the sanitizer build: bench gets a small scale and the
    // one-request scenario (0.5 s there) unless the vector names its own (then its value is
    // one of the cheap or broken ones above).
    for (const char* option : {"--scale", "--scenario"})
      if (command == "bench" && std::find(args.begin(), args.end(), option) == args.end()) {
        args.push_back(option);
        args.push_back(option == std::string("--scale") ? "4096" : "decode_b1");
      }
    std::string shown;
    for (const std::string& a : args) shown += " '" + a + "'";
    const Outcome o = run_asynct(args, s.dir(), kPerRun);
    EXPECT_TRUE(!o.timed_out && o.signal == 0 && o.code >= 0 && o.code <= 2)
        << "asynct" << shown << "\n" << o.describe();
    EXPECT_FALSE(contains(o.err, "internal error")) << "asynct" << shown << "\n" << o.describe();
    if (o.code >= 0 && o.code <= 2) ++by_code[o.code];
  }
  std::printf("%d runs: %d exited 0, %d exited 1 (command line), %d exited 2 (error)\n", runs, by_code[0], by_code[1],
              by_code[2]);
  EXPECT_GE(runs, 10) << "fewer runs than planned fit in the time budget";
}

}  // namespace
