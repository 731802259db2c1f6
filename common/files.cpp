#include "files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "error.hpp"
#include "interrupt.hpp"

namespace ladder {

namespace fs = std::filesystem;

namespace {

// Creates `.<base>.<random>` in dir exclusively, registered with `cleanup`; returns its path
// and an open descriptor. Throws BadInput.
std::string create_unique_file(const std::string& dir, const std::string& base, int& fd,
                               SignalCleanup& cleanup) {
  static std::mt19937_64 rng(std::random_device{}());
  const fs::path d = dir.empty() ? fs::path(".") : fs::path(dir);
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
    const std::string p = (d / ("." + base + "." + suffix)).string();
    cleanup.will_create(p);
    fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      cleanup.did_create(p);
      return p;
    }
    cleanup.cancel_last();
    if (errno != EEXIST) break;
  }
  throw BadInput((d / base).string() +
                 ": cannot create a temporary file there: " + std::strerror(errno));
}

}  // namespace

bool write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += size_t(w);
  }
  return true;
}

void write_file_atomically(const std::string& path, const std::string& bytes,
                           const std::string& what) {
  std::error_code ec;
  const fs::path p(path);
  require_replaceable(path, what);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  SignalCleanup cleanup;  // a signal before the rename removes the temporary
  int fd = -1;
  const std::string tmp = create_unique_file(p.has_parent_path() ? p.parent_path().string() : ".",
                                             p.filename().string(), fd, cleanup);
  struct stat old {};
  if (::stat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode)) ::fchmod(fd, old.st_mode & 07777);
  const bool written = write_all(fd, bytes) && ::fsync(fd) == 0;
  const int err = errno;
  const bool closed = ::close(fd) == 0;
  SignalDeferral defer;  // from here a signal waits for the rename or the removal
  if (!written || !closed) {
    fs::remove(tmp, ec);
    throw BadInput(what + ": cannot write: " + std::strerror(written ? errno : err) +
                   "; the file was left as it was");
  }
  // Checked again at the last moment: something other than a file may have appeared there.
  const fs::file_type now = fs::symlink_status(p, ec).type();
  if (now != fs::file_type::not_found && now != fs::file_type::regular) {
    fs::remove(tmp, ec);
    throw BadInput(what + ": is no longer a regular file; nothing was written");
  }
  fs::rename(tmp, p, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw BadInput(what + ": cannot replace the file: " + why + "; it was left as it was");
  }
  cleanup.forget();
  sync_path(p.has_parent_path() ? p.parent_path().string() : ".");
}

void require_replaceable(const std::string& path, const std::string& flag) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);  // the path itself, not a target
  if (ec && ec != std::errc::no_such_file_or_directory) throw BadInput(flag + ": " + ec.message());
  switch (st.type()) {
    case fs::file_type::not_found:
    case fs::file_type::regular:
      return;
    case fs::file_type::directory:
      throw BadInput(flag + ": " + path + " is a directory, not a file");
    case fs::file_type::symlink:
      throw BadInput(flag + ": " + path +
                     " is a symbolic link; the tools replace regular files only (give the "
                     "file it points to)");
    default:
      throw BadInput(flag + ": " + path +
                     " is not a regular file (a FIFO, socket or device); the tools replace "
                     "regular files only");
  }
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  if (fs::exists(a, ea) && fs::exists(b, eb)) return fs::equivalent(a, b, ea);
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, ea), ea),
                 cb = fs::weakly_canonical(fs::absolute(b, eb), eb);
  return ca == cb;
}

FolderLock::FolderLock(const std::string& dir, bool wait) {
  const std::string d = dir.empty() ? "." : dir;
  for (;;) {
    const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
      if (!wait) return;
      throw BadInput(d + ": cannot open the folder to lock it: " + std::strerror(errno));
    }
    int rc;
    while ((rc = ::flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB))) != 0 && errno == EINTR) {
    }
    struct stat locked {};
    struct stat named {};
    if (rc == 0 && ::fstat(fd, &locked) == 0 && ::stat(d.c_str(), &named) == 0 &&
        locked.st_dev == named.st_dev && locked.st_ino == named.st_ino) {
      fd_ = fd;
      return;
    }
    ::close(fd);
    if (!wait) return;  // taken, or no longer the folder named
  }
}

FolderLock::~FolderLock() {
  release();
}

void FolderLock::release() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  fd_ = -1;
}

bool sync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

bool remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  if (!S_ISDIR(st.st_mode)) return ::unlink(path.c_str()) == 0 || errno == ENOENT;
  ::chmod(path.c_str(), 0700);  // a read-only folder's entries cannot be removed
  bool ok = true;
  std::error_code ec;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    ok = remove_tree(it->path().string()) && ok;
  return ::rmdir(path.c_str()) == 0 && ok && !ec;
}

void require_regular_file(const std::string& path, const std::string& flag) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows symbolic links
  if (ec && ec != std::errc::no_such_file_or_directory) {
    if (ec == std::errc::too_many_symbolic_link_levels)
      throw BadInput(flag + " " + path + ": a loop of symbolic links");
    throw BadInput(flag + " " + path + ": " + ec.message());
  }
  if (st.type() == fs::file_type::not_found) {
    const bool dangling = fs::is_symlink(fs::symlink_status(path, ec));
    throw BadInput(flag + " " + path +
                   (dangling ? ": a symbolic link to nothing" : ": no such file"));
  }
  if (st.type() == fs::file_type::directory)
    throw BadInput(flag + " " + path + ": is a directory, not a file");
  if (st.type() != fs::file_type::regular)
    throw BadInput(flag + " " + path +
                   ": not a regular file (a FIFO, socket or device is not read)");
}

}  // namespace ladder
