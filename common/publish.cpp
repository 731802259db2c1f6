#include "publish.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>  // renameat2, RENAME_EXCHANGE (glibc 2.28)
#include <cstring>
#include <filesystem>
#include <random>

#include "error.hpp"

namespace ladder {

namespace fs = std::filesystem;

namespace {

const std::string kStagingTag = ".ladder-save.";
constexpr size_t kNameKept = 200;  // of the target's name, in its staging folder's (NAME_MAX 255)

std::string random_hex16() {
  static std::mt19937_64 rng(std::random_device{}());
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(rng()));
  return b;
}

bool is_hex16(const std::string& s) {
  return s.size() == 16 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Any publish's staging folder: `.<name>.ladder-save.<16 hex>`.
bool is_staging_name(const std::string& name) {
  const size_t at = name.rfind(kStagingTag);
  return name.size() > 1 && name[0] == '.' && at != std::string::npos && at > 0 &&
         is_hex16(name.substr(at + kStagingTag.size()));
}

// A temporary left by the saves before this design, which renamed files one by one:
// `.<owned>.<16 hex>` and `.<owned>.old.<16 hex>`.
bool is_old_temporary(const std::string& name, const std::vector<std::string>& owned) {
  for (const std::string& o : owned)
    for (const char* middle : {".", ".old."}) {
      const std::string head = "." + o + middle;
      if (name.size() == head.size() + 16 && name.compare(0, head.size(), head) == 0 &&
          is_hex16(name.substr(head.size())))
        return true;
    }
  return false;
}

std::string errno_text() {
  return std::strerror(errno);
}

// The absolute path, "." and ".." and the links of its existing part resolved.
std::string resolved(const std::string& dir) {
  std::error_code ec;
  std::string s = fs::weakly_canonical(fs::absolute(dir, ec), ec).string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

void sync_all(const std::vector<std::string>& dirs) {
  for (const std::string& d : dirs) sync_path(d);
}

}  // namespace

void check_publish_target(const std::string& dir, const std::string& flag) {
  const std::string where = flag + " " + dir;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st))
    throw BadInput(where + ": exists and is not a directory");
  if (!fs::exists(st) && fs::is_symlink(fs::symlink_status(dir, ec)))
    throw BadInput(where + ": a symbolic link to nothing");
  const std::string path = resolved(dir), parent = fs::path(path).parent_path().string();
  if (path == "/" || parent.empty())
    throw BadInput(where + ": the root folder cannot be replaced; give a folder below it");
  if (fs::is_directory(st)) {
    if (::access(path.c_str(), W_OK | X_OK) != 0)
      throw BadInput(where + ": the folder cannot be written (" + errno_text() + ")");
    struct stat t {};
    struct stat p {};
    if (::stat(path.c_str(), &t) == 0 && ::stat(parent.c_str(), &p) == 0) {
      if (t.st_dev != p.st_dev)
        throw BadInput(where +
                       ": a mount point; a save puts a new folder in its place by a "
                       "rename in the parent, so give a folder inside it");
      if ((p.st_mode & S_ISVTX) && t.st_uid != ::geteuid() && p.st_uid != ::geteuid() &&
          ::geteuid() != 0)
        throw BadInput(where + ": owned by another user in " + parent +
                       ", a sticky folder where only the owner may rename it");
    }
  }
  // The nearest existing parent: a publish creates the missing ones and renames in the last.
  fs::path up = parent;
  while (!fs::exists(up, ec) && up.has_parent_path() && up != up.parent_path())
    up = up.parent_path();
  if (!fs::is_directory(up, ec)) throw BadInput(where + ": " + up.string() + " is not a directory");
  if (::access(up.c_str(), W_OK | X_OK) != 0)
    throw BadInput(where + ": " + up.string() + " cannot be written (" + errno_text() +
                   "); a save puts its folder in place by a rename there");
}

FolderPublisher::FolderPublisher(std::string target, std::vector<std::string> owned,
                                 std::string what)
    : target_(std::move(target)), what_(std::move(what)), owned_(std::move(owned)) {}

FolderPublisher::~FolderPublisher() {
  if (!done_) roll_back();
}

std::string FolderPublisher::staging_prefix() const {
  return "." + fs::path(path_).filename().string().substr(0, kNameKept) + kStagingTag;
}

// On the first stage (or a publish of nothing): the paths, the missing parents, a sweep of
// stale staging folders, and a fresh one.
void FolderPublisher::begin_staging() {
  if (!staging_.empty()) return;
  std::error_code ec;
  if (fs::exists(target_, ec) && !fs::is_directory(target_, ec))
    throw BadInput(what_ + ": " + target_ + " exists and is not a directory");
  path_ = resolved(target_);
  parent_ = fs::path(path_).parent_path().string();
  if (path_ == "/" || parent_.empty())
    throw BadInput(what_ + ": the root folder cannot be replaced; give a folder below it");
  cleanup_.emplace();
  create_parents();
  remove_stale_staging();
  create_staging_folder();
}

// The target's missing parents, outermost first; removed again (when empty) by a failure or a
// signal before the publish.
void FolderPublisher::create_parents() {
  std::vector<std::string> missing;
  std::error_code ec;
  for (fs::path d = parent_; d != d.parent_path() && !fs::exists(d, ec); d = d.parent_path())
    missing.insert(missing.begin(), d.string());
  for (const std::string& d : missing) {
    cleanup_->will_create(d);
    if (::mkdir(d.c_str(), 0777) != 0) {
      cleanup_->cancel_last();
      if (errno == EEXIST) continue;  // made meanwhile by someone else: theirs
      throw BadInput(what_ + ": cannot create the folder " + target_ + ": " + d + ": " +
                     errno_text());
    }
    cleanup_->did_create(d);
    created_parents_.push_back(d);
  }
  if (!fs::is_directory(parent_, ec))
    throw BadInput(what_ + ": cannot create the folder " + target_ + ": " + parent_ +
                   " is not a directory");
}

// Staging folders of this target that no live run holds: left by a SIGKILL (or a power cut).
void FolderPublisher::remove_stale_staging() const {
  const std::string prefix = staging_prefix();
  std::vector<std::string> stale;
  std::error_code ec;
  for (fs::directory_iterator it(parent_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) == 0 && is_hex16(name.substr(prefix.size())) &&
        it->symlink_status(ec).type() == fs::file_type::directory)
      stale.push_back(it->path().string());
  }
  for (const std::string& path : stale) {
    const FolderLock lock(path, false);
    if (lock.held()) remove_tree(path);
  }
}

void FolderPublisher::create_staging_folder() {
  // A run starting next to this one may sweep a staging folder that is not locked yet: then a
  // fresh one is made.
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string path = parent_ + "/" + staging_prefix() + random_hex16();
    cleanup_->will_create(path);
    if (::mkdir(path.c_str(), 0777) != 0) {
      const std::string why = errno_text();
      cleanup_->cancel_last();
      throw BadInput(what_ + ": cannot create a staging folder in " + parent_ + ": " + why +
                     "; nothing was written");
    }
    cleanup_->did_create(path);
    staging_lock_.emplace(path, false);
    if (staging_lock_->held()) {
      staging_ = path;
      staging_dirs_.push_back(path);
      return;
    }
    staging_lock_.reset();
    ::rmdir(path.c_str());
  }
  throw BadInput(what_ + ": cannot hold a staging folder in " + parent_ + "; nothing was written");
}

void FolderPublisher::stage_subfolder(const std::string& sub) {
  if (sub.find('/') != std::string::npos || sub == "." || sub == "..")
    throw std::logic_error("FolderPublisher: '" + sub + "' is not one folder name");
  subs_.insert(sub);
  const std::string path = staging_ + "/" + sub;
  if (sub.empty() ||
      std::find(staging_dirs_.begin(), staging_dirs_.end(), path) != staging_dirs_.end())
    return;
  cleanup_->will_create(path);
  if (::mkdir(path.c_str(), 0777) != 0)
    throw BadInput(what_ + ": cannot create " + sub + " in the staging folder: " + errno_text() +
                   "; nothing was written");
  cleanup_->did_create(path);
  staging_dirs_.push_back(path);
}

void FolderPublisher::stage(const std::string& sub, const std::string& name,
                            const std::string& bytes) {
  begin_staging();
  stage_subfolder(sub);
  const std::string rel = sub.empty() ? name : sub + "/" + name;
  const std::string path = staging_ + "/" + rel, shown = (fs::path(target_) / rel).string();
  cleanup_->will_create(path);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw BadInput(shown + ": cannot write: " + errno_text() + "; nothing was written");
  cleanup_->did_create(path);
  staged_.insert(rel);
  const bool written = write_all(fd, bytes) && ::fsync(fd) == 0;
  const int err = errno;
  const bool closed = ::close(fd) == 0;
  if (!written || !closed)
    throw BadInput(shown + ": cannot write: " + std::strerror(written ? errno : err) +
                   "; nothing was written");
}

void FolderPublisher::clear(const std::string& sub) {
  subs_.insert(sub);
}

bool FolderPublisher::replaced(const std::string& rel, const std::string& name) const {
  return std::find(owned_.begin(), owned_.end(), name) != owned_.end() ||
         staged_.count(rel.empty() ? name : rel + "/" + name) > 0;
}

// Mirrors the target's folder `from` (relative path `rel`) into the staging folder's `to`:
// subfolders made anew with the same permissions, every other entry hard-linked (the same
// file), except the files this publish replaces and the temporaries of earlier saves.
void FolderPublisher::carry_over(const std::string& from, const std::string& to,
                                 const std::string& rel) {
  const bool owned = subs_.count(rel) > 0;
  const std::string shown = rel.empty() ? target_ : (fs::path(target_) / rel).string();
  if ((owned || rel.empty()) && ::access(from.c_str(), W_OK | X_OK) != 0)
    throw BadInput(what_ + ": " + shown + " cannot be written (" + errno_text() +
                   "); nothing was written");
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(from, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  if (ec)
    throw BadInput(what_ + ": cannot read " + shown + ": " + ec.message() +
                   "; nothing was written");
  for (const std::string& name : names) {
    const std::string src = from + "/" + name, dst = to + "/" + name,
                      child = rel.empty() ? name : rel + "/" + name;
    struct stat st {};
    if (::lstat(src.c_str(), &st) != 0) continue;                // gone meanwhile
    if (S_ISDIR(st.st_mode) && is_staging_name(name)) continue;  // another publish's
    if (owned && replaced(rel, name)) {
      if (!S_ISREG(st.st_mode))
        throw BadInput((fs::path(target_) / child).string() +
                       ": not a regular file (a directory, link, FIFO or device); a save "
                       "replaces regular files only, so nothing was written");
      continue;
    }
    if (owned && S_ISREG(st.st_mode) && is_old_temporary(name, owned_)) continue;
    struct stat there {};
    const bool taken = ::lstat(dst.c_str(), &there) == 0;  // a subfolder this publish writes
    if (S_ISDIR(st.st_mode) && (!taken || S_ISDIR(there.st_mode))) {
      if (!taken && ::mkdir(dst.c_str(), 0700) != 0)
        throw BadInput(what_ + ": cannot keep " + src + ": " + errno_text() +
                       "; nothing was written");
      if (!taken) staging_dirs_.push_back(dst);
      carry_over(src, dst, child);
      ::chmod(dst.c_str(), st.st_mode & 07777);
    } else if (taken) {
      throw BadInput((fs::path(target_) / child).string() +
                     ": exists and is not a directory; nothing was written");
    } else if (::linkat(AT_FDCWD, src.c_str(), AT_FDCWD, dst.c_str(), 0) != 0) {
      throw BadInput(what_ + ": cannot keep " + src + " in the new folder (" + errno_text() +
                     "); nothing was written");
    }
  }
}

// A target that does not exist: the staging folder takes its name with one rename (which
// replaces at most an empty folder that appeared meanwhile; a full one is published over).
bool FolderPublisher::publish_new() {
  std::error_code ec;
  if (fs::symlink_status(path_, ec).type() != fs::file_type::not_found) return false;
  SignalDeferral defer;
  sync_all(staging_dirs_);
  if (::rename(staging_.c_str(), path_.c_str()) != 0) {
    if (errno == EEXIST || errno == ENOTEMPTY) return false;
    const std::string why = errno_text();
    roll_back();
    throw BadInput(what_ + ": cannot put the folder in place: " + why + "; nothing was written");
  }
  done_ = true;
  sync_path(parent_);
  cleanup_->forget();
  return true;
}

// The one atomic step: the staging folder and the target swap names.
bool FolderPublisher::exchange() {
  struct stat t {};
  if (::stat(path_.c_str(), &t) == 0) {
    ::chmod(staging_.c_str(), t.st_mode & 07777);
    if (::chown(staging_.c_str(), uid_t(-1), t.st_gid) != 0) {
    }  // a group we are not in: the new folder keeps ours
  }
  sync_all(staging_dirs_);
  char cwd[PATH_MAX];
  const bool have_cwd = ::getcwd(cwd, sizeof cwd) != nullptr;
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) != 0) {
    const int err = errno;
    throw BadInput(what_ + ": cannot put the new folder in place of " + target_ + ": " +
                   std::strerror(err) +
                   (err == EINVAL ? " (this file system cannot swap two folders at once)" : "") +
                   "; it was left as it was");
  }
  // A working folder in the target is now in the old one, about to go: the same path names
  // the new one.
  const std::string wd = have_cwd ? cwd : "";
  if (!have_cwd || (wd != path_ && wd.compare(0, path_.size() + 1, path_ + "/") != 0)) return false;
  if (::chdir(cwd) != 0) {
  }
  return true;
}

// A target that exists: under its lock, everything else in it is carried over into the staging
// folder, the two swap names, and the old folder goes. Returns exchange()'s answer.
bool FolderPublisher::publish_over() {
  const FolderLock lock(path_);  // saves into one folder take turns
  std::error_code ec;
  if (fs::symlink_status(path_, ec).type() != fs::file_type::directory)
    throw BadInput(what_ + ": " + target_ + " exists and is not a directory");
  SignalDeferral defer;
  bool moved_cwd = false;
  try {
    carry_over(path_, staging_, "");
    moved_cwd = exchange();
  } catch (...) {
    roll_back();
    throw;
  }
  done_ = true;
  remove_tree(staging_);  // the old folder, under the staging name since the exchange
  sync_path(parent_);
  cleanup_->forget();
  return moved_cwd;
}

std::string FolderPublisher::publish() {
  begin_staging();  // nothing staged: the owned names still go
  const bool moved_cwd = !publish_new() && publish_over();
  staging_lock_.reset();
  cleanup_.reset();
  if (!moved_cwd) return "";
  return "the working folder (" + target_ + ") was replaced by a new one under the same name: " +
         "a shell there sees the new files after cd " + path_;
}

void FolderPublisher::roll_back() {
  SignalDeferral defer;
  if (!staging_.empty()) remove_tree(staging_);
  staging_.clear();
  staging_lock_.reset();
  for (auto d = created_parents_.rbegin(); d != created_parents_.rend(); ++d)
    ::rmdir(d->c_str());  // only when still empty
  created_parents_.clear();
  if (cleanup_) cleanup_->forget();
  done_ = true;
}

}  // namespace ladder
