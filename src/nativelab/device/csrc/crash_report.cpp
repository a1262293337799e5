// If a crash happens anyway, say where: a handler for the fatal signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
// SIGABRT) that writes the device work running at that moment (the queue's unit: kind, name, core) and the op
// the thread was dispatching to the device, then hands the signal to the handler it replaced (Python's
// faulthandler, which prints the Python stacks, crash_report.py enables it). Only async-signal-safe calls in
// the handler: write(2) of strings the runtime keeps alive while they are noted.
#include "queue.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace nativelab {
namespace {

std::atomic<const char*> g_work_name{nullptr};
std::atomic<int> g_work_kind{0}, g_work_core{0};
thread_local const char* t_dispatching = nullptr;

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction g_previous[sizeof(kSignals) / sizeof(int)];
std::atomic<bool> g_installed{false};

void put(const char* s) {
  if (s != nullptr) (void)!::write(STDERR_FILENO, s, std::strlen(s));
}

void put_int(long v) {
  char buf[24];
  int i = sizeof buf;
  buf[--i] = '\0';
  const bool neg = v < 0;
  unsigned long u = neg ? -static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
  do buf[--i] = static_cast<char>('0' + u % 10); while ((u /= 10) != 0 && i > 1);
  if (neg && i > 0) buf[--i] = '-';
  put(buf + i);
}

void on_fatal_signal(int sig, siginfo_t* info, void* ctx) {
  put("\nnativelab: fatal signal ");
  put_int(sig);
  const char* work = g_work_name.load();
  if (work != nullptr) {
    put(" while the device ran ");
    put(kind_name(static_cast<WorkKind>(g_work_kind.load())));
    put(" '");
    put(work);
    put("' on neuron:");
    put_int(g_work_core.load());
  }
  if (t_dispatching != nullptr) {
    put(work != nullptr ? ", launched from '" : " while dispatching '");
    put(t_dispatching);
    put("' to the device");
  }
  put(" (please report it with the stack below)\n");
  size_t k = 0;
  while (kSignals[k] != sig) ++k;
  const struct sigaction& prev = g_previous[k];
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, ctx);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  } else {  // nobody else: die of the signal as the process would have
    sigaction(sig, &prev, nullptr);
    raise(sig);
  }
}

}  // namespace

RunningWorkNote::RunningWorkNote(WorkKind kind, const char* name, int core) noexcept
    : previous_(g_work_name.load(std::memory_order_relaxed)) {
  g_work_kind.store(static_cast<int>(kind), std::memory_order_relaxed);
  g_work_core.store(core, std::memory_order_relaxed);
  g_work_name.store(name, std::memory_order_relaxed);
}
RunningWorkNote::~RunningWorkNote() { g_work_name.store(previous_, std::memory_order_relaxed); }

DispatchNote::DispatchNote(const char* name) noexcept : previous_(t_dispatching) { t_dispatching = name; }
DispatchNote::~DispatchNote() { t_dispatching = previous_; }

void install_crash_report() {
  if (g_installed.exchange(true)) return;
  struct sigaction act {};
  act.sa_sigaction = &on_fatal_signal;
  act.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;  // as faulthandler installs its own
  sigemptyset(&act.sa_mask);
  for (size_t k = 0; k < sizeof(kSignals) / sizeof(int); ++k) sigaction(kSignals[k], &act, &g_previous[k]);
}

}  // namespace nativelab
