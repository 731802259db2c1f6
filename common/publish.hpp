// A folder whose files all appear at once (--save): a kill at any instant leaves either the
// folder as it was or the folder with every new file, never a mix and never half a file.
//
// stage() writes each file, and fsyncs it, into a fresh staging folder beside the target,
// `.<name>.ladder-save.<16 hex digits>` in the target's parent, locked (flock) while its run
// lives. publish() then, holding the target's lock (FolderLock: saves into one folder take
// turns), carries everything else of the target over into the staging folder as hard links
// (the same files, not copies: other files and folders are kept whole), leaving out the names
// this publish replaces, and puts it in the target's place with ONE atomic step: a rename for
// a new target, else renameat2(RENAME_EXCHANGE), which swaps the two names at once. The old
// folder, now under the staging name, is then removed. SIGINT, SIGTERM and SIGHUP while staging
// remove the staging folder (SignalCleanup), and wait while publishing until the folder is
// complete (SignalDeferral). After a SIGKILL, the next publish into the same target removes the
// staging folders that no live run holds (the lock tells): only names of the form above.
#pragma once
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "files.hpp"
#include "interrupt.hpp"

namespace ladder {

// Throws BadInput (naming `flag`) unless `dir` can be published as a whole: a new path, or a
// folder (not a file, not a dangling link) that can be written, not a mount point, whose
// nearest existing parent can be written too (the publish renames in it).
void check_publish_target(const std::string& dir, const std::string& flag);

class FolderPublisher {
 public:
  // `target`: the folder; `owned`: the file names a publish replaces in each folder it writes
  // or clears (a stale dq.npy goes even when this publish writes no dq.npy); `what` names it in
  // messages ("--save out").
  FolderPublisher(std::string target, std::vector<std::string> owned, std::string what);
  ~FolderPublisher();  // an unpublished staging folder is removed
  FolderPublisher(const FolderPublisher&) = delete;
  FolderPublisher& operator=(const FolderPublisher&) = delete;

  // Writes `bytes` as target/sub/name (sub "": the target itself; else one subfolder).
  void stage(const std::string& sub, const std::string& name, const std::string& bytes);
  // target/sub is this publisher's too: its owned names go on publish, staged or not.
  void clear(const std::string& sub);
  // Puts the staged files in place, all at once; throws BadInput with the target as it was.
  // Returns a note for the user ("" mostly): when the working folder was in the target, a
  // shell there still sees the old folder until it changes into the new one.
  std::string publish();

 private:
  void begin_staging();
  void create_parents();
  void create_staging_folder();
  void remove_stale_staging() const;
  void stage_subfolder(const std::string& sub);
  bool publish_new();
  bool publish_over();
  void carry_over(const std::string& from, const std::string& to, const std::string& rel);
  bool replaced(const std::string& rel, const std::string& name) const;
  bool exchange();  // true when the working folder was in the target
  void roll_back();
  std::string staging_prefix() const;

  std::string target_, what_;
  std::vector<std::string> owned_;
  std::set<std::string> subs_, staged_;  // folders (relative) this publish owns; files staged
  std::string path_, parent_, staging_;  // absolute
  std::vector<std::string> created_parents_, staging_dirs_;
  std::optional<SignalCleanup> cleanup_;  // from the first staged path to the end
  std::optional<FolderLock> staging_lock_;
  bool done_ = false;
};

}  // namespace ladder
