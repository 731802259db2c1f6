// Rows appended to a CSV file that other runs may append to at the same time, none of them lost
// (`ladder bench --csv`, `ladder compare --csv`, `ceilings --csv`). One read-merge-write under a
// lock: every writer takes an exclusive flock(2) of the file's folder (FolderLock), reads the
// file as it is then, checks its header, writes its rows and the new ones to a temporary beside
// it, fsyncs it, renames it over the file, fsyncs the folder and lets go. So two runs that
// finish together take turns and the second keeps the first's rows; a reader never sees half a
// file; a failed write (a full disk) leaves the file as it was. The lock is on the folder, not
// on a lock file, so that nothing but the CSV is ever left beside it; a writer in another
// language takes the same lock (Python: fcntl.flock on os.open(folder, os.O_RDONLY)).
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace ladder {

// Throws BadInput when an existing file's first line (its line end removed) is not the header
// the writer expects; a new or empty file gets `header`.
using CsvHeaderCheck = std::function<void(const std::string& first_line)>;

class CsvAppender {
 public:
  // An empty path: an appender that writes nothing. Checks at once, before anything is
  // measured: the path is new or a regular file (never a link, FIFO, device or folder), and
  // an existing file's header passes `check` (nullptr: it must be `header` exactly). `flag`
  // names the file in messages ("--csv"). Throws BadInput.
  CsvAppender(std::string path, std::string header, CsvHeaderCheck check,
              std::string flag = "--csv");
  // One row, without its line end.
  void add(const std::string& row);
  // Appends the rows added since the last append, as above. Returns "added 3 rows to r.csv
  // (12 in all)", counting every row this appender added (a new file says so; "" without a
  // path). Throws BadInput, the file as it was.
  std::string append();

 private:
  std::string read_current() const;  // under the lock: the file's text, header checked
  std::string first_line_of(const std::string& text) const;

  std::string path_, header_, flag_, rows_;
  CsvHeaderCheck check_;
  size_t pending_ = 0, added_ = 0;  // rows not yet appended; rows appended
  bool created_ = false;            // this appender made the file
};

}  // namespace ladder
