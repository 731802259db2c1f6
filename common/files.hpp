// Files written so that a reader never sees half of one, and nothing but what was meant is
// ever deleted: every write goes to a fresh temporary name (created exclusively, never an
// existing file) in the destination's folder, is checked through the close, and is renamed
// into place; a failure removes only the temporary and leaves the destination as it was.
#pragma once
#include <string>

namespace ladder {

// Creates `.<base>.<random>` in dir exclusively; returns its path and an open descriptor.
// Throws BadInput.
std::string create_unique_file(const std::string& dir, const std::string& base, int& fd);

// Writes all of `bytes` to fd; false on an error (errno says which).
bool write_all(int fd, const std::string& bytes);

// Replaces (or creates) `path` with `bytes`, atomically as above; `path` must pass
// require_replaceable. `what` names the file in errors (e.g. "--csv results.csv"). Throws
// BadInput; the old file is untouched on failure.
void write_file_atomically(const std::string& path, const std::string& bytes,
                           const std::string& what);

// Throws BadInput unless `path` may be replaced by a write: a new path, or an existing regular
// file. A directory, FIFO, socket, device or symbolic link (even one to a regular file, whose
// link a rename would replace) is refused: the tools replace regular files only.
void require_replaceable(const std::string& path, const std::string& flag);

// Whether two paths name the same file (existing or not): the same inode, or the same path
// once "." and ".." and symbolic links of their folders are resolved.
bool same_file(const std::string& a, const std::string& b);

// Throws BadInput unless `path` is a regular file (not a directory, FIFO, device, dangling
// or looping symbolic link); `flag` names the option it came from.
void require_regular_file(const std::string& path, const std::string& flag);

}  // namespace ladder
