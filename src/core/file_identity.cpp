#include "core/file_identity.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <new>
#include <vector>

#include "core/error.hpp"

namespace hpc {
namespace fs = std::filesystem;
namespace {

// As the kernel's limit on links followed in one lookup (MAXSYMLINKS): a loop ends here.
constexpr int kMaxLinks = 40;

// Where the link at `path` (lstat: `st`) points, relative targets taken from its folder; nullopt
// where it cannot be read.
std::optional<std::string> link_target(const std::string& path, const struct stat& st) {
  std::string target(static_cast<size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
  const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
  if (n < 0) return std::nullopt;
  target.resize(static_cast<size_t>(n));
  const fs::path t(target);
  return t.is_absolute() ? target : (fs::path(path).parent_path() / t).string();
}

// `path` with the links of its last part followed (a dangling one included, whose target a
// write would create); the directories before it are left to the kernel's stat().
std::string follow_last_links(std::string path) {
  for (int i = 0; i < kMaxLinks; ++i) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) break;
    const std::optional<std::string> next = link_target(path, st);
    if (!next) break;
    path = *next;
  }
  return path;
}

bool is_stream(mode_t mode) { return S_ISFIFO(mode) || S_ISCHR(mode) || S_ISSOCK(mode); }

// /dev/stdout, /dev/fd/N, /proc/self/fd/N: a descriptor the process was given, a stream by the
// user's own words even where it ends in a regular file (hpctrain ... > log 2>&1 with
// --metrics-file /dev/stdout --timeline-file /dev/stderr shares the log by intent).
bool names_a_descriptor(const std::string& path) {
  const std::string p = fs::path(path).lexically_normal().string();
  if (p == "/dev/stdin" || p == "/dev/stdout" || p == "/dev/stderr" || p.starts_with("/dev/fd/")) return true;
  if (!p.starts_with("/proc/")) return false;
  const std::string rest = p.substr(6), process = rest.substr(0, rest.find('/'));
  const bool ours = process == "self" || process == "thread-self" ||
                    (!process.empty() && process.find_first_not_of("0123456789") == std::string::npos);
  return ours && rest.substr(process.size()).starts_with("/fd/");
}

}  // namespace

// (file_identity.hpp) The kernel refuses the same (fs.protected_symlinks, protected_regular and
// protected_fifos), but only where those are set, and a dangling link is followed here (O_CREAT |
// O_EXCL will not), where no kernel check sees it.
std::optional<std::string> planted_by_another_user(std::string path) {
  for (int i = 0; i < kMaxLinks; ++i) {
    struct stat entry {}, folder {};
    if (::lstat(path.c_str(), &entry) != 0) return std::nullopt;
    const std::string parent = fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string();
    const bool writable_by_all = ::stat(parent.c_str(), &folder) == 0 && (folder.st_mode & S_ISVTX) &&
                                 (folder.st_mode & S_IWOTH);
    const bool kind = S_ISLNK(entry.st_mode) || S_ISREG(entry.st_mode) || S_ISFIFO(entry.st_mode);
    if (kind && writable_by_all && entry.st_uid != ::geteuid() && entry.st_uid != folder.st_uid)
      return detail::concat(S_ISLNK(entry.st_mode) ? "the link " : S_ISREG(entry.st_mode) ? "the file " : "the FIFO ",
                            path, " belongs to uid ", entry.st_uid, " in ", parent, " (mode ",
                            mode_text(folder.st_mode), ", writable by every user)");
    if (!S_ISLNK(entry.st_mode)) return std::nullopt;
    const std::optional<std::string> next = link_target(path, entry);
    if (!next) return std::nullopt;
    path = *next;
  }
  return std::nullopt;
}

std::optional<FileIdentity> file_identity(const std::string& path) {
  if (path.empty()) return std::nullopt;
  struct stat st {};
  // The kernel's own lookup first: it also resolves /proc's magic links (/dev/stdout to a pipe),
  // which no readlink() spells as a path.
  if (::stat(path.c_str(), &st) == 0)
    return FileIdentity{st.st_dev, st.st_ino, "", is_stream(st.st_mode) || names_a_descriptor(path)};
  if (errno != ENOENT) return std::nullopt;
  const fs::path resolved(follow_last_links(path));
  const std::string name = resolved.filename().string();
  if (name.empty() || name == "." || name == "..") return std::nullopt;
  const std::string parent = resolved.parent_path().empty() ? "." : resolved.parent_path().string();
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return std::nullopt;
  return FileIdentity{st.st_dev, st.st_ino, name, false};
}

namespace {
struct flock whole_file_write_lock() {
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  return l;
}
}  // namespace

FileLock lock_whole_file(int fd) {
  struct flock l = whole_file_write_lock();
  if (::fcntl(fd, F_OFD_SETLK, &l) == 0) return FileLock::Taken;
  return errno == EAGAIN || errno == EACCES ? FileLock::Held : FileLock::Failed;
}

std::optional<bool> whole_file_lock_held(int fd) {
  struct flock l = whole_file_write_lock();
  if (::fcntl(fd, F_OFD_GETLK, &l) != 0) return std::nullopt;
  return l.l_type != F_UNLCK;
}

int open_data_file(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block the open
  if (fd < 0 && errno == EMFILE) {  // a split of many shards, each held open
    struct rlimit limit {};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    usage_error("cannot read ", what, " ", path, ": ", std::strerror(EMFILE), " (this process may hold ",
                limit.rlim_cur, " open at once, as raised to its hard limit: raise that, ulimit -Hn, or pack "
                "fewer, larger shards)");
  }
  if (fd < 0) io_error("read " + what, path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    usage_error("cannot read ", what, " ", path, ": ", std::strerror(error));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    usage_error(what, " ", path, " is not a regular file", S_ISDIR(st.st_mode) ? " (a directory)" : " (a FIFO or device?)");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

OutputFile open_output(const std::string& path, const std::string& option, int create_flags) {
  HPC_REQUIRE(!path.empty(), option, " is empty (an unset variable?)");
  OutputFile out;
  const std::optional<int> own = dup_own_descriptor(path);
  if (!own)
    if (const std::optional<std::string> planted = planted_by_another_user(path))
      usage_error("refusing ", option, " ", path, ": ", *planted,
                  ": another user may have put it there for this run to follow or write into; use a path of your own");
  out.file = own ? path : where_a_dangling_link_leads(path);
  out.fd = own ? *own : ::open(out.file.c_str(), create_flags | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  out.created = !own && out.fd >= 0;
  if (!own && out.fd < 0 && errno == EEXIST)
    out.fd = ::open(out.file.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  if (out.fd < 0) {
    const int error = errno;
    struct stat st {};
    HPC_REQUIRE(error != ENXIO || ::stat(path.c_str(), &st) != 0 || !S_ISFIFO(st.st_mode), option, " ", path,
                " is a FIFO that has no reader: start the program that reads it first");
    usage_error("cannot open ", option, " ", path, ": ", std::strerror(error));
  }
  if (::fstat(out.fd, &out.st) != 0) {
    const int error = errno;
    ::close(out.fd);
    if (out.created) ::unlink(out.file.c_str());
    usage_error("cannot open ", option, " ", path, ": ", std::strerror(error));
  }
  ::fcntl(out.fd, F_SETFL, ::fcntl(out.fd, F_GETFL) & ~O_NONBLOCK);
  return out;
}

int create_new_file(const std::string& path) {
  const auto create = [&] { return ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644); };
  int fd = create();
  if (fd < 0 && errno == EEXIST) {
    if (::unlink(path.c_str()) == 0) fd = create();
    else errno = EEXIST;  // the file's being there is the reason, not the refusal to remove it
  }
  return fd;
}

bool open_stream_on(std::ofstream& out, int fd) {
  out.open("/proc/self/fd/" + std::to_string(fd), std::ios::app);
  ::close(fd);
  return out.is_open() && out.good();
}

void reserve_in_huge_pages(std::vector<uint8_t>& v, size_t n) {
  v.reserve(n);
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(v.data()) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(v.data()) + n) & ~(kHuge - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

std::vector<uint8_t> read_data_file(const std::string& path, const std::string& what, int64_t max_bytes) {
  const int fd = open_data_file(path, what);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) io_error("read " + what, path);
  HPC_REQUIRE(st.st_size <= max_bytes, what, " ", path, " is too large (", st.st_size, " bytes; at most ", max_bytes,
              ")");
  std::vector<uint8_t> bytes;
  try {
    reserve_in_huge_pages(bytes, static_cast<size_t>(st.st_size));
    bytes.resize(static_cast<size_t>(st.st_size));
  } catch (const std::bad_alloc&) {
    usage_error(what, " ", path, " does not fit in this process's memory (", st.st_size, " bytes)");
  }
  bytes.resize(read_into(fd, bytes.data(), bytes.size(), what, path));
  return bytes;
}

size_t read_into(int fd, uint8_t* dst, size_t n, const std::string& what, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, dst + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) io_error("read " + what, path);
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

bool same_file(const std::string& a, const std::string& b) {
  const std::optional<FileIdentity> x = file_identity(a), y = file_identity(b);
  return x && y && !x->stream && !y->stream && x->dev == y->dev && x->ino == y->ino && x->name == y->name;
}

void require_distinct_files(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& out = outputs[i];
    if (out.path.empty()) continue;
    for (size_t j = 0; j < i; ++j)
      HPC_REQUIRE(!same_file(outputs[j].path, out.path), outputs[j].what, " ", outputs[j].path, " and ", out.what, " ",
                  out.path, " are the same file: each output needs a file of its own");
    for (const NamedPath& in : inputs)
      HPC_REQUIRE(!same_file(in.path, out.path), out.what, " ", out.path, " is the same file as ", in.what, " ",
                  in.path, ", which is read: an output never replaces an input; write it elsewhere");
  }
}

void require_not_root_dir(const std::string& dir, const std::string& what) {
  struct stat st {}, root {};
  const bool is_root = !dir.empty() && ::stat(dir.c_str(), &st) == 0 && ::stat("/", &root) == 0 &&
                       st.st_dev == root.st_dev && st.st_ino == root.st_ino;
  HPC_REQUIRE(!is_root, what, " ", dir, " is the root directory / (an unset variable?): give a directory of its own");
}

bool make_directories(const std::string& dir, mode_t mode, std::error_code& ec) {
  ec.clear();
  // Part by part as written, as mkdir -p and create_directories go: "a/b/../c" makes a, a/b and a/c.
  fs::path prefix;
  for (const fs::path& part : fs::path(dir)) {
    prefix /= part;
    if (part.empty()) continue;  // a trailing "/"
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) continue;
      ec = std::make_error_code(std::errc::not_a_directory);
      return false;
    }
    if (errno == ENOENT && ::mkdir(prefix.c_str(), mode) == 0) continue;
    // mkdir's (or stat's) errno, before the stat below replaces it: EEXIST where stat found nothing
    // is a link to nothing, no directory ("No such file or directory" it said, of a part that is there).
    const int err = errno;
    if (err == EEXIST && ::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;  // made meanwhile
    ec = std::error_code(err == EEXIST ? ENOTDIR : err, std::generic_category());
    return false;
  }
  return true;
}

std::string mode_text(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%o", static_cast<unsigned>(mode & 07777));
  return text;
}

namespace {
// Whether this process is a member of group `gid` (its own group or a supplementary one).
bool in_own_groups(gid_t gid) {
  if (gid == ::getegid()) return true;
  const int n = ::getgroups(0, nullptr);
  std::vector<gid_t> groups(static_cast<size_t>(std::max(n, 0)));
  const int got = n > 0 ? ::getgroups(n, groups.data()) : 0;
  return std::find(groups.begin(), groups.begin() + std::max(got, 0), gid) != groups.begin() + std::max(got, 0);
}

// Whom a folder or file may belong to for user `uid` to trust it: that user, root, or one of this
// process's groups. Root may use any folder (RootTrust::AnyOwner); a file's owner may rewrite it
// whenever they like, so a file is held to the rule for root too (RootTrust::SameRule).
enum class RootTrust { AnyOwner, SameRule };
bool trusted_owner(const struct stat& st, uid_t uid, RootTrust root) {
  return (root == RootTrust::AnyOwner && uid == 0) || st.st_uid == uid || st.st_uid == 0 || in_own_groups(st.st_gid);
}
}  // namespace

namespace {
// The folders from `from` up to /, as those above a directory or file of this user's are judged:
// each this user's, root's or of one of this user's groups (any, for root: a project's directory,
// its PI's, the group's to write, is trusted as a group is; a stranger's is not), and none
// writable by others unless sticky (/tmp: no one else may rename or replace an entry of this
// user's there). A part not there yet is judged as it would be once made: passed over, the
// folders above it judged (where every user may write, another could make it first, or rename
// it away after). A folder that cannot be looked at otherwise ends the check: said where the path
// is used. `not_sticky` follows the mode in the message, `advice` the reason.
void require_safe_folders(fs::path from, const std::string& what, const std::string& shown, const std::string& why,
                          const char* not_sticky, const char* advice, uid_t uid) {
  for (fs::path p = std::move(from);; p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      if (errno != ENOENT || p == p.root_path()) return;
      continue;
    }
    HPC_REQUIRE(trusted_owner(st, uid, RootTrust::AnyOwner), what, " ", shown, ": ", p.string(), " belongs to uid ",
                st.st_uid, ", another user, not of your groups", why, advice);
    HPC_REQUIRE(!(st.st_mode & S_IWOTH) || (st.st_mode & S_ISVTX), what, " ", shown, ": ", p.string(),
                " is writable by others (mode ", mode_text(st.st_mode), ")", not_sticky, why, advice);
    if (p == p.root_path()) return;
  }
}
}  // namespace

void require_safe_directory(const std::string& dir, const std::string& what, uid_t uid) {
  std::error_code ec;
  // Links resolved as far as the path is there; the rest, not there yet, is its creator's to make.
  const fs::path real = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  if (ec) return;
  const std::string shown = real.string() == dir ? dir : detail::concat(dir, " (", real.string(), ")");
  const std::string why =
      ": another user could replace what is read back there, or plant a link that a write would follow; ";
  const char* advice = "use a directory of your own";
  struct stat st {};
  if (::stat(real.c_str(), &st) == 0) {
    HPC_REQUIRE(trusted_owner(st, uid, RootTrust::AnyOwner), what, " ", shown, ": it belongs to uid ", st.st_uid,
                ", another user, not of your groups", why, advice);
    // Itself, sticky or not: writable by others is theirs to fill.
    HPC_REQUIRE(!(st.st_mode & S_IWOTH), what, " ", shown, ": it is writable by others (mode ", mode_text(st.st_mode),
                ")", why, "chmod o-w it, or ", advice);
  } else if (errno != ENOENT) {
    return;
  }
  if (real == real.root_path()) return;
  require_safe_folders(real.parent_path(), what, shown, why, "", advice, uid);
}

void require_safe_file(const std::string& path, const std::string& what, uid_t uid) {
  const std::string why = ": another user could change what is read or run from it; ";
  // The links of its last part, one by one: another user's link (in /tmp, say) leads where they
  // choose, and may be swapped for another at any moment.
  std::string at = path;
  for (int i = 0; i < kMaxLinks; ++i) {
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0) return;  // not there: its reader says so
    if (!S_ISLNK(st.st_mode)) break;
    HPC_REQUIRE(trusted_owner(st, uid, RootTrust::SameRule), what, " ", path, ": the link ", at, " belongs to uid ",
                st.st_uid, ", another user, not of your groups", why, "use a file of your own");
    const std::optional<std::string> next = link_target(at, st);
    if (!next) return;
    at = *next;
  }
  std::error_code ec;
  const fs::path real = fs::canonical(path, ec);
  if (ec) return;
  const std::string shown = real.string() == path ? path : detail::concat(path, " (", real.string(), ")");
  struct stat st {};
  if (::stat(real.c_str(), &st) != 0) return;
  // The file's owner may rewrite it whenever they like: checked for root too (as sshd checks
  // root's authorized_keys).
  HPC_REQUIRE(trusted_owner(st, uid, RootTrust::SameRule), what, " ", shown, ": it belongs to uid ", st.st_uid,
              ", another user, not of your groups", why, "use a file of your own");
  HPC_REQUIRE(!(st.st_mode & S_IWOTH), what, " ", shown, ": it is writable by others (mode ", mode_text(st.st_mode),
              ")", why, "chmod o-w it");
  // The directories above it, as a directory's are, sticky ones (/tmp) allowed all the way down.
  require_safe_folders(real.parent_path(), what, shown, why, " and not sticky", "use a file of your own", uid);
}

std::string through_links(const std::string& path) {
  // Each target is read as the kernel reads it, from its link's folder, never folded lexically:
  // "lnk/../f" where lnk leads to a folder elsewhere is beside that folder, not beside lnk.
  const std::string end = follow_last_links(path);
  struct stat st {};
  return ::lstat(end.c_str(), &st) == 0 && S_ISLNK(st.st_mode) ? path : end;
}

std::string where_a_dangling_link_leads(const std::string& path) {
  std::error_code ec;
  if (!fs::is_symlink(path, ec) || fs::exists(path, ec) || ec) return path;
  return through_links(path);
}

std::optional<int> dup_own_descriptor(const std::string& path) {
  const std::string p = fs::path(path).lexically_normal().string();
  std::string number;
  if (p == "/dev/stdout") number = "1";
  else if (p == "/dev/stderr") number = "2";
  else if (p.starts_with("/dev/fd/")) number = p.substr(8);
  else
    for (const std::string& self : std::vector<std::string>{"/proc/self/fd/", "/proc/thread-self/fd/",
                                                            "/proc/" + std::to_string(::getpid()) + "/fd/"})
      if (p.starts_with(self)) number = p.substr(self.size());
  if (number.empty() || number.size() > 9 || number.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return ::fcntl(std::stoi(number), F_DUPFD_CLOEXEC, 3);
}

void walk_files(const std::string& dir, const std::function<void(const fs::directory_entry&)>& visit) {
  struct Folder {
    dev_t dev;
    ino_t ino;
    std::string path;
  };
  // The directories from / down to the one being listed: a directory entry that is one of them
  // is a way back, and a loop. (Those above `dir` too: a link in a class folder to the folder of
  // all classes would list the other classes' files before it came back to its own.)
  std::vector<Folder> above;
  struct stat st {};
  std::error_code ec;
  const fs::path real = fs::canonical(dir, ec);
  for (fs::path p = real; !ec && !p.empty(); p = p.parent_path()) {
    if (::stat(p.c_str(), &st) == 0) above.insert(above.begin(), {st.st_dev, st.st_ino, p == real ? dir : p.string()});
    if (p == p.root_path()) break;
  }
  const size_t base = above.empty() ? 0 : above.size() - 1;  // where `dir` is
  ec.clear();
  fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type;
    if (!it->is_directory(type)) {
      visit(*it);
      continue;
    }
    above.resize(base + static_cast<size_t>(it.depth()) + 1);
    const std::string path = it->path().string();
    if (::stat(path.c_str(), &st) != 0) continue;  // gone since it was listed: its listing says so
    for (const Folder& f : above)
      if (f.dev == st.st_dev && f.ino == st.st_ino)
        usage_error(path, " leads back to ", f.path, ", a folder it lies in: a loop of links (remove the link)");
    above.push_back({st.st_dev, st.st_ino, path});
  }
  if (ec) usage_error("cannot read directory ", dir, ": ", ec.message());
}

}  // namespace hpc
