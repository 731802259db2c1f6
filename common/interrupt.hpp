// Temporaries that SIGINT, SIGTERM or SIGHUP (Ctrl-C, `timeout`, a closed terminal) must not
// leave behind. While a SignalCleanup lives, such a signal first removes every path registered
// with it (newest first: files, then the folders they were in) and then takes its usual course:
// the process ends as that signal ends it. A step that must not be cut in the middle (the rename
// that publishes a folder or a file) runs inside a SignalDeferral: a signal that arrives then
// waits until the step is over, done or rolled back, and only then removes what is registered
// and ends the process. A signal the process ignored when the first cleanup began (nohup, a
// background job) stays ignored. SIGKILL cannot be caught: what it leaves is recognisable by
// name, and the next run removes it (publish.cpp, csv_append.cpp).
//
// The handlers may run on any thread (OpenMP's too) while the main thread goes on: will_create()
// and did_create() and the deferral's handshake make sure that nothing the main thread creates
// survives a signal, and that nothing is removed under a publish.
#pragma once
#include <string>

namespace ladder {

class SignalCleanup {
 public:
  SignalCleanup();   // installs the handlers (scopes nest; the outermost restores them)
  ~SignalCleanup();  // forgets its paths (their owner removed or published them)
  SignalCleanup(const SignalCleanup&) = delete;
  SignalCleanup& operator=(const SignalCleanup&) = delete;

  // Registers `path` (a file or a folder) before it is created ...
  void will_create(const std::string& path);
  // ... and is called once it exists: if a signal is already ending the process on another
  // thread, removes it and waits for the end.
  void did_create(const std::string& path);
  // Forgets the path registered last (it could not be created).
  void cancel_last();
  // Forgets every path this scope registered: they were published or removed. Call in a
  // SignalDeferral.
  void forget();

 private:
  int base_;  // the paths registered before this scope (scopes nest, last in first out)
};

class SignalDeferral {
 public:
  SignalDeferral();   // from here a signal waits
  ~SignalDeferral();  // a signal that came meanwhile: remove what is registered, then end
  SignalDeferral(const SignalDeferral&) = delete;
  SignalDeferral& operator=(const SignalDeferral&) = delete;
};

}  // namespace ladder
