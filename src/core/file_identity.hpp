// Whether two paths name one file, for the rule "no output ever replaces an input or another
// output": decided by identity (st_dev, st_ino with symlinks resolved), never by spelling, so
// that ./x, dir/../x, a symlink and a hard link are all x. Only stat() is used, never open():
// a FIFO would block an open, and identity needs none. The one place every C++ tool asks this
// (datasets/hpcdata holds its Python twin).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace hpc {

struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  // A file that is not there yet is its name in the directory (dev, ino); empty for one that is.
  std::string name;
  // A FIFO, socket or character device, or a descriptor named as one (/dev/stdout, /dev/fd/N,
  // /proc/self/fd/N): a stream, which two options may share by intent, and which is never an
  // input's bytes to lose.
  bool stream = false;
};

// What `path` names, symlinks (dangling ones included: a write would create their target)
// resolved; nullopt when that cannot be told (its directory is missing or unreadable: whoever
// opens the path reports that, naming it).
std::optional<FileIdentity> file_identity(const std::string& path);

// True when a and b are one file: the same existing file by any spelling or link, or the same
// name in the same directory for a file not there yet. A stream is never "the same file".
bool same_file(const std::string& a, const std::string& b);

// Where a link (or a chain of them) at `path` leads, by reading the links (the target need not
// exist); `path` itself when it is no link, or when the chain cannot be read or does not end
// within the kernel's 40 links.
std::string through_links(const std::string& path);

// Where `path` leads when it is a link (or a chain of them) to nothing: the file that a write
// through it would create, which open(O_CREAT | O_EXCL) refuses to create through the link
// (EEXIST), and the retry without O_CREAT found missing (ENOENT): "cannot open m.jsonl: No such
// file or directory" for a file that was to be made. `path` itself otherwise.
std::string where_a_dangling_link_leads(const std::string& path);

// For a path that names one of this process's own descriptors (/dev/stdout, /dev/stderr,
// /dev/fd/N, /proc/self/fd/N), that descriptor dup()ed (close-on-exec; -1 with errno where it is
// not open); nullopt for any other path. An output given so must be written through it: opened
// again by name it got a file position of its own, and under `> file` (Slurm's output too) the
// log's writes through fd 1 landed over what it had written.
std::optional<int> dup_own_descriptor(const std::string& path);

// The first link, file or FIFO on the way from `path` (its last part's links followed) that
// another user may have put there for this process to follow or write into: one of a folder
// every user may write to and only an entry's owner may remove from (sticky: /tmp, /dev/shm, a
// node_exporter collector directory all jobs write to), owned neither by this process's user nor
// by the folder's; said as "the link P belongs to uid U in F (mode 1777, writable by every
// user)". nullopt when there is none.
std::optional<std::string> planted_by_another_user(std::string path);

// An output a run appends its events to (--metrics-file, --trace-file), opened for writing:
// /dev/stdout and its kin through the descriptor itself (dup_own_descriptor); a link to nothing
// at the file it leads to; else created with open(O_CREAT | O_EXCL | create_flags), which tells a
// file made here from one that was there (whatever happens, that one stays), or, where one was
// there, opened again for O_WRONLY | O_APPEND. O_NONBLOCK on that open refuses a FIFO that
// nothing reads at once (a usage error saying to start its reader) instead of waiting for one;
// the descriptor returned blocks (a stream's writes wait for a slow reader, as stdout's do).
// Any failure is a usage error naming `option` and the path; a file created is removed again.
// Refused too (usage error): a link, file or FIFO on the way (the last part's links followed) that
// another user owns in a sticky folder every user may write to (/tmp, /dev/shm), unless that user
// owns the folder: as the kernel's fs.protected_symlinks and protected_regular refuse, whether
// those are set or not (a dangling link is followed here, beyond their reach).
struct OutputFile {
  int fd = -1;
  std::string file;  // what was opened: `path`, or where the dangling link at it leads
  bool created = false;
  struct stat st {};  // of the open file
};
OutputFile open_output(const std::string& path, const std::string& option, int create_flags);

// Creates `path`, a file of a guessable name that only this process writes (PATH.tmp.PID,
// SHARD.part), for writing (O_WRONLY | O_CLOEXEC, mode 0644 less the umask): made anew with
// O_CREAT | O_EXCL | O_NOFOLLOW, so that a link or a file that another user put there first (in
// /tmp, or another directory all may write to) is never written through nor renamed into place as
// this process's own. One there already (a killed writer's leftover) is removed first; one that
// cannot be removed (another user's, in a sticky directory) fails with EEXIST. The descriptor, or
// -1 with errno.
int create_new_file(const std::string& path);

// Opens OUT for appending on the file FD is open on, through /proc/self/fd: never by its name
// again, which the directory's owner may have pointed at another file meanwhile (a link to one of
// the user's own). Closes FD; false when OUT could not be opened.
bool open_stream_on(std::ofstream& out, int fd);

// A write lock on the whole file, owned by fd's open file description (fcntl F_OFD_SETLK): the
// kernel drops it when that description is closed or its process ends, and NFSv4 (EFS) holds it
// between hosts. Taken; Held by another description (of any process, this one's included); or
// Failed, with errno (ENOLCK: a file system without locks).
enum class FileLock { Taken, Held, Failed };
FileLock lock_whole_file(int fd);
// Whether another open file description holds such a lock on fd's file (fcntl F_OFD_GETLK, which
// NFSv4 and EFS answer for every host); nullopt where the file system cannot say.
std::optional<bool> whole_file_lock_held(int fd);

// Opens `path` to read it as a data file (an image, a shard, a manifest, a class list): a regular
// file only, as a FIFO would block the open or its reads for ever, and a directory or device
// holds no such data. The descriptor (blocking reads); a usage error naming `what` and the path
// otherwise, with the system's reason where it cannot be opened.
int open_data_file(const std::string& path, const std::string& what);

// The whole of a data file, opened as open_data_file does: at most `max_bytes` (a usage error
// naming `what` past it, before anything is read), and a usage error where it does not fit in
// memory; a file that shrinks while it is read is judged by what it held. Read straight into
// its buffer (reserve_in_huge_pages).
std::vector<uint8_t> read_data_file(const std::string& path, const std::string& what, int64_t max_bytes);
// Up to n bytes of fd into dst, fewer only at the file's end: how many. A read error is an I/O
// error naming `what` and the path.
size_t read_into(int fd, uint8_t* dst, size_t n, const std::string& what, const std::string& path);

// Room for n bytes in v, in transparent huge pages where the kernel gives them on request (THP
// "madvise", Debian's default). The first touch of Fashion-MNIST's 47 MB of training images took
// 11,500 page faults in 4 KiB pages, three times over (the file read, the gunzip, a copy): on
// a 2-core VM 0.35 s of each process's start, 0.1 s in 2 MiB pages. A hint: refused, nothing
// changes.
void reserve_in_huge_pages(std::vector<uint8_t>& v, size_t n);

// A path with the option (or role) that gave it, as the errors name it: {"--metrics-file", "m.jsonl"}.
struct NamedPath {
  std::string what, path;
};

// Every output must be another file than every input and every other output: else a usage
// error naming both ("--output a.onnx is the same file as --checkpoint a.hpck (an input): ...").
// Empty paths (options not given) are skipped. No --force overrides this.
void require_distinct_files(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs);

// A directory a tool writes into must not be the root directory, by any spelling ("/", "//",
// "/tmp/..") or link: it is what an unset variable makes of "$DIR/". A usage error naming `what`.
void require_not_root_dir(const std::string& dir, const std::string& what);

// A directory whose files a tool reads back or replaces (the checkpoints --resume takes, the
// heartbeat, hpcrun's logs) must be out of other users' reach, or one of them could plant a
// checkpoint there, or a link that a write would follow into the user's own files (shared storage
// such as /shared or /fsx is often world-writable and sticky). So, resolved, the directory must
// not be writable by every user, and neither may any directory above it be, unless sticky (as
// /tmp); with `uid` not root, each of them must belong to `uid`, to root, or to a group of this
// process's (a project directory of its PI's). Group write is allowed: a group is trusted. A usage error naming `what`, the directory and the part
// at fault. A directory that is not there yet is judged by the directories above it that are: one
// it would be made in where every user may write (not sticky) is refused before it is made.
void require_safe_directory(const std::string& dir, const std::string& what, uid_t uid = ::geteuid());

// A file whose words decide what a tool runs, or where (hpcrun's --host-discovery-script, run
// again at every discovery, and its --hostfile), must be out of other users' reach, as sshd holds
// authorized_keys: the file, and every link of its last part on the way to it (another user's link
// in /tmp leads where they choose), must belong to `uid`, to root or to a group of this process's,
// for root too (its owner may rewrite it at any moment), and the file may not be writable by
// others; the directories above it are held to require_safe_directory's rule, sticky ones allowed.
// A usage error naming `what`, the path and the part at fault. Nothing is checked for a path that
// is not there (its reader reports that).
void require_safe_file(const std::string& path, const std::string& what, uid_t uid = ::geteuid());

// Every entry under `dir` that is no directory, through links to directories too (as find -L and
// torchvision's ImageFolder follow them), in the order the directories list them. A link that
// leads back to a directory it lies in (a loop, over one link or several) is a usage error naming
// the link and that directory, found when the walk reaches it: followed, it listed the same files
// again at every turn until the kernel's 40 links ended it with one path 40 folders deep. A
// directory that cannot be read is a usage error naming it.
void walk_files(const std::string& dir, const std::function<void(const std::filesystem::directory_entry&)>& visit);

// Creates `dir` and the directories above it that are missing, as mkdir -p does, but each made
// with `mode` less the umask, where std::filesystem::create_directories gives 0777 less it: under
// umask 000 that was a directory every user may write to, which the run then refused itself
// (require_safe_directory) and left behind for anyone to fill, and a private one (a snapshot
// directory in /dev/shm) was open to all until its chmod. One there already is left as it is.
// Sets `ec` (and returns false) where one cannot be made or a part is no directory.
inline constexpr mode_t kSharedDirectoryMode = 0775;  // the group's as the umask says, never others'
bool make_directories(const std::string& dir, mode_t mode, std::error_code& ec);

// A file's permission bits as chmod takes them, in octal: "755", "1777".
std::string mode_text(mode_t mode);

}  // namespace hpc
