// Files written so that a reader never sees half of one, and nothing but what was meant is
// ever deleted: every write goes to a fresh temporary name (`.<name>.<16 hex digits>`, created
// exclusively, never an existing file) in the destination's folder, is fsynced and checked
// through the close, and is renamed into place; a failure, or SIGINT / SIGTERM / SIGHUP
// (interrupt.hpp), removes only the temporary and leaves the destination as it was.
#pragma once
#include <string>

namespace ladder {

// Writes all of `bytes` to fd; false on an error (errno says which).
bool write_all(int fd, const std::string& bytes);

// Replaces (or creates) `path` with `bytes`, atomically as above, keeping an existing file's
// permissions; `path` must pass require_replaceable. `what` names the file in errors (e.g.
// "--csv results.csv"). Throws BadInput; the old file is untouched on failure.
void write_file_atomically(const std::string& path, const std::string& bytes,
                           const std::string& what);

// Throws BadInput unless `path` may be replaced by a write: a new path, or an existing regular
// file. A directory, FIFO, socket, device or symbolic link (even one to a regular file, whose
// link a rename would replace) is refused: the tools replace regular files only.
void require_replaceable(const std::string& path, const std::string& flag);

// Whether two paths name the same file (existing or not): the same inode, or the same path
// once "." and ".." and symbolic links of their folders are resolved.
bool same_file(const std::string& a, const std::string& b);

// An exclusive flock(2) of a folder while the object lives: the ladder's writers into one folder
// (a --save publish, a results CSV beside others) take turns. The lock is on the folder the path
// names when it is granted: one replaced under the same name meanwhile is locked anew.
class FolderLock {
 public:
  // wait: block until granted (BadInput if the folder cannot be opened); else held() says.
  explicit FolderLock(const std::string& dir, bool wait = true);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  bool held() const { return fd_ >= 0; }
  void release();

 private:
  int fd_ = -1;
};

// fsync(2) of a file or folder (its entries); false on an error.
bool sync_path(const std::string& path);

// Removes `path` and, for a folder, everything in it, links as links (never what they point
// to), making each folder writable first. Returns false if something was left.
bool remove_tree(const std::string& path);

// Throws BadInput unless `path` is a regular file (not a directory, FIFO, device, dangling
// or looping symbolic link); `flag` names the option it came from.
void require_regular_file(const std::string& path, const std::string& flag);

}  // namespace ladder
