#include "files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "error.hpp"

namespace ladder {

namespace fs = std::filesystem;

std::string create_unique_file(const std::string& dir, const std::string& base, int& fd) {
  static std::mt19937_64 rng(std::random_device{}());
  const fs::path d = dir.empty() ? fs::path(".") : fs::path(dir);
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
    const std::string p = (d / ("." + base + "." + suffix)).string();
    fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return p;
    if (errno != EEXIST) break;
  }
  throw BadInput((d / base).string() +
                 ": cannot create a temporary file there: " + std::strerror(errno));
}

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
  int fd = -1;
  const std::string tmp = create_unique_file(p.has_parent_path() ? p.parent_path().string() : ".",
                                             p.filename().string(), fd);
  const bool written = write_all(fd, bytes) && ::fsync(fd) == 0;
  const int err = errno;
  const bool closed = ::close(fd) == 0;
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
