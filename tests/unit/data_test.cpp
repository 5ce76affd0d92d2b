// Dataset readers (IDX, CIFAR-10), batch assembly, augmentation and the prefetching loader,
// on small files the tests write themselves.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <chrono>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "data/dataset.hpp"
#include "data/loader.hpp"
#include "data/nvjpeg.hpp"
#include "data/sampler.hpp"
#include "unit/data_test_util.hpp"

namespace hpc::data {
namespace {
namespace fs = std::filesystem;

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

Bytes idx_images(uint32_t n, uint32_t rows, uint32_t cols, uint32_t magic = 0x803) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) b.push_back(static_cast<uint8_t>((i * 7 + i / 13) & 0xff));
  return b;
}

Bytes idx_labels(uint32_t n, int classes = 10, uint32_t magic = 0x801) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, n);
  for (uint32_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>((i * 3) % classes));
  return b;
}

// An IDX file of n 28x28 images, the first `patterned` as idx_images makes them, the rest zeros
// left as a hole in the file: the published counts cost the disk nothing.
void write_idx_images(const std::string& path, uint32_t n, uint32_t patterned) {
  Bytes b = idx_images(patterned, 28, 28);
  for (int i = 0; i < 4; ++i) b[4 + i] = static_cast<uint8_t>(n >> (24 - 8 * i));  // the header's count
  write_raw(path, b);
  fs::resize_file(path, 16 + uintmax_t{n} * 28 * 28);
}

void write_gzip(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, b.data(), static_cast<unsigned>(b.size())), static_cast<int>(b.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// ---- IDX -------------------------------------------------------------------------------------

TEST(IdxReader, RawFiles) {
  TempDir dir;
  const Bytes img = idx_images(5, 4, 3), lab = idx_labels(5);
  write_raw(dir.file("img"), img);
  write_raw(dir.file("lab"), lab);
  const Dataset d = read_idx(dir.file("img"), dir.file("lab"), 4, 3, 10);
  EXPECT_EQ(d.count, 5);
  EXPECT_EQ(d.height, 4);
  EXPECT_EQ(d.width, 3);
  EXPECT_EQ(d.channels, 1);
  EXPECT_EQ(d.classes, 10);
  EXPECT_EQ(d.sample_bytes(), 12);
  EXPECT_EQ(d.images, Bytes(img.begin() + 16, img.end()));
  EXPECT_EQ(d.labels, std::vector<int32_t>(lab.begin() + 8, lab.end()));
}

TEST(IdxReader, GzipFilesReadTheSameAsRaw) {
  TempDir dir;
  const Bytes img = idx_images(70, 28, 28), lab = idx_labels(70);
  write_gzip(dir.file("img.gz"), img);
  write_gzip(dir.file("lab.gz"), lab);
  write_raw(dir.file("img"), img);
  write_raw(dir.file("lab"), lab);
  ASSERT_NE(read_raw(dir.file("img.gz")), img);  // really compressed
  EXPECT_EQ(read_file_maybe_gzip(dir.file("img.gz")), img);
  EXPECT_EQ(read_file_maybe_gzip(dir.file("img")), img);
  const Dataset gz = read_idx(dir.file("img.gz"), dir.file("lab.gz"), 28, 28, 10);
  const Dataset raw = read_idx(dir.file("img"), dir.file("lab"), 28, 28, 10);
  EXPECT_EQ(gz.images, raw.images);
  EXPECT_EQ(gz.labels, raw.labels);
  EXPECT_EQ(gz.count, 70);
}

TEST(IdxReader, LargerThanOneReadBuffer) {  // the file is read 64 KiB at a time
  TempDir dir;
  const Bytes img = idx_images(1500, 28, 28), lab = idx_labels(1500);
  write_gzip(dir.file("img.gz"), img);
  write_raw(dir.file("lab"), lab);
  const Dataset d = read_idx(dir.file("img.gz"), dir.file("lab"), 28, 28, 10);
  EXPECT_EQ(d.images, Bytes(img.begin() + 16, img.end()));
}

// Several gzip members read as one file, as gzip -d reads them (`cat a.gz b.gz`). A large first
// member and a small last one: the size first guessed from the last member's trailer is far too
// small, and the output grows.
TEST(IdxReader, ConcatenatedGzipMembersReadAsOneFile) {
  TempDir dir;
  const Bytes img = idx_images(1500, 28, 28);
  const size_t cut = img.size() - 100;
  write_gzip(dir.file("a.gz"), Bytes(img.begin(), img.begin() + static_cast<long>(cut)));
  write_gzip(dir.file("b.gz"), Bytes(img.begin() + static_cast<long>(cut), img.end()));
  Bytes both = read_raw(dir.file("a.gz"));
  const Bytes b = read_raw(dir.file("b.gz"));
  both.insert(both.end(), b.begin(), b.end());
  write_raw(dir.file("both.gz"), both);
  EXPECT_EQ(read_file_maybe_gzip(dir.file("both.gz")), img);
  write_gzip(dir.file("empty.gz"), Bytes{});
  EXPECT_EQ(read_file_maybe_gzip(dir.file("empty.gz")), Bytes{});
}

// Every malformed file is a usage error whose message names the file and the problem.
TEST(IdxReader, MalformedFilesAreUsageErrors) {
  TempDir dir;
  const std::string img = dir.file("img"), lab = dir.file("lab");
  auto check = [&](const Bytes& images, const Bytes& labels, const std::string& names_file,
                   const std::string& problem, int64_t h = 4, int64_t w = 3) {
    write_raw(img, images);
    write_raw(lab, labels);
    const std::string msg = usage_error_of([&] { read_idx(img, lab, h, w, 10); });
    EXPECT_NE(msg.find(names_file), std::string::npos) << msg;
    EXPECT_NE(msg.find(problem), std::string::npos) << msg;
  };
  const Bytes good_img = idx_images(5, 4, 3), good_lab = idx_labels(5);
  check(idx_images(5, 4, 3, 0x802), good_lab, img, "not an IDX image file");
  check(good_img, idx_labels(5, 10, 0x803), lab, "not an IDX label file");
  check(Bytes(good_img.begin(), good_img.end() - 1), good_lab, img, "truncated");
  check(Bytes(good_img.begin(), good_img.begin() + 10), good_lab, img, "truncated");
  check(Bytes{}, good_lab, img, "truncated");
  check(good_img, Bytes(good_lab.begin(), good_lab.end() - 2), lab, "truncated");
  Bytes trailing = good_img;
  trailing.push_back(0);
  check(trailing, good_lab, img, "1 bytes follow");
  check(idx_images(5, 4, 3), idx_labels(6), lab, "disagree");
  check(idx_images(5, 5, 3), good_lab, img, "5x3 images, expected 4x3");
  check(idx_images(0, 4, 3), idx_labels(0), img, "no images");
  Bytes bad_label = good_lab;
  bad_label[8 + 3] = 10;
  check(good_img, bad_label, lab, "label 10 of sample 3 is out of range");
  // Missing files.
  fs::remove(lab);
  EXPECT_NE(usage_error_of([&] { read_idx(img, lab, 4, 3, 10); }).find("does not exist"), std::string::npos);
}

// A small gzip file that inflates far past what its header declares (a gzip bomb, or another
// file): refused at the declared size, never decoded whole. An 18 MB label file of 4 GiB took 4.8
// GB of memory and 25 s before its size was checked; one a little larger would have been killed
// by the OOM killer instead of refused. Here 64 MiB of zeros after five labels, and again after
// an image header of another kind (decoded no further than it: its magic is the error).
TEST(IdxReader, AGzipFileIsNeverDecodedPastWhatItsHeaderDeclares) {
  TempDir dir;
  const Bytes img = idx_images(5, 4, 3);
  Bytes lab = idx_labels(5), wrong = idx_images(5, 4, 3, 0x802);
  lab.resize(lab.size() + (64 << 20));
  wrong.resize(wrong.size() + (64 << 20));
  write_raw(dir.file("img"), img);
  write_gzip(dir.file("lab.gz"), lab);
  write_gzip(dir.file("wrong.gz"), wrong);
  EXPECT_EQ(usage_error_of([&] { read_idx(dir.file("img"), dir.file("lab.gz"), 4, 3, 10); }),
            "dataset file " + dir.file("lab.gz") + " is malformed: bytes follow the 5 labels its header declares (13 "
            "bytes; its gzip stream holds more, not decoded further)");
  write_raw(dir.file("lab"), idx_labels(5));
  EXPECT_NE(usage_error_of([&] { read_idx(dir.file("wrong.gz"), dir.file("lab"), 4, 3, 10); })
                .find("is not an IDX image file (magic 0x802"),
            std::string::npos);
  // What a header declares is read whole.
  write_gzip(dir.file("good.gz"), img);
  EXPECT_EQ(read_idx(dir.file("good.gz"), dir.file("lab"), 4, 3, 10).images, Bytes(img.begin() + 16, img.end()));
}

// A file that is not gzipped is read no further than its header declares either: a wrong file
// of gigabytes under a dataset's name was read whole (seconds, and its size in memory, or the OOM
// killer) before its header was looked at. Here sparse files of 64 GiB, which reading whole could
// not even hold: one whose header declares 5 images, and one whose header is of no IDX file.
TEST(IdxReader, AFileThatIsNotGzippedIsReadNoFurtherThanItsHeaderDeclares) {
  TempDir dir;
  const uint64_t huge = uint64_t{64} << 30;
  write_raw(dir.file("lab"), idx_labels(5));
  const Bytes img = idx_images(5, 4, 3);
  write_raw(dir.file("img"), img);
  fs::resize_file(dir.file("img"), huge);
  EXPECT_EQ(usage_error_of([&] { read_idx(dir.file("img"), dir.file("lab"), 4, 3, 10); }),
            "dataset file " + dir.file("img") + " is malformed: " + std::to_string(huge - img.size()) +
                " bytes follow the 5 images its header declares");
  write_raw(dir.file("zeros"), Bytes(16, 0));
  fs::resize_file(dir.file("zeros"), huge);
  EXPECT_NE(usage_error_of([&] { read_idx(dir.file("zeros"), dir.file("lab"), 4, 3, 10); })
                .find("is not an IDX image file (magic 0x0, expected 0x00000803)"),
            std::string::npos);
}

TEST(IdxReader, CorruptGzipIsAUsageError) {
  TempDir dir;
  const Bytes img = idx_images(200, 28, 28);
  write_gzip(dir.file("full.gz"), img);
  const Bytes gz = read_raw(dir.file("full.gz"));
  // Cut short: the input ends before the stream does.
  write_raw(dir.file("cut.gz"), Bytes(gz.begin(), gz.begin() + static_cast<long>(gz.size() / 2)));
  std::string msg = usage_error_of([&] { read_file_maybe_gzip(dir.file("cut.gz")); });
  EXPECT_NE(msg.find("cut.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupt"), std::string::npos) << msg;
  // Only the 8-byte trailer (CRC and length) missing.
  write_raw(dir.file("notrailer.gz"), Bytes(gz.begin(), gz.end() - 8));
  msg = usage_error_of([&] { read_file_maybe_gzip(dir.file("notrailer.gz")); });
  EXPECT_NE(msg.find("corrupt"), std::string::npos) << msg;
  // A flipped bit in the compressed data: a CRC or stream error.
  Bytes flipped = gz;
  flipped[gz.size() / 2] ^= 0x10;
  write_raw(dir.file("flipped.gz"), flipped);
  msg = usage_error_of([&] { read_file_maybe_gzip(dir.file("flipped.gz")); });
  EXPECT_NE(msg.find("corrupt"), std::string::npos) << msg;
  // The data whole and its CRC-32 (the trailer's first 4 bytes) wrong.
  Bytes crc = gz;
  crc[gz.size() - 8] ^= 0x01;
  write_raw(dir.file("crc.gz"), crc);
  msg = usage_error_of([&] { read_file_maybe_gzip(dir.file("crc.gz")); });
  EXPECT_NE(msg.find("crc.gz is corrupt: its data does not match its CRC-32"), std::string::npos) << msg;
  // Bytes after the stream that are not another gzip member: an error, not ignored.
  for (const Bytes& tail : {Bytes{0}, Bytes{'x', 'y', 'z'}, Bytes{0x1f}}) {
    Bytes trailing = gz;
    trailing.insert(trailing.end(), tail.begin(), tail.end());
    write_raw(dir.file("trailing.gz"), trailing);
    msg = usage_error_of([&] { read_file_maybe_gzip(dir.file("trailing.gz")); });
    EXPECT_NE(msg.find("trailing.gz is corrupt: " + std::to_string(tail.size()) +
                       " bytes that are not gzip data follow its compressed stream"),
              std::string::npos)
        << msg;
  }
  // A gzip header naming another method than DEFLATE (8).
  Bytes method = gz;
  method[2] = 7;
  write_raw(dir.file("method.gz"), method);
  msg = usage_error_of([&] { read_file_maybe_gzip(dir.file("method.gz")); });
  EXPECT_NE(msg.find("method.gz is corrupt: "), std::string::npos) << msg;
  // Only the magic.
  write_raw(dir.file("magic.gz"), Bytes{0x1f, 0x8b});
  msg = usage_error_of([&] { read_file_maybe_gzip(dir.file("magic.gz")); });
  EXPECT_NE(msg.find("magic.gz is corrupt: its compressed stream ends early"), std::string::npos) << msg;
}

// load_dataset finds NAME.gz, NAME, and the dotted variant (train-images.idx3-ubyte).
TEST(LoadDataset, FindsIdxFilesUnderEveryName) {
  TempDir dir;
  write_idx_images(dir.file("train-images-idx3-ubyte"), kIdxTrainRecords, 6);
  write_gzip(dir.file("train-labels-idx1-ubyte.gz"), idx_labels(kIdxTrainRecords));
  write_idx_images(dir.file("t10k-images.idx3-ubyte"), kIdxTestRecords, 3);
  write_gzip(dir.file("t10k-labels.idx1-ubyte.gz"), idx_labels(kIdxTestRecords));
  const DatasetPair p = load_dataset(parse_dataset("fashion-mnist"), dir.path().string());
  EXPECT_EQ(p.train.count, kIdxTrainRecords);
  EXPECT_EQ(p.test.count, kIdxTestRecords);
  const Bytes first = idx_images(3, 28, 28);
  EXPECT_TRUE(std::equal(first.begin() + 16, first.end(), p.test.images.begin()));
  ASSERT_EQ(p.norm.mean.size(), 1u);
  EXPECT_FLOAT_EQ(p.norm.mean[0], 0.2860f);
  EXPECT_FLOAT_EQ(p.norm.std[0], 0.3530f);
  const DatasetPair m = load_dataset(parse_dataset("mnist"), dir.path().string());
  EXPECT_FLOAT_EQ(m.norm.mean[0], 0.1307f);
  // One file missing: named in the message.
  fs::remove(dir.file("t10k-labels.idx1-ubyte.gz"));
  const std::string msg = usage_error_of([&] { load_dataset(parse_dataset("fashion-mnist"), dir.path().string()); });
  EXPECT_NE(msg.find("t10k-labels-idx1-ubyte"), std::string::npos) << msg;
}

// MNIST's and Fashion-MNIST's files hold their published counts, as CIFAR's do: the test files
// copied over the training files (which would train on the test set and evaluate on it) are
// refused as the same records, and a file of another count as not the published set.
TEST(LoadDataset, IdxFilesHoldThePublishedRecords) {
  for (const char* name : {"fashion-mnist", "mnist"}) {
    SCOPED_TRACE(name);
    TempDir dir;
    auto files = [&](uint32_t train, uint32_t test) {
      write_idx_images(dir.file("train-images-idx3-ubyte"), train, 20);
      write_raw(dir.file("train-labels-idx1-ubyte"), idx_labels(train));
      write_idx_images(dir.file("t10k-images-idx3-ubyte"), test, 20);
      write_raw(dir.file("t10k-labels-idx1-ubyte"), idx_labels(test));
    };
    auto refusal = [&] { return usage_error_of([&] { load_dataset(parse_dataset(name), dir.path().string()); }); };
    files(kIdxTrainRecords, kIdxTestRecords);
    EXPECT_EQ(load_dataset(parse_dataset(name), dir.path().string()).train.count, kIdxTrainRecords);
    files(kIdxTestRecords, kIdxTestRecords);  // the test files over the training files
    std::string msg = refusal();
    for (const char* says : {"train-images-idx3-ubyte and ", "t10k-images-idx3-ubyte hold the same records",
                             "the test set would be trained on"})
      EXPECT_NE(msg.find(says), std::string::npos) << msg;
    files(kIdxTrainRecords - 1, kIdxTestRecords);
    msg = refusal();
    EXPECT_NE(msg.find("train-images-idx3-ubyte holds 59999 images where " + std::string(name) +
                       "'s training set has 60000"), std::string::npos) << msg;
    files(kIdxTrainRecords, kIdxTestRecords + 1);
    msg = refusal();
    EXPECT_NE(msg.find("t10k-images-idx3-ubyte holds 10001 images where " + std::string(name) +
                       "'s test set has 10000"), std::string::npos) << msg;
  }
}

// evaluate reads the test set alone (test_only): a directory without the training files (staged
// for evaluation only) serves it, and the test files are checked as ever. It asked for the training
// files too, and read 60000 images for nothing.
TEST(LoadDataset, TheTestSetAloneForEvaluation) {
  TempDir dir;
  write_idx_images(dir.file("t10k-images-idx3-ubyte"), kIdxTestRecords, 3);
  write_raw(dir.file("t10k-labels-idx1-ubyte"), idx_labels(kIdxTestRecords));
  const DatasetPair p = load_dataset(parse_dataset("fashion-mnist"), dir.path().string(), 0, /*test_only=*/true);
  EXPECT_EQ(p.test.count, kIdxTestRecords);
  EXPECT_EQ(p.train.count, 0);
  EXPECT_FLOAT_EQ(p.norm.mean.at(0), 0.2860f);
  EXPECT_NE(usage_error_of([&] { load_dataset(parse_dataset("fashion-mnist"), dir.path().string()); }).find("train-"),
            std::string::npos);
  write_raw(dir.file("t10k-labels-idx1-ubyte"), idx_labels(kIdxTestRecords - 1));  // still checked
  EXPECT_NE(usage_error_of([&] { load_dataset(parse_dataset("mnist"), dir.path().string(), 0, true); }).find("disagree"),
            std::string::npos);
  // CIFAR-10's test batch alone, in the directory the tarball unpacks to.
  const fs::path batches = dir.path() / "cifar" / "cifar-10-batches-bin";
  fs::create_directories(batches);
  write_raw((batches / "test_batch.bin").string(), Bytes{});
  fs::resize_file(batches / "test_batch.bin", kCifar10RecordsPerFile * 3073);  // zeros: label 0, black
  const DatasetPair c = load_dataset(parse_dataset("cifar10"), (dir.path() / "cifar").string(), 0, true);
  EXPECT_EQ(c.test.count, kCifar10RecordsPerFile);
  EXPECT_EQ(c.train.count, 0);
}

TEST(LoadDataset, UnknownNameAndMissingDirectory) {
  EXPECT_NE(usage_error_of([] { load_dataset(parse_dataset("imagenet"), "/tmp"); }).find("unknown --dataset 'imagenet'"),
            std::string::npos);
  const std::string msg = usage_error_of([] { load_dataset(parse_dataset("fashion-mnist"), "/nonexistent/hpctrain/data"); });
  EXPECT_NE(msg.find("/nonexistent/hpctrain/data"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

// hpcdata.json (hpcdata prepare's record of the dataset) is read as a dataset file: one that is not
// a regular file is refused naming it. A FIFO blocked the run in open() (deaf to TERM, its stop
// signal), a directory failed with the C++ library's "basic_filebuf::underflow error".
TEST(LoadDataset, APreparedManifestThatIsNoRegularFileIsRefused) {
  TempDir dir;
  const std::string manifest = dir.file("hpcdata.json");
  fs::create_directory(manifest);
  std::string msg = usage_error_of([&] { load_dataset(parse_dataset("mnist"), dir.path().string()); });
  EXPECT_NE(msg.find(manifest + " is not a regular file (a directory)"), std::string::npos) << msg;
  fs::remove(manifest);
  ASSERT_EQ(::mkfifo(manifest.c_str(), 0600), 0) << std::strerror(errno);
  // Were the FIFO opened for reading, a writer opened and closed after a while unblocks it (EOF):
  // the test then fails instead of hanging.
  std::atomic<bool> done{false};
  std::thread unblock([&] {
    for (int i = 0; !done; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (i < 100) continue;
      if (const int fd = ::open(manifest.c_str(), O_WRONLY | O_NONBLOCK); fd >= 0) ::close(fd);
    }
  });
  msg = usage_error_of([&] { load_dataset(parse_dataset("mnist"), dir.path().string()); });
  done = true;
  unblock.join();
  EXPECT_NE(msg.find(manifest + " is not a regular file (a FIFO or device?)"), std::string::npos) << msg;
}

// Synthetic data needs no directory, takes its size from --image-size, and is the same bytes
// every time (every rank generates it itself).
TEST(LoadDataset, SyntheticIsReproducibleAndSized) {
  const DatasetPair a = load_dataset(parse_dataset("synthetic"), "/nonexistent/hpctrain/data", 20);
  EXPECT_EQ(a.train.count, kSyntheticTrain);
  EXPECT_EQ(a.test.count, kSyntheticTest);
  EXPECT_EQ(a.train.height, 20);
  EXPECT_EQ(a.train.width, 20);
  EXPECT_EQ(a.train.channels, 3);
  EXPECT_EQ(a.train.classes, 1000);
  ASSERT_EQ(a.train.images.size(), static_cast<size_t>(kSyntheticTrain * 20 * 20 * 3));
  ASSERT_EQ(a.norm.mean.size(), 3u);
  const DatasetPair b = load_synthetic(20);
  EXPECT_EQ(a.train.images, b.train.images);
  EXPECT_EQ(a.test.labels, b.test.labels);
  EXPECT_NE(a.train.images, std::vector<uint8_t>(a.train.images.size(), a.train.images[0])) << "not random";
  EXPECT_NE(std::vector<uint8_t>(a.train.images.begin(), a.train.images.begin() + 1200),
            std::vector<uint8_t>(a.test.images.begin(), a.test.images.begin() + 1200))
      << "the test split is other images";
  // Labels cover the classes roughly uniformly, all in range.
  std::vector<int> seen(1000, 0);
  for (int32_t l : a.train.labels) {
    ASSERT_GE(l, 0);
    ASSERT_LT(l, 1000);
    seen[l] = 1;
  }
  EXPECT_GT(std::accumulate(seen.begin(), seen.end(), 0), 500);
}

TEST(Dataset, TruncateKeepsTheFirstSamples) {
  Dataset d;
  d.count = 4;
  d.height = d.width = 2;
  d.channels = 1;
  d.images = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  d.labels = {1, 2, 3, 4};
  d.truncate(0);  // no-op
  EXPECT_EQ(d.count, 4);
  d.truncate(10);  // more than there is: no-op
  EXPECT_EQ(d.count, 4);
  d.truncate(2);
  EXPECT_EQ(d.count, 2);
  EXPECT_EQ(d.images, Bytes({0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(d.labels, std::vector<int32_t>({1, 2}));
}

// ---- CIFAR-10 --------------------------------------------------------------------------------

constexpr int kPlane = 1024, kRecord = 3073;

// Record i: label i % 10, pixel p of channel c holds (p + 37 c + 11 i) mod 251.
Bytes cifar_records(int n, int first = 0) {
  Bytes b;
  for (int i = first; i < first + n; ++i) {
    b.push_back(static_cast<uint8_t>(i % 10));
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < kPlane; ++p) b.push_back(static_cast<uint8_t>((p + 37 * c + 11 * i) % 251));
  }
  return b;
}

TEST(CifarReader, PlanarRgbBecomesInterleaved) {
  TempDir dir;
  write_raw(dir.file("a.bin"), cifar_records(3));
  write_raw(dir.file("b.bin"), cifar_records(2, 3));
  const Dataset d = read_cifar10({dir.file("a.bin"), dir.file("b.bin")});
  EXPECT_EQ(d.count, 5);
  EXPECT_EQ(d.height, 32);
  EXPECT_EQ(d.width, 32);
  EXPECT_EQ(d.channels, 3);
  ASSERT_EQ(d.images.size(), 5u * 3 * kPlane);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(d.labels[i], i % 10);
    for (int p = 0; p < kPlane; ++p)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(d.images[(i * kPlane + p) * 3 + c], (p + 37 * c + 11 * i) % 251)
            << "sample " << i << " pixel " << p << " channel " << c;
  }
}

TEST(CifarReader, MalformedFilesAreUsageErrors) {
  TempDir dir;
  Bytes recs = cifar_records(2);
  write_raw(dir.file("short.bin"), Bytes(recs.begin(), recs.end() - 1));
  std::string msg = usage_error_of([&] { read_cifar10({dir.file("short.bin")}); });
  EXPECT_NE(msg.find("short.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3073"), std::string::npos) << msg;
  write_raw(dir.file("empty.bin"), {});
  usage_error_of([&] { read_cifar10({dir.file("empty.bin")}); });
  recs[kRecord] = 10;  // label of the second record
  write_raw(dir.file("label.bin"), recs);
  msg = usage_error_of([&] { read_cifar10({dir.file("label.bin")}); });
  EXPECT_NE(msg.find("label 10 of record 1"), std::string::npos) << msg;
  usage_error_of([&] { read_cifar10({dir.file("missing.bin")}); });
}

// load_dataset takes the directory the tarball unpacks to, or its parent, and holds every file
// to its published count of records (small files here: the error names the file found inside).
TEST(LoadDataset, Cifar10DirectoryOrItsParent) {
  TempDir dir;
  const fs::path inner = dir.path() / "cifar-10-batches-bin";
  fs::create_directory(inner);
  for (int i = 1; i <= 5; ++i) write_raw((inner / ("data_batch_" + std::to_string(i) + ".bin")).string(), cifar_records(2, i));
  write_raw((inner / "test_batch.bin").string(), cifar_records(3));
  for (const fs::path& root : {inner, dir.path()}) {
    const std::string msg = usage_error_of([&] { load_dataset(parse_dataset("cifar10"), root.string()); });
    EXPECT_NE(msg.find((inner / "data_batch_1.bin").string() + " holds 2 CIFAR-10 records, but the published "
                       "data_batch_1.bin holds 10000: 9998 missing"),
              std::string::npos)
        << msg;
  }
}

// A file with the published count is read; one record more or less is refused.
TEST(CifarReader, RecordsPerFileAreExact) {
  TempDir dir;
  write_raw(dir.file("batch.bin"), cifar_records(4));
  EXPECT_EQ(read_cifar10({dir.file("batch.bin")}, 4).count, 4);
  std::string msg = usage_error_of([&] { read_cifar10({dir.file("batch.bin")}, 3); });
  EXPECT_NE(msg.find("holds 4 CIFAR-10 records, but the published batch.bin holds 3: 1 too many (records appended"),
            std::string::npos)
      << msg;
  msg = usage_error_of([&] { read_cifar10({dir.file("batch.bin")}, 5); });
  EXPECT_NE(msg.find("1 missing (truncated?)"), std::string::npos) << msg;
  EXPECT_EQ(read_cifar10({dir.file("batch.bin")}).count, 4);  // 0: any count
  // Gzipped: read as it is up to twice the count (the count's message above), never decoded past.
  write_gzip(dir.file("batch.gz"), cifar_records(4));
  msg = usage_error_of([&] { read_cifar10({dir.file("batch.gz")}, 3); });
  EXPECT_NE(msg.find("1 too many"), std::string::npos) << msg;
  EXPECT_EQ(usage_error_of([&] { read_cifar10({dir.file("batch.gz")}, 1); }),
            "dataset file " + dir.file("batch.gz") + " is malformed: bytes follow twice the 1 records of a published "
            "CIFAR-10 file (6146 bytes; its gzip stream holds more, not decoded further)");
}

// CIFAR-100 record i: coarse label i % 20, fine label (7 i) % 100, pixels as in cifar_records.
Bytes cifar100_records(int n, int first = 0) {
  Bytes b;
  for (int i = first; i < first + n; ++i) {
    b.push_back(static_cast<uint8_t>(i % 20));
    b.push_back(static_cast<uint8_t>((7 * i) % 100));
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < kPlane; ++p) b.push_back(static_cast<uint8_t>((p + 37 * c + 11 * i) % 251));
  }
  return b;
}

TEST(CifarReader, Cifar100TrainsOnTheFineLabels) {
  TempDir dir;
  write_raw(dir.file("train.bin"), cifar100_records(20));
  const Dataset d = read_cifar100({dir.file("train.bin")});
  EXPECT_EQ(d.count, 20);
  EXPECT_EQ(d.classes, 100);
  ASSERT_EQ(d.images.size(), 20u * 3 * kPlane);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(d.labels[i], (7 * i) % 100);
    for (int p = 0; p < kPlane; p += 97)
      for (int c = 0; c < 3; ++c) ASSERT_EQ(d.images[(i * kPlane + p) * 3 + c], (p + 37 * c + 11 * i) % 251);
  }
  // CIFAR-10 files are not silently read as CIFAR-100 (3073 does not divide 3 x 3074).
  write_raw(dir.file("ten.bin"), cifar_records(3));
  std::string msg = usage_error_of([&] { read_cifar100({dir.file("ten.bin")}); });
  EXPECT_NE(msg.find("3074-byte CIFAR-100 records"), std::string::npos) << msg;
  Bytes bad = cifar100_records(2);
  bad[3074 + 1] = 100;  // fine label of the second record
  write_raw(dir.file("label.bin"), bad);
  msg = usage_error_of([&] { read_cifar100({dir.file("label.bin")}); });
  EXPECT_NE(msg.find("label 100 of record 1"), std::string::npos) << msg;
}

TEST(LoadDataset, Cifar100DirectoryOrItsParent) {
  TempDir dir;
  const fs::path inner = dir.path() / "cifar-100-binary";
  fs::create_directory(inner);
  write_raw((inner / "train.bin").string(), cifar100_records(6));
  write_raw((inner / "test.bin").string(), cifar100_records(4, 6));
  for (const fs::path& root : {inner, dir.path()}) {
    const std::string msg = usage_error_of([&] { load_dataset(parse_dataset("cifar100"), root.string()); });
    EXPECT_NE(msg.find((inner / "train.bin").string() + " holds 6 CIFAR-100 records, but the published train.bin "
                       "holds 50000"),
              std::string::npos)
        << msg;
  }
}

// ---- BatchAssembler --------------------------------------------------------------------------

Dataset ramp_dataset(int64_t count, int64_t h, int64_t w, int64_t c) {
  Dataset d;
  d.count = count;
  d.height = h;
  d.width = w;
  d.channels = c;
  d.images.resize(count * h * w * c);
  for (size_t i = 0; i < d.images.size(); ++i) d.images[i] = static_cast<uint8_t>((i * 29 + i / 7) % 256);
  for (int64_t i = 0; i < count; ++i) d.labels.push_back(static_cast<uint8_t>(i % 10));
  return d;
}

TEST(BatchAssembler, NormalisesPerChannel) {
  Dataset d;
  d.count = 2;
  d.height = 1;
  d.width = 2;
  d.channels = 3;
  d.images = {0, 255, 51, 102, 204, 255, /* sample 1: */ 1, 2, 3, 4, 5, 6};
  d.labels = {7, 2};
  const Normalization norm{{0.5f, 0.25f, 0.0f}, {0.5f, 0.25f, 2.0f}};
  BatchAssembler a(d, norm, {}, 1);
  Batch b;
  a.assemble({0, 1}, 0, false, b);
  ASSERT_EQ(b.images.shape(), Shape({2, 1, 2, 3}));
  EXPECT_EQ(b.labels, std::vector<int32_t>({7, 2}));
  const float* x = b.images.data<float>();
  auto want = [&](int v, int c) { return (v / 255.0f - norm.mean[c]) / norm.std[c]; };
  EXPECT_FLOAT_EQ(x[0], -1.0f);  // 0 in channel 0: (0 - 0.5) / 0.5
  EXPECT_FLOAT_EQ(x[1], 3.0f);   // 255 in channel 1: (1 - 0.25) / 0.25
  EXPECT_FLOAT_EQ(x[2], 0.1f);   // 51 in channel 2: 0.2 / 2
  for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(x[i], want(d.images[i], i % 3)) << i;
  // Sample order follows the indices.
  a.assemble({1, 0}, 0, false, b);
  EXPECT_FLOAT_EQ(b.images.data<float>()[0], want(1, 0));
  EXPECT_EQ(b.labels, std::vector<int32_t>({2, 7}));
}

TEST(BatchAssembler, AugmentFlagOffOrNothingToDoMeansPlainCopy) {
  const Dataset d = ramp_dataset(8, 5, 6, 1);
  const Normalization norm{{0.3f}, {0.2f}};
  BatchAssembler plain(d, norm, {}, 3), aug(d, norm, {2, true}, 3);
  Batch p, a, n;
  const std::vector<uint32_t> idx{0, 1, 2, 3, 4, 5, 6, 7};
  plain.assemble(idx, 0, true, p);   // nothing to do
  aug.assemble(idx, 0, false, n);    // augmentation off (evaluation)
  aug.assemble(idx, 0, true, a);
  const auto bytes = p.images.bytes();
  EXPECT_EQ(std::memcmp(p.images.raw(), n.images.raw(), bytes), 0);
  EXPECT_NE(std::memcmp(p.images.raw(), a.images.raw(), bytes), 0);
}

// Batches of bytes (for a GPU to augment and normalise) are the float batches before the
// crops and the table: the samples as stored, each one's crop and flip, and the table. With
// the crops applied (apply_crops, the GPU kernel's reference), the table gives the floats.
TEST(BatchAssembler, BytesAreTheFloatBatchBeforeCropsAndNormalisation) {
  const Dataset d = ramp_dataset(12, 6, 5, 3);
  const Normalization norm{{0.1f, 0.2f, 0.3f}, {0.3f, 0.25f, 0.5f}};
  const std::vector<uint32_t> idx{4, 0, 11, 7, 7, 2};
  const int64_t per = 6 * 5 * 3;
  BatchAssembler floats(d, norm, {2, true}, 17), bytes(d, norm, {2, true}, 17, 1, true);
  Batch f, b;
  for (bool augment : {true, false, true}) {  // the same batch object, crops on, off and on
    floats.assemble(idx, 3, augment, f);
    bytes.assemble(idx, 3, augment, b);
    EXPECT_EQ(f.table, nullptr);
    EXPECT_TRUE(f.crops.empty());
    ASSERT_EQ(b.table, &bytes.table());
    ASSERT_EQ(b.images.dtype(), DType::U8);
    ASSERT_EQ(b.images.shape(), f.images.shape());
    EXPECT_EQ(b.labels, f.labels);
    ASSERT_EQ(b.crops.size(), augment ? idx.size() : 0u);
    for (size_t i = 0; i < idx.size(); ++i)  // as stored
      ASSERT_EQ(std::memcmp(b.images.data<uint8_t>() + i * per, d.images.data() + idx[i] * per, per), 0) << i;
    const Tensor cropped = apply_crops(b);
    const uint8_t* px = cropped.data<uint8_t>();
    const float* x = f.images.data<float>();
    for (int64_t i = 0; i < f.images.numel(); ++i)
      ASSERT_EQ(x[i], (*b.table)[(i % 3) * 256 + px[i]]) << "element " << i << (augment ? " (augmented)" : "");
  }
  // Some crops move the sample and some flip it, else the test above proves little.
  bytes.assemble(std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 0, true, b);
  int moved = 0, flipped = 0;
  for (const CropFlip& cf : b.crops) {
    moved += cf.dy != 0 || cf.dx != 0;
    flipped += cf.flip;
    EXPECT_LE(std::abs(cf.dy), 2);
    EXPECT_LE(std::abs(cf.dx), 2);
  }
  EXPECT_GT(moved, 0);
  EXPECT_GT(flipped, 0);
  EXPECT_LT(flipped, 12);
}

TEST(BatchAssembler, ApplyCropsRefusesCropsThatDoNotFitTheBatch) {
  const Dataset d = ramp_dataset(4, 3, 3, 1);
  BatchAssembler bytes(d, {{0.5f}, {0.5f}}, {1, true}, 3, 1, true);
  Batch b;
  bytes.assemble({0, 1, 2}, 0, true, b);
  b.crops.pop_back();
  EXPECT_THROW(apply_crops(b), Error);
  BatchAssembler floats(d, {{0.5f}, {0.5f}}, {1, true}, 3);
  floats.assemble({0, 1}, 0, true, b);
  EXPECT_THROW(apply_crops(b), Error);  // floats: nothing to crop
}

// Augmentation is keyed by (seed, epoch, sample index), not by position in the batch.
TEST(BatchAssembler, AugmentationIsDeterministic) {
  const Dataset d = ramp_dataset(16, 6, 6, 3);
  const Normalization norm{{0.1f, 0.2f, 0.3f}, {0.3f, 0.3f, 0.3f}};
  BatchAssembler a(d, norm, {2, true}, 42), same(d, norm, {2, true}, 42), other_seed(d, norm, {2, true}, 43);
  Batch b1, b2, single, e1, s2;
  std::vector<uint32_t> idx(16);
  std::iota(idx.begin(), idx.end(), 0u);
  a.assemble(idx, 0, true, b1);
  same.assemble(idx, 0, true, b2);
  EXPECT_EQ(std::memcmp(b1.images.raw(), b2.images.raw(), b1.images.bytes()), 0);
  const int64_t per = 6 * 6 * 3;
  a.assemble({11}, 0, true, single);
  EXPECT_EQ(std::memcmp(single.images.data<float>(), b1.images.data<float>() + 11 * per, per * sizeof(float)), 0);
  a.assemble(idx, 1, true, e1);
  other_seed.assemble(idx, 0, true, s2);
  EXPECT_NE(std::memcmp(b1.images.raw(), e1.images.raw(), b1.images.bytes()), 0);
  EXPECT_NE(std::memcmp(b1.images.raw(), s2.images.raw(), b1.images.bytes()), 0);
}

// Each augmented sample is the original shifted by (dy, dx) in [-pad, pad]^2, black outside,
// and mirrored or not; over many samples several shifts and both mirrorings occur.
TEST(BatchAssembler, CropAndFlipAreWhatTheySay) {
  const int64_t h = 5, w = 7, c = 2, pad = 2, count = 64;
  const Dataset d = ramp_dataset(count, h, w, c);
  const Normalization norm{{0.0f, 0.0f}, {1.0f, 1.0f}};  // value = byte / 255
  for (bool flip : {false, true}) {
    BatchAssembler a(d, norm, {pad, flip}, 5);
    Batch b;
    std::vector<uint32_t> idx(count);
    std::iota(idx.begin(), idx.end(), 0u);
    a.assemble(idx, 3, true, b);
    std::set<std::pair<int64_t, int64_t>> shifts;
    std::set<int64_t> mirrored_dx;  // horizontal shifts seen on mirrored samples
    int mirrored = 0;
    for (int64_t i = 0; i < count; ++i) {
      const float* o = b.images.data<float>() + i * h * w * c;
      const uint8_t* src = d.images.data() + i * h * w * c;
      bool found = false;
      for (int m = 0; m <= (flip ? 1 : 0) && !found; ++m)
        for (int64_t dy = -pad; dy <= pad && !found; ++dy)
          for (int64_t dx = -pad; dx <= pad && !found; ++dx) {
            bool match = true;
            for (int64_t y = 0; y < h && match; ++y)
              for (int64_t x = 0; x < w && match; ++x) {
                const int64_t sy = y + dy, sx = (m ? w - 1 - x : x) + dx;
                const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
                for (int64_t ch = 0; ch < c; ++ch) {
                  const float want = inside ? src[(sy * w + sx) * c + ch] / 255.0f : 0.0f;
                  match = match && o[(y * w + x) * c + ch] == want;
                }
              }
            if (match) {
              found = true;
              shifts.insert({dy, dx});
              mirrored += m;
              if (m) mirrored_dx.insert(dx);
            }
          }
      EXPECT_TRUE(found) << "sample " << i << " is no shifted" << (flip ? "/mirrored" : "") << " copy";
    }
    EXPECT_GE(shifts.size(), 10u);  // 25 possible
    if (flip) {
      EXPECT_GT(mirrored, count / 4);
      EXPECT_LT(mirrored, 3 * count / 4);
      EXPECT_GE(mirrored_dx.size(), 3u) << "mirrored samples are cropped too";
    }
  }
}

// ---- Loader ----------------------------------------------------------------------------------

void expect_batch(const Batch& got, const Dataset& d, const Normalization& norm, const std::vector<uint32_t>& idx,
                  int64_t epoch) {
  BatchAssembler a(d, norm, {}, 0);
  Batch want;
  a.assemble(idx, epoch, false, want);
  ASSERT_EQ(got.images.shape(), want.images.shape());
  EXPECT_EQ(got.labels, want.labels);
  EXPECT_EQ(std::memcmp(got.images.raw(), want.images.raw(), want.images.bytes()), 0);
}

TEST(Loader, YieldsEveryStepOfAnEpochInOrder) {
  const Dataset d = ramp_dataset(103, 4, 4, 1);
  const Normalization norm{{0.5f}, {0.25f}};
  for (int depth : {1, 3}) {
    ShardedSampler sampler(d.count, 10, 7);
    ShardedSampler reference = sampler;
    Loader loader(d, norm, {}, sampler, 7, depth);
    EXPECT_EQ(loader.steps_per_epoch(), 10);
    for (int64_t epoch : {0, 1}) {
      loader.start_epoch(epoch);
      for (int64_t s = 0; s < 10; ++s) {
        const Batch* b = loader.next();
        ASSERT_NE(b, nullptr) << "epoch " << epoch << " step " << s;
        EXPECT_EQ(b->epoch, epoch);
        EXPECT_EQ(b->step, s);
        EXPECT_EQ(b->size(), 10);
        expect_batch(*b, d, norm, reference.indices(epoch, s), epoch);
      }
      EXPECT_EQ(loader.next(), nullptr);
      EXPECT_EQ(loader.next(), nullptr);  // stays at the end
    }
  }
}

TEST(Loader, StartsMidEpoch) {
  const Dataset d = ramp_dataset(60, 3, 3, 1);
  const Normalization norm{{0.5f}, {0.25f}};
  ShardedSampler sampler(d.count, 8, 2, 0, 1, /*drop_last=*/false);
  ShardedSampler reference = sampler;
  Loader loader(d, norm, {}, sampler, 2);
  ASSERT_EQ(loader.steps_per_epoch(), 8);
  loader.start_epoch(4, 5);
  for (int64_t s = 5; s < 8; ++s) {
    const Batch* b = loader.next();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->step, s);
    EXPECT_EQ(b->epoch, 4);
    EXPECT_EQ(b->size(), s == 7 ? 4 : 8);  // the kept short batch
    expect_batch(*b, d, norm, reference.indices(4, s), 4);
  }
  EXPECT_EQ(loader.next(), nullptr);
  // Restarting while batches are still queued abandons them cleanly.
  loader.start_epoch(0);
  ASSERT_NE(loader.next(), nullptr);
  loader.start_epoch(1, 2);
  const Batch* b = loader.next();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->epoch, 1);
  EXPECT_EQ(b->step, 2);
  // Starting at the end gives an empty epoch.
  loader.start_epoch(2, 8);
  EXPECT_EQ(loader.next(), nullptr);
}

TEST(Loader, AugmentsWithTheSameKeysAsTheAssembler) {
  const Dataset d = ramp_dataset(40, 6, 6, 1);
  const Normalization norm{{0.5f}, {0.25f}};
  ShardedSampler sampler(d.count, 8, 9);
  ShardedSampler reference = sampler;
  Loader loader(d, norm, {2, false}, sampler, 9);
  BatchAssembler a(d, norm, {2, false}, 9);
  loader.start_epoch(3);
  for (int64_t s = 0; s < 5; ++s) {
    const Batch* b = loader.next();
    ASSERT_NE(b, nullptr);
    Batch want;
    a.assemble(reference.indices(3, s), 3, true, want);
    EXPECT_EQ(std::memcmp(b->images.raw(), want.images.raw(), want.images.bytes()), 0) << "step " << s;
  }
}

// Given the run's epochs, the loader goes on into the next epoch while the consumer ends the
// current one: start_epoch of the epoch that follows, from its first step, keeps those batches
// (what a fresh start would give, augmented with that epoch's keys); next() still ends each
// epoch; any other start, and the last epoch's end, make nothing ahead.
TEST(Loader, GoesOnIntoTheNextEpoch) {
  const Dataset d = ramp_dataset(50, 3, 3, 1);
  const Normalization norm{{0.5f}, {0.25f}};
  const AugmentSpec aug{1, true};
  ShardedSampler sampler(d.count, 8, 4);
  ShardedSampler reference = sampler;
  const BatchAssembler a(d, norm, aug, 4);
  for (int depth : {1, 3}) {
    Loader loader(d, norm, aug, sampler, 4, depth, 1, false, nullptr, 3);
    const auto expect_epoch = [&](int64_t epoch, int64_t from) {
      for (int64_t s = from; s < loader.steps_per_epoch(); ++s) {
        const Batch* b = loader.next();
        ASSERT_NE(b, nullptr) << "depth " << depth << " epoch " << epoch << " step " << s;
        ASSERT_EQ(b->epoch, epoch);
        ASSERT_EQ(b->step, s);
        Batch want;
        a.assemble(reference.indices(epoch, s), epoch, true, want);
        ASSERT_EQ(std::memcmp(b->images.raw(), want.images.raw(), want.images.bytes()), 0)
            << "depth " << depth << " epoch " << epoch << " step " << s;
      }
      EXPECT_EQ(loader.next(), nullptr);
      EXPECT_EQ(loader.next(), nullptr);  // stays at the end until start_epoch
    };
    loader.start_epoch(0);
    expect_epoch(0, 0);
    loader.start_epoch(1);
    expect_epoch(1, 0);
    loader.start_epoch(2);
    expect_epoch(2, 0);
    loader.start_epoch(1, 2);  // mid-epoch: made afresh, and then on into epoch 2
    expect_epoch(1, 2);
    loader.start_epoch(0);  // not the epoch that follows: made afresh
    expect_epoch(0, 0);
    loader.start_epoch(1);
    const Batch* b = loader.next();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->epoch, 1);
    loader.start_epoch(2);  // an epoch left early: what was made of it is dropped
    expect_epoch(2, 0);
  }
}

}  // namespace
}  // namespace hpc::data

// --jpeg-decode: nvJPEG is loaded at run time. Where the library is absent (this machine's CUDA
// toolkit has none), or a file of that name is not nvJPEG, the loader says which and why, and
// the caller decodes on the CPU (auto) or refuses (gpu): never a crash at the first call.
TEST(Nvjpeg, AnAbsentLibraryIsNamedWithTheLoadersReason) {
  std::string why;
  EXPECT_EQ(hpc::data::NvjpegLibrary::load("libnvjpeg-not-here.so.13", &why), nullptr);
  EXPECT_NE(why.find("cannot load libnvjpeg-not-here.so.13"), std::string::npos) << why;
  EXPECT_NE(why.find("No such file"), std::string::npos) << why;  // dlerror's words
}

TEST(Nvjpeg, ALibraryWithoutItsEntryPointsIsRefused) {
  std::string why;
  EXPECT_EQ(hpc::data::NvjpegLibrary::load("libz.so.1", &why), nullptr);  // loads, but is not nvJPEG
  EXPECT_NE(why.find("libz.so.1 has no nvjpegCreateEx"), std::string::npos) << why;
}

TEST(Nvjpeg, StatusNames) {
  EXPECT_EQ(hpc::data::nvjpeg::status_name(3), "NVJPEG_STATUS_BAD_JPEG (3)");
  EXPECT_EQ(hpc::data::nvjpeg::status_name(10), "NVJPEG_STATUS_INCOMPLETE_BITSTREAM (10)");
  EXPECT_EQ(hpc::data::nvjpeg::status_name(42), "NVJPEG_STATUS_UNKNOWN (42)");
}

// What --jpeg-decode loads: CUDA 13's library by its name, else from the toolkit's folder. This
// machine has neither (its CUDA toolkit lacks nvJPEG): the reason names the library.
TEST(Nvjpeg, TheInstalledLibraryIsNamedWhenAbsent) {
  if (std::filesystem::exists("/usr/local/cuda/lib64/libnvjpeg.so.13")) GTEST_SKIP() << "nvJPEG is installed here";
  std::string why;
  EXPECT_EQ(hpc::data::NvjpegLibrary::load_installed(&why), nullptr);
  EXPECT_NE(why.find("cannot load libnvjpeg.so.13"), std::string::npos) << why;
}
