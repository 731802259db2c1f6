#include "interrupt.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace ladder {

namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr int kNumSignals = sizeof kSignals / sizeof kSignals[0];
// A publisher's staging holds a folder, a subfolder per step and five files per step: far
// fewer than this.
constexpr int kMaxPaths = 512;

// Shared with the handler: lock-free atomics only, and paths that stay valid while counted.
const char* g_paths[kMaxPaths];
std::atomic<int> g_count{0};
std::atomic<int> g_signal{0};  // the first signal caught (0: none)
// What a signal does now. kNormal: the handler removes the paths and ends the process
// (kDying); kDeferring: it only marks the signal (kDeferred) for the deferral's end.
enum State { kNormal, kDeferring, kDying, kDeferred };
std::atomic<int> g_state{kNormal};
// The main thread's alone.
int g_scopes = 0, g_deferrals = 0;
struct sigaction g_old[kNumSignals];
bool g_installed[kNumSignals] = {};

// Async-signal-safe: unlink() and rmdir() only.
void remove_registered() {
  for (int i = g_count.load() - 1; i >= 0; --i)
    if (::unlink(g_paths[i]) != 0) ::rmdir(g_paths[i]);
}

// Restores the actions found at the start and raises `sig` again: in a handler it is delivered
// when the handler returns, elsewhere at once.
void end_with(int sig) {
  for (int k = 0; k < kNumSignals; ++k)
    if (g_installed[k]) ::sigaction(kSignals[k], &g_old[k], nullptr);
  ::raise(sig);
}

void on_signal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);  // the first one is the one raised again
  int state = kNormal;
  if (g_state.compare_exchange_strong(state, kDying)) {
    remove_registered();
    end_with(g_signal.load());
    return;
  }
  if (state == kDeferring) g_state.compare_exchange_strong(state, kDeferred);
  // kDying: another thread is ending the process; kDeferred: already marked.
}

// Another thread's handler is removing the registered paths and will end the process.
[[noreturn]] void wait_for_the_end() {
  for (;;) ::pause();
}

}  // namespace

SignalCleanup::SignalCleanup() : base_(g_count.load()) {
  if (g_scopes++ > 0) return;
  for (int k = 0; k < kNumSignals; ++k) {
    struct sigaction now {};
    ::sigaction(kSignals[k], nullptr, &now);
    g_installed[k] = now.sa_handler != SIG_IGN;  // nohup's SIGHUP, a background job's SIGINT
    if (!g_installed[k]) continue;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int s : kSignals) sigaddset(&sa.sa_mask, s);
    sa.sa_flags = SA_RESTART;
    ::sigaction(kSignals[k], &sa, &g_old[k]);
  }
}

SignalCleanup::~SignalCleanup() {
  SignalDeferral defer;
  forget();
  if (--g_scopes > 0) return;
  for (int k = 0; k < kNumSignals; ++k)
    if (g_installed[k]) ::sigaction(kSignals[k], &g_old[k], nullptr), g_installed[k] = false;
}

void SignalCleanup::will_create(const std::string& path) {
  const int n = g_count.load();
  if (n == kMaxPaths) throw std::logic_error("SignalCleanup: too many paths registered");
  g_paths[n] = ::strdup(path.c_str());
  if (!g_paths[n]) throw std::bad_alloc();
  g_count.store(n + 1);
}

void SignalCleanup::did_create(const std::string& path) {
  // A handler that began before the path was counted set kDying first: it is seen here.
  if (g_state.load() == kDying) {
    if (::unlink(path.c_str()) != 0) ::rmdir(path.c_str());
    wait_for_the_end();
  }
}

void SignalCleanup::cancel_last() {
  const int n = g_count.load();
  if (n > base_) g_count.store(n - 1);  // its string is not freed: a handler may be reading it
}

void SignalCleanup::forget() {
  const int n = g_count.exchange(base_);
  for (int i = base_; i < n; ++i) std::free(const_cast<char*>(g_paths[i]));
}

SignalDeferral::SignalDeferral() {
  if (g_deferrals++ > 0) return;
  int state = kNormal;
  if (!g_state.compare_exchange_strong(state, kDeferring)) wait_for_the_end();  // kDying
}

SignalDeferral::~SignalDeferral() {
  if (--g_deferrals > 0) return;
  int state = kDeferring;
  if (g_state.compare_exchange_strong(state, kNormal)) return;
  g_state.store(kDying);  // kDeferred: a signal came meanwhile
  remove_registered();
  end_with(g_signal.load());
}

}  // namespace ladder
