// Runs the asynct executable as a child process, as a user would: stdin from /dev/null,
// stdout and stderr captured, no GPU visible (CUDA_VISIBLE_DEVICES empty: the same jobs on
// every machine), killed after a time limit; the exit code or signal, the time and the peak
// memory come back. The test target defines ASYNCT_BINARY, the executable's path.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef ASYNCT_BINARY
#error "ASYNCT_BINARY must name the asynct executable"
#endif

namespace asynct::testing {

struct Outcome {
  int code = -1;       // exit status, or -1 when killed by a signal
  int signal = 0;      // the signal that ended it
  bool timed_out = false;
  std::string out, err;
  double seconds = 0;
  long max_rss_mb = 0;  // the child's peak resident memory
  std::string describe() const {
    std::string s = timed_out ? "timed out" : signal ? "signal " + std::to_string(signal) : "exit " + std::to_string(code);
    return s + "\n--- stdout ---\n" + out.substr(0, 2000) + "\n--- stderr ---\n" + err.substr(0, 2000);
  }
};

// Runs asynct with the arguments in `cwd`; killed after timeout_s.
inline Outcome run_asynct(const std::vector<std::string>& args, const std::string& cwd, double timeout_s = 60) {
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
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  o.max_rss_mb = usage.ru_maxrss / 1024;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) o.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
  return o;
}

}  // namespace asynct::testing
