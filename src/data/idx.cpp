// IDX format (LeCun's MNIST distribution): big-endian magic 0x00000803 for images
// (count, rows, cols follow) and 0x00000801 for labels (count follows), then raw uint8 data.
#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "core/error.hpp"
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
              S_ISDIR(st.st_mode) ? " (a directory)" : "");
  return true;
}

std::vector<uint8_t> read_file_maybe_gzip(const std::string& path) {
  HPC_REQUIRE(dataset_file_exists(path), "dataset file ", path, " does not exist");
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files transparently
  HPC_REQUIRE(f != nullptr, "cannot open dataset file ", path, ": ", std::strerror(errno));
  std::vector<uint8_t> out;
  std::vector<uint8_t> buf(1 << 20);
  for (;;) {
    int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      usage_error("dataset file ", path, " is corrupt: ", msg);
    }
    if (n == 0) break;
    try {
      out.insert(out.end(), buf.begin(), buf.begin() + n);
    } catch (const std::bad_alloc&) {
      gzclose(f);
      usage_error("dataset file ", path, " does not fit in this process's memory (", out.size(),
                  " bytes read so far): is it the dataset's file?");
    }
  }
  // A gzip stream cut short reads as a clean end of data with zlib; gzclose reports it.
  int rc = gzclose(f);
  HPC_REQUIRE(rc == Z_OK, "dataset file ", path, " is corrupt: compressed stream ends early or fails its CRC");
  return out;
}

Dataset read_idx(const std::string& images_path, const std::string& labels_path, int64_t height, int64_t width,
                 int classes) {
  std::vector<uint8_t> img = read_file_maybe_gzip(images_path);
  std::vector<uint8_t> lab = read_file_maybe_gzip(labels_path);
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
  d.images.assign(img.begin() + 16, img.end());
  d.labels.assign(lab.begin() + 8, lab.end());
  for (uint32_t i = 0; i < n; ++i)
    HPC_REQUIRE(d.labels[i] < classes, "dataset file ", labels_path, ": label ", int{d.labels[i]}, " of sample ",
                i, " is out of range (expected 0..", classes - 1, ")");
  return d;
}

}  // namespace hpc::data
