// The checkpoint format: what exact resume needs, in checksummed sections.
//
//   file    := magic "HPCTCKPT" | u32 format version | section... | end section
//   section := u32 kind | u64 payload bytes | u32 CRC-32 of the payload | payload
//
// Integers are little-endian (x86-64 and AArch64 both). The meta section is text, one
// "key=value" per line, so `hpctrain inspect` and people can read it and later versions can
// add keys; the arenas are raw float32 in the parameter arena's layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace hpc::ckpt {

// A checkpoint --resume auto does not pass by for an older one (find_latest), and `inspect`
// counts as refused: one of the two kinds below. Either is a usage error, not damage.
class RefusedCheckpoint : public Error {
 public:
  explicit RefusedCheckpoint(const std::string& what) : Error(ErrorKind::Usage, what) {}
};

// A checkpoint that could not be read, as opposed to one that is damaged: the system refused it
// (EACCES, EIO, a stale NFS handle). --resume auto does not pass it by for an older one
// (find_latest), whose resume would move it aside and go on from the older step; when every file
// failed alike, the run started afresh. (One too large for memory is passed by only where it is
// larger than the older one that fits: CheckpointTooLarge.)
class UnreadableCheckpoint : public RefusedCheckpoint {
 public:
  using RefusedCheckpoint::RefusedCheckpoint;
};

// A checkpoint whose sections do not fit in this process's memory. A file larger than its
// predecessors (damaged, or another's, as Cli.AFileTooLargeForMemoryIsNamed's) is passed by for
// an older one; memory that is short (a tight `ulimit -v`, strict overcommit) fails every file
// alike, and find_latest then stops rather than start afresh or go back to a smaller older file.
class CheckpointTooLarge : public Error {
 public:
  CheckpointTooLarge(const std::string& what, uint64_t size) : Error(ErrorKind::Usage, what), bytes(size) {}
  uint64_t bytes;  // the file's size
};

// A checkpoint of a later format than this hpctrain reads (its magic right, its version higher):
// written by a newer hpctrain, the requeued job on a node with an older one, an install rolled
// back. --resume auto does not pass it by (find_latest): an older file's resume would move it
// aside and go back to the older step, or start afresh where it was the only one.
class NewerFormatCheckpoint : public RefusedCheckpoint {
 public:
  using RefusedCheckpoint::RefusedCheckpoint;
};

constexpr uint32_t kFormatVersion = 1;

// Everything a run needs to continue exactly where it stopped.
struct Checkpoint {
  std::map<std::string, std::string> meta;  // header fields and the options resume must match
  std::vector<float> params, momentum, buffers;

  // Typed access to the meta section; missing or malformed keys are input errors.
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  const std::string& text(const std::string& key) const;
};

// A usage error naming `path` unless every parameter and buffer is finite: hpctrain never saves
// such a state, so the file was made or edited elsewhere, and its model would answer NaN.
void require_finite_state(const Checkpoint& c, const std::string& path);

// The whole file's bytes; the second form into `out`, keeping its capacity.
std::vector<char> encode(const Checkpoint& c);
void encode(const Checkpoint& c, std::vector<char>& out);

// Bytes that someone else keeps.
struct ByteSpan {
  const char* data;
  size_t size;
};

// The same bytes as encode(c), as pieces in file order: the header, the meta text and the section
// headers are held here, the arenas are c's own. A writer sends them one after the other instead
// of copying the state into one buffer first (for ResNet-50, 188 MB more memory and one more pass
// over it per write). c must outlive this and stay unchanged; the CRCs are computed here.
class Encoded {
 public:
  explicit Encoded(const Checkpoint& c);
  Encoded(const Encoded&) = delete;  // the pieces point into it
  Encoded& operator=(const Encoded&) = delete;
  const std::vector<ByteSpan>& pieces() const { return pieces_; }
  size_t size() const { return size_; }

 private:
  std::string meta_;
  std::vector<char> heads_;  // the file header, then each section's
  std::vector<ByteSpan> pieces_;
  size_t size_ = 0;
};

// encode(c).size(), without encoding.
size_t encoded_size(const Checkpoint& c);

// The length of the magic that begins a checkpoint file.
constexpr size_t kMagicBytes = 8;

// What a file holds, as far as it could be read: for `hpctrain inspect`, which shows the
// header of a damaged file too.
struct Layout {
  struct Section {
    std::string name;  // meta, parameters, optimizer state, batch-norm statistics
    uint64_t bytes = 0;
    bool checksum_ok = false;
  };
  uint32_t version = 0;
  std::vector<Section> sections;  // in file order, up to the first problem
  std::map<std::string, std::string> meta;  // when the meta section was intact
};

// Parses and verifies (magic, version, every section's length and CRC). Throws a usage error
// naming `what` (the file) and the first problem found. With `layout`, records what it read
// there, even when it throws.
Checkpoint decode(const std::vector<char>& bytes, const std::string& what, Layout* layout = nullptr);
// What the streaming decode keeps of the arenas (parameters, optimizer state, statistics): Keep,
// the state to resume; Check, their CRCs verified as they stream past in small pieces and nothing
// kept (the result's arenas empty): the same verdict on a file as Keep's, without the file's size
// in memory (hpcrun and persist-snapshot asking which checkpoint is the newest valid one).
enum class Arenas { Keep, Check };
// The same for `size` bytes that read(dst, n) delivers in order (exactly n each time, or it
// throws; never past size): a file read straight into the result's sections, without a copy of
// the whole file first. A section too large for the process's memory is a usage error.
Checkpoint decode(uint64_t size, const std::function<void(char*, size_t)>& read, const std::string& what,
                  Layout* layout = nullptr, Arenas arenas = Arenas::Keep);

}  // namespace hpc::ckpt
