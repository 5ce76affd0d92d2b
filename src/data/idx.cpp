// IDX format (LeCun's MNIST distribution): big-endian magic 0x00000803 for images
// (count, rows, cols follow) and 0x00000801 for labels (count follows), then raw uint8 data.
#include <isa-l/igzip_lib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "data/dataset.hpp"

namespace hpc::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void check_size(const std::string& path, size_t have, uint64_t header, uint64_t count, uint64_t per_item,
                const char* what) {
  const uint64_t want = header + count * per_item;
  HPC_REQUIRE(have >= want, "dataset file ", path, " is truncated: its header declares ", count, " ", what,
              " (", want, " bytes) but it holds ", have, " bytes");
  HPC_REQUIRE(have == want, "dataset file ", path, " is malformed: ", have - want,
              " bytes follow the ", count, " ", what, " its header declares");
}

}  // namespace

bool dataset_file_exists(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    HPC_REQUIRE(errno == ENOENT, "cannot read dataset file ", path, ": ", std::strerror(errno));
    return false;
  }
  HPC_REQUIRE(S_ISREG(st.st_mode), "dataset file ", path, " is not a regular file",
              S_ISDIR(st.st_mode) ? " (a directory)" : " (a FIFO or device?)");
  return true;
}

namespace {

bool gzip_magic(const uint8_t* p, size_t n) { return n >= 2 && p[0] == 0x1f && p[1] == 0x8b; }

// Why ISA-L's inflate stopped, as a reader of the file would say it.
std::string inflate_problem(int rc) {
  switch (rc) {
    case ISAL_INCORRECT_CHECKSUM: return "its data does not match its CRC-32";
    case ISAL_INVALID_WRAPPER: return "its gzip header is invalid";
    case ISAL_UNSUPPORTED_METHOD: return "it is compressed by a method other than DEFLATE";
    case ISAL_INVALID_BLOCK: return "its compressed data holds an invalid DEFLATE block";
    case ISAL_INVALID_SYMBOL: return "its compressed data holds an invalid DEFLATE symbol";
    case ISAL_INVALID_LOOKBACK: return "its compressed data refers back past its start";
    default: return "its gzip stream cannot be read (ISA-L inflate code " + std::to_string(rc) + ")";
  }
}

// The first guess of the size: the last member's length (mod 2^32, in its trailer) where DEFLATE
// could expand the file to it (at most about 1032:1), else 4x; the output grows past a wrong one.
size_t first_size_guess(const std::vector<uint8_t>& in) {
  size_t guess = in.size() * 4;
  if (in.size() >= 18) {
    const uint8_t* t = in.data() + in.size() - 4;
    const size_t isize = uint32_t{t[0]} | (uint32_t{t[1]} << 8) | (uint32_t{t[2]} << 16) | (uint32_t{t[3]} << 24);
    if (isize > guess && isize / 1100 <= in.size()) guess = isize;
  }
  return guess;
}

// How far a file is decoded (DecodedSize): unknown until its header is, where it has one.
class DecodeLimit {
 public:
  explicit DecodeLimit(const DecodedSize& limit) : limit_(limit) {
    if (limit_.declared && limit_.header == 0) learn(nullptr);
  }
  // The size of the first buffer, and of each growth: no more than one byte past the limit.
  size_t first_size(size_t guess) const { return capped(limit_.declared && !most_ ? limit_.header : guess); }
  size_t capped(size_t n) const { return most_ ? std::min<size_t>(n, most_->bytes + 1) : n; }
  // After `used` bytes of `out` are decoded: learns the limit once the header is there (true:
  // just learnt).
  bool learnt(const std::vector<uint8_t>& out, size_t used) {
    if (most_ || !limit_.declared || used < limit_.header) return false;
    learn(out.data());
    return true;
  }
  // Whether decoding stops with what it has: a wrong header's (the reader says how). A usage
  // error past a declared size: a small file can inflate to gigabytes (a gzip bomb, or another
  // file), refused at what it declares instead of filling the memory.
  bool stop(const std::string& path, size_t used) const {
    if (!most_ || used <= most_->bytes) return false;
    if (most_->what.empty()) return true;
    usage_error("dataset file ", path, " is malformed: bytes follow ", most_->what, " (", most_->bytes,
                " bytes; its gzip stream holds more, not decoded further)");
  }

 private:
  void learn(const uint8_t* header) {
    most_ = limit_.declared(header);
    if (most_->bytes == 0) most_->bytes = limit_.header;  // a wrong header: decoded that far
  }
  const DecodedSize& limit_;
  std::optional<DecodedSize::Declared> most_;
};

// Gunzips `in` (one gzip member or several, as gzip -d reads them) with ISA-L's inflate: 2.5x
// zlib's on Fashion-MNIST's 26 MB of training images (0.4 s a process with zlib, and every rank
// of every run reads them). Each member's CRC-32 is checked. A stream cut short is an error, and
// so are bytes after the last member that are not another (gzip -d: "trailing garbage ignored").
// Never decoded past `limit`.
std::vector<uint8_t> gunzip(const std::string& path, const std::vector<uint8_t>& in, const DecodedSize& limit) {
  const auto corrupt = [&](const std::string& what) { usage_error("dataset file ", path, " is corrupt: ", what); };
  std::vector<uint8_t> out;
  const auto grow = [&](size_t size) {
    try {
      reserve_in_huge_pages(out, size);
      out.resize(size);
    } catch (const std::bad_alloc&) {
      usage_error("dataset file ", path, " does not fit in this process's memory (", out.size(),
                  " bytes gunzipped so far): is it the dataset's file?");
    }
  };
  const size_t guess = first_size_guess(in);
  DecodeLimit most(limit);
  grow(std::max<size_t>(most.first_size(guess), 1 << 16));
  size_t used = 0;  // bytes of `out` written
  const auto consumed = [&](const inflate_state& st) { return static_cast<size_t>(st.next_in - in.data()); };
  // isal_inflate counts in 32 bits: at most 4 GiB of input or of output space at a time.
  const auto clamp = [](size_t n) { return static_cast<uint32_t>(std::min<size_t>(n, UINT32_MAX)); };
  inflate_state st;
  for (size_t at = 0; at < in.size();) {
    if (!gzip_magic(in.data() + at, in.size() - at))
      corrupt(std::to_string(in.size() - at) + " bytes that are not gzip data follow its compressed stream");
    isal_inflate_init(&st);
    st.crc_flag = ISAL_GZIP;
    st.next_in = const_cast<uint8_t*>(in.data() + at);
    st.avail_in = clamp(in.size() - at);
    for (;;) {
      if (used == out.size()) grow(most.capped(out.size() * 2));
      st.next_out = out.data() + used;
      st.avail_out = clamp(out.size() - used);
      const size_t in_before = consumed(st), space = st.avail_out;
      const int rc = isal_inflate(&st);
      used += space - st.avail_out;
      if (rc < 0 || rc > ISAL_OUT_OVERFLOW) corrupt(inflate_problem(rc));
      if (most.learnt(out, used) && guess > out.size()) grow(most.capped(guess));
      if (most.stop(path, used)) {
        out.resize(used);
        return out;
      }
      if (st.block_state == ISAL_BLOCK_FINISH) break;
      if (st.avail_in == 0) {
        if (consumed(st) == in.size()) corrupt("its compressed stream ends early (the file was cut short?)");
        st.avail_in = clamp(in.size() - consumed(st));
      } else if (consumed(st) == in_before && st.avail_out == space) {
        corrupt("its gzip stream cannot be read (ISA-L inflate made no progress)");  // never loop forever
      }
    }
    at = consumed(st);
  }
  out.resize(used);
  return out;
}

}  // namespace

namespace {
// The first `n` bytes of a data file (fewer where it is shorter), and its size.
std::pair<std::vector<uint8_t>, int64_t> read_head(const std::string& path, size_t n) {
  const int fd = open_data_file(path, "dataset file");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) io_error("read dataset file", path);
  std::vector<uint8_t> head(n);
  head.resize(read_into(fd, head.data(), n, "dataset file", path));
  return {std::move(head), static_cast<int64_t>(st.st_size)};
}
}  // namespace

std::vector<uint8_t> read_file_maybe_gzip(const std::string& path, const DecodedSize& limit) {
  HPC_REQUIRE(dataset_file_exists(path), "dataset file ", path, " does not exist");
  // A file that is not gzipped is read no further than its header says it holds: a wrong file of
  // gigabytes under a dataset's name was read whole (its time, and memory to the OOM killer)
  // before its header was looked at.
  if (limit.declared) {
    const auto [head, size] = read_head(path, std::max<size_t>(limit.header, 2));
    if (!gzip_magic(head.data(), head.size()) && head.size() >= limit.header) {
      const DecodedSize::Declared d = limit.declared(head.data());
      if (d.bytes == 0) return head;  // another kind of file: its header says which
      HPC_REQUIRE(static_cast<uint64_t>(size) <= d.bytes, "dataset file ", path, " is malformed: ",
                  static_cast<uint64_t>(size) - d.bytes, " bytes follow ", d.what);
    }
  }
  // As it is on disk; no size limit but the process's memory.
  std::vector<uint8_t> bytes = read_data_file(path, "dataset file", std::numeric_limits<int64_t>::max());
  if (!gzip_magic(bytes.data(), bytes.size())) return bytes;
  return gunzip(path, bytes, limit);
}

Dataset read_idx(const std::string& images_path, const std::string& labels_path, int64_t height, int64_t width,
                 int classes) {
  // Each decoded no further than its header declares (a header of another kind: no further than it).
  const auto declared = [&](uint32_t magic, uint64_t header, const char* what, bool images) {
    return DecodedSize{header, [=](const uint8_t* h) -> DecodedSize::Declared {
                         const uint64_t count = be32(h + 4);
                         if (be32(h) != magic || (images && (be32(h + 8) != height || be32(h + 12) != width))) return {};
                         const uint64_t item = images ? uint64_t{be32(h + 8)} * be32(h + 12) : 1;
                         return {header + count * item, "the " + std::to_string(count) + " " + what + " its header declares"};
                       }};
  };
  std::vector<uint8_t> img = read_file_maybe_gzip(images_path, declared(kImagesMagic, 16, "images", true));
  std::vector<uint8_t> lab = read_file_maybe_gzip(labels_path, declared(kLabelsMagic, 8, "labels", false));
  HPC_REQUIRE(img.size() >= 16, "dataset file ", images_path, " is truncated: ", img.size(),
              " bytes, shorter than the 16-byte IDX image header");
  HPC_REQUIRE(be32(img.data()) == kImagesMagic, "dataset file ", images_path,
              " is not an IDX image file (magic 0x", std::hex, be32(img.data()), ", expected 0x00000803)");
  HPC_REQUIRE(lab.size() >= 8, "dataset file ", labels_path, " is truncated: ", lab.size(),
              " bytes, shorter than the 8-byte IDX label header");
  HPC_REQUIRE(be32(lab.data()) == kLabelsMagic, "dataset file ", labels_path,
              " is not an IDX label file (magic 0x", std::hex, be32(lab.data()), ", expected 0x00000801)");
  const uint32_t n = be32(img.data() + 4), rows = be32(img.data() + 8), cols = be32(img.data() + 12);
  const uint32_t nl = be32(lab.data() + 4);
  HPC_REQUIRE(rows == height && cols == width, "dataset file ", images_path, " holds ", rows, "x", cols,
              " images, expected ", height, "x", width);
  check_size(images_path, img.size(), 16, n, uint64_t{rows} * cols, "images");
  check_size(labels_path, lab.size(), 8, nl, 1, "labels");
  HPC_REQUIRE(n == nl, "dataset files disagree: ", images_path, " holds ", n, " images but ", labels_path,
              " holds ", nl, " labels");
  HPC_REQUIRE(n > 0, "dataset file ", images_path, " holds no images");
  Dataset d;
  d.source = images_path;
  d.count = n;
  d.height = rows;
  d.width = cols;
  d.channels = 1;
  d.classes = classes;
  img.erase(img.begin(), img.begin() + 16);  // in place: a copy would touch 47 MB of new pages
  d.images = std::move(img);
  d.labels.assign(lab.begin() + 8, lab.end());
  for (uint32_t i = 0; i < n; ++i)
    HPC_REQUIRE(d.labels[i] < classes, "dataset file ", labels_path, ": label ", int{d.labels[i]}, " of sample ",
                i, " is out of range (expected 0..", classes - 1, ")");
  return d;
}

}  // namespace hpc::data
