// Packed image shards: the shard format (writer, reader, every way a shard can be broken), JPEG
// decoding through libjpeg-turbo, resizing, and packing an image folder the test makes: labels
// and pixels of every packed image verified against its source file.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <turbojpeg.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "data/dataset.hpp"
#include "data/jpeg.hpp"
#include "data/loader.hpp"
#include "data/pack.hpp"
#include "data/shard_images.hpp"
#include "data/shards.hpp"
#include "unit/data_test_util.hpp"

namespace hpc::data {
namespace {
namespace fs = std::filesystem;

// A smooth test picture (JPEG keeps smooth pictures well): colour depends on the class and
// the image, brightness on the position.
Image picture(int64_t h, int64_t w, int cls, int index) {
  Image img;
  img.height = h;
  img.width = w;
  img.pixels.resize(static_cast<size_t>(h * w * 3));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        img.pixels[static_cast<size_t>((y * w + x) * 3 + c)] =
            static_cast<uint8_t>((40 * cls + 17 * index + 60 * c + (x + y) * 100 / (h + w)) % 256);
  return img;
}

double mean_abs_diff(const Image& a, const Image& b) {
  EXPECT_EQ(a.height, b.height);
  EXPECT_EQ(a.width, b.width);
  double sum = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) sum += std::abs(int{a.pixels[i]} - int{b.pixels[i]});
  return sum / static_cast<double>(a.pixels.size());
}

// The shards a packed split's manifest lists, opened and checked as hpctrain opens them.
std::vector<std::string> packed_shards(const std::string& dir, const std::string& split) {
  std::vector<std::string> paths;
  for (const ShardReader& r : open_split(dir, split).shards) paths.push_back(r.path());
  return paths;
}

// ---- shard format -------------------------------------------------------------------------------

TEST(Shards, WriterAndReaderRoundTrip) {
  TempDir dir;
  const std::vector<Bytes> records{{1, 2, 3}, Bytes(1000, 7), {42}};
  {
    ShardWriter w(dir.file(shard_name("train", 0, 1)));
    for (size_t i = 0; i < records.size(); ++i) w.add(records[i], static_cast<uint32_t>(i * 2));
    EXPECT_TRUE(fs::exists(dir.file("train-00000-of-00001.hpcs.part")));  // not under its name until finished
    EXPECT_FALSE(fs::exists(dir.file("train-00000-of-00001.hpcs")));
    w.finish();
  }
  EXPECT_FALSE(fs::exists(dir.file("train-00000-of-00001.hpcs.part")));
  const std::vector<std::string> shards = list_shards(dir.path().string(), "train");
  ASSERT_EQ(shards.size(), 1u);
  const ShardReader r(shards[0], 5);
  ASSERT_EQ(r.count(), 3);
  Bytes got;
  for (int64_t i = 0; i < 3; ++i) {
    r.read(i, got);
    EXPECT_EQ(got, records[static_cast<size_t>(i)]);
    EXPECT_EQ(r.record(i).label, i * 2);
  }
  EXPECT_TRUE(list_shards(dir.path().string(), "val").empty());
}

TEST(Shards, UnfinishedWriterLeavesNothing) {
  TempDir dir;
  {
    ShardWriter w(dir.file("train-00000-of-00001.hpcs"));
    w.add(Bytes{1, 2}, 0);
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(Shards, AWriterWhoseRenameFailsLeavesNoPartFile) {
  TempDir dir;
  const std::string path = dir.file("train-00000-of-00001.hpcs");
  fs::create_directories(fs::path(path) / "in-the-way");  // a non-empty directory: rename(2) refuses
  {
    ShardWriter w(path);
    w.add(Bytes{1, 2}, 0);
    EXPECT_NE(usage_error_of([&] { w.finish(); }).find("cannot rename"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(path + ".part"));
}

// A shard's .part name is easy to guess (hpcdata pack into /tmp, or a project directory all may
// write to): a link planted there is not written through (its target, a file of the user's, was
// truncated and filled with the shard), and the shard is written whole all the same (the link of a
// killed packing's leftover removed, as here; one of another user's refuses, naming it).
TEST(Shards, APartFileIsNeverWrittenThroughALinkPlantedThere) {
  TempDir dir;
  const std::string path = dir.file("train-00000-of-00001.hpcs"), precious = dir.file("precious");
  write_raw(precious, Bytes{7, 7, 7});
  fs::create_symlink(precious, path + ".part");
  {
    ShardWriter w(path);
    w.add(Bytes{1, 2}, 0);
    w.finish();
  }
  EXPECT_EQ(read_raw(precious), (Bytes{7, 7, 7}));
  EXPECT_FALSE(fs::is_symlink(path));
  EXPECT_EQ(ShardReader(path).count(), 1);
}

TEST(Shards, BrokenShardsAreUsageErrors) {
  TempDir dir;
  const std::string good = dir.file("good.hpcs");
  {
    ShardWriter w(good);
    w.add(Bytes(100, 1), 0);
    w.add(Bytes(50, 2), 3);
    w.finish();
  }
  const Bytes bytes = read_raw(good);
  auto broken = [&](const std::string& name, const Bytes& b) {
    write_raw(dir.file(name), b);
    return usage_error_of([&] { ShardReader r(dir.file(name)); });
  };
  EXPECT_NE(broken("cut.hpcs", Bytes(bytes.begin(), bytes.end() - 5)).find("no index at its end"), std::string::npos);
  EXPECT_NE(broken("tiny.hpcs", Bytes(bytes.begin(), bytes.begin() + 20)).find("too short"), std::string::npos);
  Bytes header = bytes;
  header[0] = 'X';
  EXPECT_NE(broken("header.hpcs", header).find("not an hpcdata shard"), std::string::npos);
  Bytes index = bytes;
  index[bytes.size() - kShardFooterBytes - 7] ^= 0x40;  // a label byte of the last entry
  EXPECT_NE(broken("index.hpcs", index).find("corrupt index (CRC mismatch)"), std::string::npos);
  Bytes count = bytes;
  count[bytes.size() - kShardFooterBytes + 8] = 9;  // the footer's record count
  EXPECT_NE(broken("count.hpcs", count).find("bad index"), std::string::npos);
  // Records appended after the index: the footer no longer ends the file.
  Bytes grown = bytes;
  grown.insert(grown.begin() + 158, 16, 0);
  EXPECT_NE(broken("grown.hpcs", grown).find("bad index"), std::string::npos);
  // Offsets whose sums wrap past 2^64: an index "fitting" a 32-byte file asked for 86 GB (a
  // std::bad_alloc, not a usage error), and a record's offset near 2^64 passed as inside the file.
  Bytes wrapped(bytes.begin(), bytes.begin() + kShardHeaderBytes);
  const uint64_t entries = 0xFFFFFFFF, wrapped_offset = 8 - entries * kShardEntryBytes;  // mod 2^64
  for (int i = 0; i < 8; ++i) wrapped.push_back(static_cast<uint8_t>(wrapped_offset >> (8 * i)));
  for (int i = 0; i < 4; ++i) wrapped.push_back(static_cast<uint8_t>(entries >> (8 * i)));
  wrapped.insert(wrapped.end(), 4, 0);
  wrapped.insert(wrapped.end(), kShardIndexMagic, kShardIndexMagic + 8);
  EXPECT_NE(broken("wrapped.hpcs", wrapped).find("bad index"), std::string::npos);
  Bytes far = bytes;
  const size_t entry0 = bytes.size() - kShardFooterBytes - 2 * kShardEntryBytes;
  for (int i = 0; i < 8; ++i) far[entry0 + i] = 0xFF;  // record 0 at offset 2^64 - 1
  uint32_t index_crc = static_cast<uint32_t>(crc32(0, far.data() + entry0, 2 * kShardEntryBytes));
  for (int i = 0; i < 4; ++i) far[bytes.size() - kShardFooterBytes + 12 + i] = static_cast<uint8_t>(index_crc >> (8 * i));
  EXPECT_NE(broken("far.hpcs", far).find("lies outside the data area"), std::string::npos);
  EXPECT_NE(usage_error_of([&] { ShardReader r(good, 3); }).find("label 3 but the dataset has 3 classes"),
            std::string::npos);
  EXPECT_NE(usage_error_of([&] { ShardReader r(dir.file("absent.hpcs")); }).find("cannot read shard"),
            std::string::npos);
}

// A shard refused while it is opened keeps no file open: the constructor that throws runs no
// destructor, so each damaged shard held its descriptor for the process's life (a fuzz run ran
// out of them after 20,000).
TEST(Shards, ARefusedShardKeepsNoFileOpen) {
  TempDir dir;
  const std::string good = dir.file("good.hpcs");
  {
    ShardWriter w(good);
    w.add(Bytes(100, 1), 3);
    w.finish();
  }
  Bytes cut = read_raw(good);
  cut.resize(cut.size() - 5);
  write_raw(dir.file("cut.hpcs"), cut);
  const auto open_files = [] {
    return std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator{});
  };
  const auto before = open_files();
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(usage_error_of([&] { ShardReader r(dir.file("cut.hpcs")); }).empty());
    EXPECT_FALSE(usage_error_of([&] { ShardReader r(good, 2); }).empty());  // label 3 of 2 classes
  }
  EXPECT_EQ(open_files(), before);
}

// Each record is checked against the CRC-32 its index entry holds (zlib's, so any tool can check
// it too) when it is read: a flipped bit inside a JPEG's entropy-coded data mostly decodes into
// another image without a word. The shard still opens; the damaged record alone is refused.
TEST(Shards, EachRecordIsCheckedAgainstItsCrcWhenRead) {
  TempDir dir;
  const std::string path = dir.file("crc.hpcs");
  const std::vector<Bytes> records{Bytes(100, 1), Bytes(300, 2), {9, 8, 7}};
  {
    ShardWriter w(path);
    for (const Bytes& r : records) w.add(r, 0);
    w.finish();
  }
  Bytes bytes = read_raw(path);
  const size_t index = bytes.size() - kShardFooterBytes - records.size() * kShardEntryBytes;
  for (size_t i = 0; i < records.size(); ++i) {
    const uint8_t* e = bytes.data() + index + i * kShardEntryBytes + 16;
    const uint32_t stored = e[0] | e[1] << 8 | e[2] << 16 | static_cast<uint32_t>(e[3]) << 24;
    EXPECT_EQ(stored, ::crc32(0L, records[i].data(), static_cast<uInt>(records[i].size()))) << "record " << i;
  }
  bytes[8 + 100 + 150] ^= 0x04;  // one bit in the middle of record 1
  write_raw(path, bytes);
  const ShardReader r(path);
  EXPECT_TRUE(r.checks_records());
  Bytes got;
  r.read(0, got);
  EXPECT_EQ(got, records[0]);
  r.read(2, got);
  EXPECT_EQ(got, records[2]);
  const std::string error = usage_error_of([&] { r.read(1, got); });
  EXPECT_NE(error.find("crc.hpcs record 1 is damaged (its CRC-32 is not the index's)"), std::string::npos) << error;
}

// Shards packed before 2026-11-28 (index magic HPCSIDX1, 16-byte entries without the record's
// CRC) are still read, their records as they are.
TEST(Shards, VersionOneShardsAreReadWithoutRecordChecks) {
  TempDir dir;
  const std::vector<Bytes> records{Bytes(10, 3), Bytes(20, 4)};
  Bytes file(kShardMagic, kShardMagic + 8), index;
  const auto put = [](Bytes& b, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  for (size_t i = 0; i < records.size(); ++i) {
    put(index, file.size(), 8);
    put(index, records[i].size(), 4);
    put(index, i + 1, 4);  // label
    file.insert(file.end(), records[i].begin(), records[i].end());
  }
  const uint64_t index_offset = file.size();
  file.insert(file.end(), index.begin(), index.end());
  put(file, index_offset, 8);
  put(file, records.size(), 4);
  put(file, ::crc32(0L, index.data(), static_cast<uInt>(index.size())), 4);
  file.insert(file.end(), kShardIndexMagicV1, kShardIndexMagicV1 + 8);
  file[8 + 5] ^= 1;  // unchecked: read as it is
  write_raw(dir.file("v1.hpcs"), file);
  const ShardReader r(dir.file("v1.hpcs"), 3);
  EXPECT_FALSE(r.checks_records());
  ASSERT_EQ(r.count(), 2);
  Bytes got;
  r.read(0, got);
  Bytes want = records[0];
  want[5] ^= 1;
  EXPECT_EQ(got, want);
  r.read(1, got);
  EXPECT_EQ(got, records[1]);
  EXPECT_EQ(r.record(1).label, 2u);
}

TEST(Shards, ListingFindsMissingAndMixedShards) {
  TempDir dir;
  for (int i : {0, 2}) {
    ShardWriter w(dir.file(shard_name("train", i, 3)));
    w.finish();
  }
  EXPECT_NE(usage_error_of([&] { list_shards(dir.path().string(), "train"); }).find("train-00001-of-00003.hpcs is missing"),
            std::string::npos);
  {
    ShardWriter w(dir.file(shard_name("train", 1, 4)));
    w.finish();
  }
  EXPECT_NE(usage_error_of([&] { list_shards(dir.path().string(), "train"); }).find("disagree on their number"),
            std::string::npos);
  {
    ShardWriter w(dir.file(shard_name("val", 0, 2)));
    w.finish();
  }
  EXPECT_NE(usage_error_of([&] { list_shards(dir.path().string(), "val"); }).find("val-00001-of-00002.hpcs is missing"),
            std::string::npos);
}

// Shard file names taken apart as shard_name writes them, and every near miss refused: the names
// decide which files a packing replaces or removes, and which a listing counts.
TEST(Shards, ShardFileNamesAreTakenApartExactly) {
  const auto legacy = parse_shard_file_name(shard_name("train", 2, 3));
  ASSERT_TRUE(legacy);
  EXPECT_EQ(legacy->split, "train");
  EXPECT_EQ(legacy->generation, "");
  EXPECT_EQ(legacy->index, "00002");
  EXPECT_EQ(legacy->total, "00003");
  EXPECT_FALSE(legacy->part);
  const auto part = parse_shard_file_name(shard_name("val", 123456, 200000, 17) + ".part");
  ASSERT_TRUE(part);
  EXPECT_EQ(part->split, "val");
  EXPECT_EQ(part->generation, "17");
  EXPECT_EQ(part->index, "123456");
  EXPECT_EQ(part->total, "200000");
  EXPECT_TRUE(part->part);
  EXPECT_EQ(parse_shard_file_name("trag-g1-00000-of-00001.hpcs")->split, "trag");
  for (const char* name : {"train-0000-of-00001.hpcs", "train-00000-of-0001.hpcs", "train-00000-of-00001.hpc",
                           "train-00000-of-00001.hpcs.tmp", "train-00000-of-00001.hpcs.part.x", "-00000-of-00001.hpcs",
                           "tr.ain-00000-of-00001.hpcs", "tr ain-00000-of-00001.hpcs", "train-g-00000-of-00001.hpcs",
                           "train-g1-x-00000-of-00001.hpcs", "train-g100000-of-00001.hpcs", "train.json",
                           "train-00000-of-00001", "train-00000-00001.hpcs", "train-a0000-of-00001.hpcs", ""})
    EXPECT_FALSE(parse_shard_file_name(name)) << name;
}

// ---- JPEG ---------------------------------------------------------------------------------------

TEST(Jpeg, EncodeDecodeAndDamage) {
  const Image src = picture(48, 64, 1, 2);
  const Bytes jpeg = encode_jpeg(src, 95);
  int64_t h = 0, w = 0;
  jpeg_size(jpeg, "test", h, w);
  EXPECT_EQ(h, 48);
  EXPECT_EQ(w, 64);
  const Image back = decode_jpeg(jpeg, "test");
  EXPECT_LT(mean_abs_diff(src, back), 3.0);
  // Cut short: libjpeg-turbo would fill the rest with grey and warn; that is an error here.
  const std::string cut = usage_error_of([&] { decode_jpeg(Bytes(jpeg.begin(), jpeg.begin() + jpeg.size() / 2), "cut.jpg"); });
  EXPECT_NE(cut.find("cut.jpg is a damaged JPEG image"), std::string::npos) << cut;
  // The failure does not carry over to the next image the thread decodes.
  EXPECT_EQ(decode_jpeg(jpeg, "after the damaged one").pixels, back.pixels);
  const Bytes other = encode_jpeg(picture(40, 24, 2, 1), 90);
  usage_error_of([&] { decode_jpeg(Bytes(jpeg.begin(), jpeg.begin() + jpeg.size() / 3), "cut.jpg"); });
  EXPECT_EQ(decode_jpeg(other, "a smaller one after a damaged one").height, 40);
  const std::string junk = usage_error_of([&] { decode_jpeg(Bytes(300, 0x55), "junk.jpg"); });
  EXPECT_NE(junk.find("junk.jpg is not a readable JPEG image"), std::string::npos) << junk;
  EXPECT_NE(usage_error_of([&] { decode_jpeg(Bytes{}, "empty.jpg"); }).find("empty.jpg is empty"), std::string::npos);
}

// A CMYK JPEG as Photoshop writes them (YCCK, Adobe marker, components stored inverted) of
// `image`'s colours: stored C = R, M = G, Y = B, K = 255 (no black ink), which reads back as
// `image` under R = C x K / 255.
Bytes cmyk_jpeg(const Image& image) {
  std::vector<uint8_t> cmyk;
  for (size_t i = 0; i < image.pixels.size(); i += 3)
    cmyk.insert(cmyk.end(), {image.pixels[i], image.pixels[i + 1], image.pixels[i + 2], 255});
  tjhandle h = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(h, cmyk.data(), static_cast<int>(image.width), 0, static_cast<int>(image.height), TJPF_CMYK,
                        &out, &size, TJSAMP_444, 98, TJFLAG_ACCURATEDCT),
            0)
      << tjGetErrorStr2(h);
  Bytes jpeg(out, out + size);
  tjFree(out);
  tjDestroy(h);
  return jpeg;
}

// CMYK files (ImageNet has a few) were refused as damaged ("Unsupported color conversion
// request"): converted as OpenCV and Pillow convert them. K scales all three.
TEST(Jpeg, CmykFilesAreReadAsRgb) {
  const Image src = picture(32, 48, 2, 3);
  bool cmyk = false;
  const Image back = decode_jpeg(cmyk_jpeg(src), "cmyk.jpg", &cmyk);
  EXPECT_TRUE(cmyk);
  EXPECT_LT(mean_abs_diff(src, back), 3.0);
  decode_jpeg(encode_jpeg(src, 95), "rgb.jpg", &cmyk);
  EXPECT_FALSE(cmyk);
  Image flat;
  flat.height = flat.width = 16;
  std::vector<uint8_t> stored;
  for (int i = 0; i < 256; ++i) stored.insert(stored.end(), {200, 100, 0, 128});
  tjhandle h = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(h, stored.data(), 16, 0, 16, TJPF_CMYK, &out, &size, TJSAMP_444, 100, TJFLAG_ACCURATEDCT), 0);
  const Bytes dark(out, out + size);
  tjFree(out);
  tjDestroy(h);
  const Image grey = decode_jpeg(dark, "dark.jpg");
  for (size_t i = 0; i < grey.pixels.size(); i += 3) {  // 200 x 128 / 255, 100 x 128 / 255, 0
    EXPECT_NEAR(grey.pixels[i], 100, 2);
    EXPECT_NEAR(grey.pixels[i + 1], 50, 2);
    EXPECT_NEAR(grey.pixels[i + 2], 0, 2);
  }
}

// A file whose header claims 16000x16000 but holds a thousand bytes: its 768 MB of pixels were zeroed
// (seconds, and that much memory in each loader thread) before the decoder found the data cut
// short. Decoded in a child, whose peak memory the parent reads.
TEST(Jpeg, AHugeClaimInATinyFileCostsNoMemory) {
  Bytes jpeg = encode_jpeg(picture(64, 64, 1, 1), 90);
  bool patched = false;
  for (size_t i = 0; i + 8 < jpeg.size() && !patched; ++i)
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {  // SOF0: length, precision, height, width
      jpeg[i + 5] = jpeg[i + 7] = 16000 >> 8;
      jpeg[i + 6] = jpeg[i + 8] = 16000 & 0xFF;
      patched = true;
    }
  ASSERT_TRUE(patched);
  int64_t h = 0, w = 0;
  jpeg_size(jpeg, "huge.jpg", h, w);
  ASSERT_EQ(h, 16000);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string why = usage_error_of([&] { decode_jpeg(jpeg, "huge.jpg"); });
    _exit(why.find("huge.jpg is a damaged JPEG image") != std::string::npos ? 0 : 3);
  }
  int status = 0;
  rusage usage{};
  ASSERT_EQ(wait4(child, &status, 0, &usage), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the decode did not fail as damaged: " << status;
  EXPECT_LT(usage.ru_maxrss, 200 * 1024) << "KiB at the peak, for a file of " << jpeg.size() << " bytes";
}

// A valid progressive grey 8x8 JPEG (every pixel 128) of 1 + 63 x (1 + refinements) scans: the
// DC, then each AC coefficient alone, first at point transform `al` and then refined bit by bit
// down to 0. Every coefficient is zero, so each scan's data is one Huffman code "0" (DC
// difference 0, or end of band) or one correction bit, padded with ones: 0x7F.
Bytes progressive_jpeg(int al) {
  Bytes j = {0xFF, 0xD8, 0xFF, 0xDB, 0, 67, 0};
  j.insert(j.end(), 64, 1);                                           // quantisation table 0: all 1
  j.insert(j.end(), {0xFF, 0xC2, 0, 11, 8, 0, 8, 0, 8, 1, 1, 0x11, 0});  // SOF2: 8x8, 1 component
  for (const uint8_t table : {0x00, 0x10}) {                         // DC 0 and AC 0: symbol 0, code "0"
    j.insert(j.end(), {0xFF, 0xC4, 0, 20, table, 1});
    j.insert(j.end(), 15, 0);
    j.push_back(0);
  }
  const auto scan = [&](int ss, int se, int ah, int al_) {
    j.insert(j.end(), {0xFF, 0xDA, 0, 8, 1, 1, 0, static_cast<uint8_t>(ss), static_cast<uint8_t>(se),
                       static_cast<uint8_t>(ah << 4 | al_), 0x7F});
  };
  scan(0, 0, 0, 0);
  for (int k = 1; k < 64; ++k) {
    scan(k, k, 0, al);
    for (int a = al; a > 0; --a) scan(k, k, a, a - 1);
  }
  j.insert(j.end(), {0xFF, 0xD9});
  return j;
}

// Each scan of a progressive file is a pass over the whole image: a small file of thousands of
// scans takes minutes (libjpeg-turbo's "Two Issues with the JPEG Standard"). More than 500 are
// refused, as TurboJPEG's LIMITSCANS does; 64 decode.
TEST(Jpeg, AProgressiveFileOfTooManyScansIsRefused) {
  const Image few = decode_jpeg(progressive_jpeg(0), "64 scans.jpg");
  ASSERT_EQ(few.height, 8);
  EXPECT_TRUE(std::all_of(few.pixels.begin(), few.pixels.end(), [](uint8_t v) { return v == 128; }));
  EXPECT_EQ(decode_jpeg(progressive_jpeg(6), "442 scans.jpg").pixels, few.pixels);
  const std::string many = usage_error_of([&] { decode_jpeg(progressive_jpeg(10), "694 scans.jpg"); });
  EXPECT_NE(many.find("694 scans.jpg is a damaged JPEG image"), std::string::npos) << many;
  EXPECT_NE(many.find("500 scans"), std::string::npos) << many;
}

TEST(Jpeg, ResizeShorterSide) {
  Image flat;
  flat.height = 90;
  flat.width = 150;
  flat.pixels.assign(90 * 150 * 3, 77);
  const Image small = resize_shorter_side(flat, 30);
  EXPECT_EQ(small.height, 30);
  EXPECT_EQ(small.width, 50);
  EXPECT_TRUE(std::all_of(small.pixels.begin(), small.pixels.end(), [](uint8_t v) { return v == 77; }));
  const Image tall = resize_shorter_side(picture(200, 100, 0, 0), 40);
  EXPECT_EQ(tall.width, 40);
  EXPECT_EQ(tall.height, 80);
  const Image same = resize_shorter_side(flat, 120);  // never scaled up
  EXPECT_EQ(same.height, 90);
  EXPECT_EQ(same.width, 150);
}

// ---- packing ------------------------------------------------------------------------------------

struct Folder {
  std::map<std::string, std::pair<uint32_t, Bytes>> files;  // path -> (label, bytes)
};

// SRC/<class>/img<i>.jpg for classes "cat", "dog", "emu" (labels 0, 1, 2 by name order), images
// of assorted sizes, plus a file that is not a JPEG.
Folder make_folder(const fs::path& src, int per_class = 5) {
  Folder f;
  const std::vector<std::string> classes{"dog", "cat", "emu"};  // created out of order on purpose
  for (const std::string& c : classes) {
    fs::create_directories(src / c);
    const uint32_t label = c == "cat" ? 0 : c == "dog" ? 1 : 2;
    for (int i = 0; i < per_class; ++i) {
      const Bytes jpeg = encode_jpeg(picture(24 + 8 * i, 40 - 4 * i, static_cast<int>(label), i), 90);
      const std::string path = (src / c / ("img" + std::to_string(i) + (i % 2 ? ".JPEG" : ".jpg"))).string();
      write_raw(path, jpeg);
      f.files[path] = {label, jpeg};
    }
  }
  write_raw((src / "cat" / "notes.txt").string(), Bytes{'h', 'i'});
  return f;
}

TEST(Pack, EveryImageArrivesOnceWithItsLabelAndPixels) {
  TempDir dir;
  const Folder folder = make_folder(dir.path() / "src");
  PackOptions o;
  o.src = (dir.path() / "src").string();
  o.out = (dir.path() / "out").string();
  o.images_per_shard = 4;
  o.threads = 3;
  const PackResult r = pack_image_folder(o);
  EXPECT_EQ(r.classes, (std::vector<std::string>{"cat", "dog", "emu"}));
  EXPECT_EQ(r.images, 15);
  EXPECT_EQ(r.shards, 4);
  EXPECT_EQ(r.ignored_files, 1);
  EXPECT_EQ(read_class_names(o.out), r.classes);
  EXPECT_TRUE(fs::exists(fs::path(o.out) / "train.json"));
  std::map<std::string, std::pair<uint32_t, std::string>> by_bytes;  // file contents -> (label, path)
  for (const auto& [path, lb] : folder.files) by_bytes[std::string(lb.second.begin(), lb.second.end())] = {lb.first, path};
  std::set<std::string> seen;
  std::set<uint32_t> labels_in_first_shard;
  for (const std::string& shard : packed_shards(o.out, "train")) {
    const ShardReader reader(shard, 3);
    Bytes rec;
    for (int64_t i = 0; i < reader.count(); ++i) {
      reader.read(i, rec);
      auto it = by_bytes.find(std::string(rec.begin(), rec.end()));
      ASSERT_NE(it, by_bytes.end()) << shard << " record " << i << " is no source image";
      EXPECT_EQ(reader.record(i).label, it->second.first) << it->second.second;
      EXPECT_TRUE(seen.insert(it->second.second).second) << it->second.second << " packed twice";
      // Pixels: the record decodes to exactly what its source file decodes to.
      EXPECT_EQ(decode_jpeg(rec, "record").pixels, decode_jpeg(read_raw(it->second.second), "source").pixels);
      if (shard.find("-00000-") != std::string::npos) labels_in_first_shard.insert(reader.record(i).label);
    }
  }
  EXPECT_EQ(seen.size(), folder.files.size());
  EXPECT_GT(labels_in_first_shard.size(), 1u) << "shards should mix classes";
  // Packing again gives the same shards (a fixed seed), and replaces the old ones.
  const Bytes first = read_raw(packed_shards(o.out, "train")[0]);
  o.images_per_shard = 8;
  EXPECT_EQ(pack_image_folder(o).shards, 2);
  EXPECT_EQ(packed_shards(o.out, "train").size(), 2u);
  size_t files = 0;  // the replaced shards are gone: the manifest, classes.txt and the two new shards
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(o.out)) ++files;
  EXPECT_EQ(files, 4u);
  o.images_per_shard = 4;
  pack_image_folder(o);
  EXPECT_EQ(read_raw(packed_shards(o.out, "train")[0]), first);
}

TEST(Pack, ResizeScalesTheShorterSide) {
  TempDir dir;
  make_folder(dir.path() / "src", 3);
  PackOptions o;
  o.src = (dir.path() / "src").string();
  o.out = (dir.path() / "out").string();
  o.resize = 16;
  pack_image_folder(o);
  const ShardReader reader(packed_shards(o.out, "train")[0]);
  Bytes rec;
  for (int64_t i = 0; i < reader.count(); ++i) {
    reader.read(i, rec);
    int64_t h = 0, w = 0;
    jpeg_size(rec, "record", h, w);
    EXPECT_EQ(std::min(h, w), 16);
  }
}

TEST(Pack, CorruptImagesFailOrAreSkippedAndCounted) {
  TempDir dir;
  const Folder folder = make_folder(dir.path() / "src", 3);
  const std::string bad = (dir.path() / "src" / "emu" / "img1.JPEG").string();
  const Bytes& good = folder.files.at(bad).second;
  write_raw(bad, Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 3)));
  PackOptions o;
  o.src = (dir.path() / "src").string();
  o.out = (dir.path() / "out").string();
  o.images_per_shard = 2;
  o.threads = 2;
  const std::string msg = usage_error_of([&] { pack_image_folder(o); });
  EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(o.out)) << "a failed packing leaves nothing, not even the directory it made";
  o.skip_corrupt = true;
  const PackResult r = pack_image_folder(o);
  EXPECT_EQ(r.images, 8);
  EXPECT_EQ(r.skipped, std::vector<std::string>{bad});
  int64_t total = 0;
  for (const std::string& s : packed_shards(o.out, "train")) total += ShardReader(s).count();
  EXPECT_EQ(total, 8);
}

// A CMYK file is packed as an RGB JPEG (nvJPEG decodes those on the GPU), counted in the
// manifest; the other files are packed as they were.
TEST(Pack, CmykImagesArePackedAsRgb) {
  TempDir dir;
  Folder folder = make_folder(dir.path() / "src", 2);
  const std::string path = (dir.path() / "src" / "dog" / "img1.JPEG").string();
  const Image colours = picture(32, 24, 1, 1);
  write_raw(path, cmyk_jpeg(colours));
  PackOptions o;
  o.src = (dir.path() / "src").string();
  o.out = (dir.path() / "out").string();
  EXPECT_EQ(pack_image_folder(o).cmyk_converted, 1);
  EXPECT_EQ(nlohmann::json::parse(read_raw(o.out + "/train.json")).at("cmyk_converted"), 1);
  int64_t converted = 0, as_they_were = 0;
  Bytes rec;
  for (const std::string& s : packed_shards(o.out, "train")) {
    const ShardReader reader(s);
    for (int64_t i = 0; i < reader.count(); ++i) {
      reader.read(i, rec);
      bool cmyk = true;
      const Image img = decode_jpeg(rec, "record", &cmyk);
      EXPECT_FALSE(cmyk);
      if (img.height == 32 && img.width == 24 && mean_abs_diff(img, colours) < 4) ++converted;
      for (const auto& [file, entry] : folder.files) as_they_were += entry.second == rec;
    }
  }
  EXPECT_EQ(converted, 1);
  EXPECT_EQ(as_they_were, 5);
}

TEST(Pack, BadFoldersAreUsageErrors) {
  TempDir dir;
  make_folder(dir.path() / "src", 2);
  PackOptions o;
  o.src = (dir.path() / "src").string();
  o.out = (dir.path() / "out").string();
  fs::create_directories(dir.path() / "src" / "fox");
  EXPECT_NE(usage_error_of([&] { pack_image_folder(o); }).find("fox has no JPEG images"), std::string::npos);
  fs::remove(dir.path() / "src" / "fox");
  pack_image_folder(o);
  // The val split from folders with other classes than train's.
  make_folder(dir.path() / "val", 1);
  fs::rename(dir.path() / "val" / "emu", dir.path() / "val" / "eel");
  o.src = (dir.path() / "val").string();
  o.split = "val";
  EXPECT_NE(usage_error_of([&] { pack_image_folder(o); }).find("differ from the 3 class folders"), std::string::npos);
  o.src = (dir.path() / "nowhere").string();
  EXPECT_NE(usage_error_of([&] { pack_image_folder(o); }).find("does not exist"), std::string::npos);
  fs::create_directories(dir.path() / "flat");
  write_raw((dir.path() / "flat" / "a.jpg").string(), Bytes{1});
  o.src = (dir.path() / "flat").string();
  EXPECT_NE(usage_error_of([&] { pack_image_folder(o); }).find("has no class folders"), std::string::npos);
  // A JPEG's name on a dangling link or a FIFO: named in the error (both were left out without a
  // word, in no count; the FIFO would have blocked the read).
  o.src = (dir.path() / "src").string();
  o.split = "train";
  o.out = (dir.path() / "out-odd").string();
  const fs::path dangling = dir.path() / "src" / "emu" / "gone.jpg", fifo = dir.path() / "src" / "emu" / "pipe.jpg";
  fs::create_symlink(dir.path() / "nowhere.jpg", dangling);
  EXPECT_NE(usage_error_of([&] { pack_image_folder(o); }).find("cannot read image " + dangling.string()),
            std::string::npos);
  fs::remove(dangling);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(usage_error_of([&] { pack_image_folder(o); }).find(fifo.string() + " is not a regular file"),
            std::string::npos);
}

// ---- training on shards -------------------------------------------------------------------------

// Images of one flat colour per class (any crop of them, resized, is that colour): what the
// loader gives for a sample shows whether it came from the right image with the right label.
const uint8_t kColour[3][3] = {{200, 30, 30}, {30, 200, 30}, {30, 30, 200}};

std::string packed_flat_dataset(const TempDir& dir) {
  for (const char* split : {"train", "val"}) {
    const fs::path src = dir.path() / (std::string("src-") + split);
    for (int c = 0; c < 3; ++c) {
      fs::create_directories(src / ("class" + std::to_string(c)));
      for (int i = 0; i < 4; ++i) {
        Image img;
        img.height = 20 + 10 * i;
        img.width = 60 - 10 * i;
        img.pixels.resize(static_cast<size_t>(img.height * img.width * 3));
        for (size_t p = 0; p < img.pixels.size(); ++p) img.pixels[p] = kColour[c][p % 3];
        write_raw((src / ("class" + std::to_string(c)) / (std::to_string(i) + ".jpg")).string(), encode_jpeg(img, 95));
      }
    }
    PackOptions o;
    o.src = src.string();
    o.out = (dir.path() / "packed").string();
    o.split = split;
    o.images_per_shard = 5;
    pack_image_folder(o);
  }
  return (dir.path() / "packed").string();
}

TEST(ShardDataset, LoaderGivesEachSampleItsImageAndLabel) {
  TempDir dir;
  const DatasetPair p = load_dataset(parse_dataset("shards"), packed_flat_dataset(dir), 16);
  EXPECT_EQ(p.train.count, 12);
  EXPECT_EQ(p.test.count, 12);
  EXPECT_EQ(p.train.classes, 3);
  EXPECT_EQ(p.train.height, 16);
  EXPECT_EQ(p.train.channels, 3);
  ASSERT_TRUE(p.train.shards);
  std::vector<uint32_t> all(12);
  std::iota(all.begin(), all.end(), 0u);
  for (bool augment : {false, true}) {
    const BatchAssembler assembler(p.train, p.norm, {0, true, true}, 7, 3);
    Batch b;
    assembler.assemble(all, 1, augment, b);
    ASSERT_EQ(b.size(), 12);
    const float* x = b.images.data<float>();
    for (int64_t i = 0; i < 12; ++i) {
      const int label = b.labels[static_cast<size_t>(i)];
      EXPECT_EQ(label, p.train.labels[static_cast<size_t>(i)]);
      for (int64_t px = 0; px < 16 * 16; ++px)
        for (int c = 0; c < 3; ++c) {
          const float want = (kColour[label][c] / 255.0f - p.norm.mean[c]) / p.norm.std[c];
          ASSERT_NEAR(x[(i * 256 + px) * 3 + c], want, 4 / 255.0f / p.norm.std[c])
              << "sample " << i << " pixel " << px << " channel " << c << (augment ? " (augmented)" : "");
        }
    }
  }
}

// make_folder's pictures (4 a class) packed into DIR/packed, train and val, loaded at 12x12.
DatasetPair packed_pictures(const TempDir& dir) {
  make_folder(dir.path() / "src", 4);
  for (const char* split : {"train", "val"}) {
    PackOptions o;
    o.src = (dir.path() / "src").string();
    o.out = (dir.path() / "packed").string();
    o.split = split;
    pack_image_folder(o);
  }
  return load_dataset(parse_dataset("shards"), (dir.path() / "packed").string(), 12);
}

TEST(ShardDataset, AugmentationDependsOnSeedEpochAndSampleOnly) {
  TempDir dir;
  // Pictures with structure, so that different crops differ.
  const DatasetPair p = packed_pictures(dir);
  const std::vector<uint32_t> idx{3, 0, 7, 5};
  auto batch = [&](int threads, int64_t epoch, bool augment) {
    const BatchAssembler a(p.train, p.norm, {0, true, true}, 11, threads);
    Batch b;
    a.assemble(idx, epoch, augment, b);
    const float* x = b.images.data<float>();
    return std::vector<float>(x, x + b.images.numel());
  };
  EXPECT_EQ(batch(1, 2, true), batch(4, 2, true));    // threads change nothing
  {  // batches of bytes (a GPU normalises them) are the same crops before the table: shards
     // crop while they decode, so nothing is left for the GPU to crop
    const BatchAssembler a(p.train, p.norm, {0, true, true}, 11, 2, true);
    Batch b;
    a.assemble(idx, 2, true, b);
    ASSERT_EQ(b.images.dtype(), DType::U8);
    EXPECT_TRUE(b.crops.empty());
    const std::vector<float> want = batch(1, 2, true);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(want[i], (*b.table)[(i % 3) * 256 + b.images.data<uint8_t>()[i]]) << "element " << i;
  }
  EXPECT_NE(batch(1, 2, true), batch(1, 3, true));    // another epoch, other crops
  EXPECT_EQ(batch(1, 2, false), batch(3, 5, false));  // evaluation: centre crops, always the same
}

// --jpeg-decode gpu hands each sample's JPEG and view to a BatchDecoder on the loader's thread.
// A decoder that does on the CPU what the GPU does (decode, then resample the view it is given)
// must give the CPU path's batch bit for bit: the views are drawn from the same streams, for the
// same dimensions, in the same order. (The GPU decoder itself: tests/gpu.)
class CpuViewDecoder final : public BatchDecoder {
 public:
  void decode(Batch& b) override {
    const int64_t side = b.jpeg_side, per = side * side * 3;
    std::vector<float>& out = out_[&b];  // one per batch of the pool, as the GPU decoder keeps them
    out.resize(static_cast<size_t>(b.size() * per));
    std::vector<uint8_t> bytes(static_cast<size_t>(per));
    for (size_t i = 0; i < b.jpeg_samples.size(); ++i) {
      const Image img = decode_jpeg(b.jpeg[i], "sample");
      EXPECT_EQ(img.height, b.jpeg_samples[i].height);
      EXPECT_EQ(img.width, b.jpeg_samples[i].width);
      resample(img, b.jpeg_samples[i].view, side, bytes.data());
      float* o = out.data() + i * static_cast<size_t>(per);
      for (int64_t e = 0; e < per; ++e) o[e] = (*b.table)[(e % 3) * 256 + bytes[static_cast<size_t>(e)]];
    }
    b.decoded = out.data();
    {
      std::lock_guard lock(mu_);
      decoded_.emplace_back(b.epoch, b.step);
    }
    ++batches;
  }
  // Whether the batch of (epoch, step) was decoded within the given seconds.
  bool decodes(int64_t epoch, int64_t step, double seconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    do {
      {
        std::lock_guard lock(mu_);
        if (std::find(decoded_.begin(), decoded_.end(), std::pair(epoch, step)) != decoded_.end()) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } while (std::chrono::steady_clock::now() < until);
    return false;
  }
  std::atomic<int> batches = 0;  // the loader's decoding thread counts, the test reads

 private:
  std::map<const Batch*, std::vector<float>> out_;
  std::mutex mu_;
  std::vector<std::pair<int64_t, int64_t>> decoded_;  // (epoch, step) in order
};

TEST(ShardDataset, JpegSamplesForADecoderGiveTheCpuPathsBatches) {
  TempDir dir;
  const DatasetPair p = packed_pictures(dir);
  const int64_t per = 12 * 12 * 3;
  for (bool augment : {true, false}) {
    const AugmentSpec aug = augment ? AugmentSpec{0, true, true} : AugmentSpec{};
    const ShardedSampler sampler(p.train.count, 4, 5, 0, 1, true);
    Loader cpu(p.train, p.norm, aug, sampler, 9, 2, 2, false, nullptr, 2);
    CpuViewDecoder decoder;
    Loader gpu(p.train, p.norm, aug, sampler, 9, 2, 2, true, &decoder, 2);
    for (int64_t epoch : {0, 1}) {
      // The second epoch's first batch is read and decoded while the first epoch ends, before
      // it is asked for (a minute: the wait of a loader that does not go on is not a slow one).
      if (epoch == 1) {
        EXPECT_TRUE(decoder.decodes(1, 0, 60)) << (augment ? "augmented" : "");
      }
      cpu.start_epoch(epoch);
      gpu.start_epoch(epoch);
      for (int64_t step = 0;; ++step) {
        const Batch* want = cpu.next();
        const Batch* got = gpu.next();
        ASSERT_EQ(want == nullptr, got == nullptr);
        if (!want) break;
        ASSERT_NE(got->decoded, nullptr);
        EXPECT_FALSE(got->images.defined());
        EXPECT_EQ(got->labels, want->labels);
        const float* x = want->images.data<float>();
        for (int64_t e = 0; e < want->size() * per; ++e)
          ASSERT_EQ(got->decoded[e], x[e]) << "epoch " << epoch << " step " << step << " element " << e
                                           << (augment ? " (augmented)" : "");
      }
    }
    EXPECT_GT(decoder.batches, 0);
  }
}

// A decoder that refuses the batches `refuses` names (with `error`) and "decodes" the others.
class FailingDecoder final : public BatchDecoder {
 public:
  FailingDecoder(std::function<bool(const Batch&)> refuses, std::string error)
      : refuses_(std::move(refuses)), error_(std::move(error)) {}
  void decode(Batch& b) override {
    if (refuses_(b)) throw std::runtime_error(error_);
    b.decoded = &zero_;
  }

 private:
  std::function<bool(const Batch&)> refuses_;
  std::string error_;
  float zero_ = 0;
};

// A decoder's failure (nvJPEG refusing a batch) reaches the consumer as the error of its next()
// (not a hang, nor a batch left undecoded), in the failed batch's place: every batch before it
// is served first. Leaving the loader then stops both of its threads.
TEST(ShardDataset, ADecodersFailureIsTheConsumersError) {
  TempDir dir;
  const DatasetPair p = packed_pictures(dir);
  FailingDecoder decoder([](const Batch& b) { return b.step == 1; }, "no decoder for step 1");
  const ShardedSampler sampler(p.train.count, 2, 5, 0, 1, true);
  ASSERT_GE(sampler.steps_per_epoch(), 3);
  for (int depth : {1, 3}) {
    Loader loader(p.train, p.norm, {}, sampler, 9, depth, 2, true, &decoder, 2);
    loader.start_epoch(0);
    std::string error;
    int64_t steps = 0;
    try {
      while (const Batch* b = loader.next()) {
        ASSERT_NE(b->decoded, nullptr);
        ASSERT_EQ(b->step, steps++);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    EXPECT_EQ(error, "no decoder for step 1") << "depth " << depth;
    EXPECT_EQ(steps, 1) << "depth " << depth << ": step 0 is served before step 1's error";
  }
}

// A batch read ahead into the next epoch (while this one ends: its evaluation, its checkpoint)
// that cannot be decoded fails the next epoch's first step, not this epoch's last ones: the
// error waits in its place behind the batches before it.
TEST(ShardDataset, AReadAheadBatchsFailureWaitsForItsTurn) {
  TempDir dir;
  const DatasetPair p = packed_pictures(dir);
  FailingDecoder decoder([](const Batch& b) { return b.epoch == 1; }, "no decoder for epoch 1");
  const ShardedSampler sampler(p.train.count, 2, 5, 0, 1, true);
  ASSERT_GE(sampler.steps_per_epoch(), 3);
  for (int depth : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "depth " << depth);
    Loader loader(p.train, p.norm, {}, sampler, 9, depth, 2, true, &decoder, 2);
    loader.start_epoch(0);
    int64_t steps = 0;
    // Slowly, so that the next epoch's first batch has failed before this epoch ends.
    while (const Batch* b = loader.next()) {
      ASSERT_EQ(b->step, steps++);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(steps, sampler.steps_per_epoch()) << "every step of epoch 0";
    loader.start_epoch(1);
    std::string error;
    try {
      loader.next();
    } catch (const std::exception& e) {
      error = e.what();
    }
    EXPECT_EQ(error, "no decoder for epoch 1");
  }
}

TEST(ShardDataset, SplitsPackedBeforeManifestsListedShardsStillLoad) {
  TempDir dir;
  const std::string packed = packed_flat_dataset(dir);
  // As hpcdata pack left them before: <split>-NNNNN-of-MMMMM.hpcs, a version 1 manifest, classes.txt.
  for (const char* split : {"train", "val"}) {
    const std::vector<std::string> shards = packed_shards(packed, split);
    for (size_t i = 0; i < shards.size(); ++i)
      fs::rename(shards[i], fs::path(packed) / shard_name(split, static_cast<int64_t>(i),
                                                          static_cast<int64_t>(shards.size())));
    const std::string v1 =
        std::string("{\"format\": \"hpcdata shards\", \"version\": 1, \"split\": \"") + split + "\"}\n";
    write_raw((fs::path(packed) / (std::string(split) + ".json")).string(), Bytes(v1.begin(), v1.end()));
  }
  const DatasetPair p = load_dataset(parse_dataset("shards"), packed, 16);
  EXPECT_EQ(p.train.count, 12);
  EXPECT_EQ(p.test.count, 12);
  EXPECT_EQ(p.train.classes, 3);
}

TEST(ShardDataset, MissingSplitsAndSizesAreUsageErrors) {
  TempDir dir;
  make_folder(dir.path() / "src", 2);
  PackOptions o;
  o.src = (dir.path() / "src").string();
  o.out = (dir.path() / "packed").string();
  pack_image_folder(o);
  EXPECT_NE(usage_error_of([&] { load_dataset(parse_dataset("shards"), o.out, 32); }).find("no val shards"), std::string::npos);
  EXPECT_NE(usage_error_of([&] { load_dataset(parse_dataset("shards"), dir.path().string(), 32); }).find("no train shards"),
            std::string::npos);
  EXPECT_NE(usage_error_of([&] { load_dataset(parse_dataset("mnist"), dir.path().string(), 32); }).find("packed shards and synthetic data only"),
            std::string::npos);
  // The split's shards without their manifest: not "no train shards, pack them" (they are there).
  fs::remove(fs::path(o.out) / "train.json");
  const std::string msg = usage_error_of([&] { load_dataset(parse_dataset("shards"), o.out, 32); });
  EXPECT_NE(msg.find("the manifest " + (fs::path(o.out) / "train.json").string() + " is missing, but 1 train shard(s) are in " +
                     o.out + " (train-g1-00000-of-00001.hpcs)"),
            std::string::npos)
      << msg;
  const std::string v1 = "{\"format\": \"hpcdata shards\", \"version\": 1, \"split\": \"train\"}\n";
  write_raw((fs::path(o.out) / "train.json").string(), Bytes(v1.begin(), v1.end()));
  const std::string old = usage_error_of([&] { load_dataset(parse_dataset("shards"), o.out, 32); });
  EXPECT_NE(old.find("train.json is of version 1 (it lists no shards), but 1 train shard(s) are in"), std::string::npos)
      << old;
}

// evaluate reads the val split alone: a packed dataset staged without its train split serves it
// (it said "no train shards ...: pack them with hpcdata pack --split train").
TEST(ShardDataset, TheValSplitAloneForEvaluation) {
  TempDir dir;
  const std::string packed = packed_flat_dataset(dir);
  for (const std::string& shard : packed_shards(packed, "train")) fs::remove(shard);
  fs::remove(fs::path(packed) / "train.json");
  const DatasetPair p = load_dataset(parse_dataset("shards"), packed, 16, /*test_only=*/true);
  EXPECT_EQ(p.test.count, 12);
  EXPECT_EQ(p.test.class_names, (std::vector<std::string>{"class0", "class1", "class2"}));
  EXPECT_EQ(p.train.count, 0);
  EXPECT_NE(usage_error_of([&] { load_dataset(parse_dataset("shards"), packed, 16); }).find("no train shards"),
            std::string::npos);
}

// The val split's images are never trained on: a val shard listed in train.json too (a manifest
// edited by hand or merged), or linked under a train shard's name, is refused as the test set
// trained on, naming the shard. (It trained on the test set without a word.)
TEST(ShardDataset, AValShardInTheTrainSplitIsRefused) {
  TempDir dir;
  const std::string packed = packed_flat_dataset(dir);
  ASSERT_NO_THROW(load_dataset(parse_dataset("shards"), packed, 16));
  const std::string path = (fs::path(packed) / "train.json").string();
  const Bytes bytes = read_raw(path);
  const nlohmann::json good = nlohmann::json::parse(bytes.begin(), bytes.end());
  const nlohmann::json val = [&] {
    const Bytes v = read_raw((fs::path(packed) / "val.json").string());
    return nlohmann::json::parse(v.begin(), v.end());
  }();
  const auto write = [&](const nlohmann::json& m) {
    const std::string text = m.dump(2);
    write_raw(path, Bytes(text.begin(), text.end()));
  };
  // Listed by both manifests.
  nlohmann::json both = good;
  const nlohmann::json& shard = val["shard_files"].back();
  both["shard_files"].push_back(shard);
  both["images"] = good["images"].get<int64_t>() + shard["records"].get<int64_t>();
  write(both);
  const std::string listed = (fs::path(packed) / shard["name"].get<std::string>()).string();
  std::string msg = usage_error_of([&] { load_dataset(parse_dataset("shards"), packed, 16); });
  EXPECT_NE(msg.find("the train and val splits both list the shard " + listed + ": the test set would be trained on"),
            std::string::npos)
      << msg;
  // A train shard's name linked to a val shard (the manifest saying so).
  nlohmann::json linked = good;
  nlohmann::json& last = linked["shard_files"].back();
  const std::string train_shard = (fs::path(packed) / last["name"].get<std::string>()).string();
  linked["images"] = good["images"].get<int64_t>() - last["records"].get<int64_t>() + shard["records"].get<int64_t>();
  for (const char* key : {"bytes", "records", "index_crc32"}) last[key] = shard[key];
  write(linked);
  fs::remove(train_shard);
  fs::create_hard_link(listed, train_shard);
  msg = usage_error_of([&] { load_dataset(parse_dataset("shards"), packed, 16); });
  EXPECT_NE(msg.find("the train split's shard " + train_shard + " and the val split's " + listed +
                     " are one file (a link?): the test set would be trained on"),
            std::string::npos)
      << msg;
}

// A manifest edited by hand, or written by a newer pack, is refused naming what is wrong: a
// version this build does not read, a shard listed twice (its images read twice, another left
// out), a class named twice, a class count that is not the names'. So is a class named twice in
// an old packing's classes.txt. (Each was taken without a word.)
TEST(ShardDataset, AManifestThatCannotBeRightIsRefused) {
  TempDir dir;
  const std::string packed = packed_flat_dataset(dir);
  const std::string path = (fs::path(packed) / "train.json").string();
  const Bytes bytes = read_raw(path);
  const nlohmann::json good = nlohmann::json::parse(bytes.begin(), bytes.end());
  const auto write = [&](const nlohmann::json& m) {
    const std::string text = m.dump(2);
    write_raw(path, Bytes(text.begin(), text.end()));
  };
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json m = good;
    edit(m);
    write(m);
    return usage_error_of([&] { open_split(packed, "train"); });
  };
  write(good);
  ASSERT_NO_THROW(open_split(packed, "train")) << "the manifest as pack wrote it, rewritten";
  EXPECT_NE(refused([](nlohmann::json& m) { m["version"] = 99; })
                .find("train.json is a manifest of version 99, and this hpctrain reads versions 1 and 2"),
            std::string::npos);
  ASSERT_GE(good["shard_files"].size(), 1u);
  EXPECT_NE(refused([](nlohmann::json& m) { m["shard_files"].push_back(m["shard_files"][0]); })
                .find("train.json lists the shard " + good["shard_files"][0]["name"].get<std::string>() + " twice"),
            std::string::npos);
  EXPECT_NE(refused([](nlohmann::json& m) { m["class_names"][1] = m["class_names"][0]; })
                .find("train.json names the class 'class0' twice"),
            std::string::npos);
  EXPECT_NE(refused([](nlohmann::json& m) { m["classes"] = 4; }).find("train.json counts 4 classes but names 3"),
            std::string::npos);
  // A count that is no whole number: 1e300 converted to an integer it does not fit, undefined (seen
  // while writing tests/fuzz/text_fuzz, whose build's UBSan reports it); 3.5 read as 3 passed.
  EXPECT_NE(refused([](nlohmann::json& m) { m["classes"] = 1e300; }).find("train.json counts 1e+300 classes but names 3"),
            std::string::npos);
  EXPECT_NE(refused([](nlohmann::json& m) { m["classes"] = 3.5; }).find("train.json counts 3.5 classes but names 3"),
            std::string::npos);
  // An empty manifest, or a version that is no number, was read as none: "no train shards in DIR
  // (train.json lists them): pack them", for a split that was packed.
  EXPECT_NE(refused([](nlohmann::json& m) { m["version"] = "2"; })
                .find("train.json has a version that is not a whole number (\"2\"): overwritten? pack the split again"),
            std::string::npos);
  write_raw(path, Bytes{});
  EXPECT_NE(usage_error_of([&] { open_split(packed, "train"); })
                .find("train.json is empty (cut short, or emptied?): pack the split again"),
            std::string::npos);
  // A number past a double's range: nlohmann throws out_of_range, not parse_error, while it parses
  // (it escaped as an unknown exception; found by tests/fuzz/text_fuzz).
  const std::string huge = "{\"format\": \"hpcdata shards\", \"split\": \"train\", \"version\": 1e3000}";
  write_raw(path, Bytes(huge.begin(), huge.end()));
  EXPECT_NE(usage_error_of([&] { open_split(packed, "train"); })
                .find("train.json is not a packed split's manifest (number overflow parsing '1e3000')"),
            std::string::npos);
  // Counts past int64 (or below 0) were read wrapped around: "counts -1 images".
  EXPECT_NE(refused([](nlohmann::json& m) { m["images"] = UINT64_MAX; })
                .find("train.json is not a complete packed split's manifest (images is not a whole number from 0 to "
                      "9223372036854775807)"),
            std::string::npos);
  EXPECT_NE(refused([](nlohmann::json& m) { m["shard_files"][0]["records"] = -3; })
                .find("(records is not a whole number from 0 to 9223372036854775807)"),
            std::string::npos);
  EXPECT_NE(refused([](nlohmann::json& m) { m["shard_files"][0]["bytes"] = 1.5; })
                .find("(bytes is not a whole number from 0 to 18446744073709551615)"),
            std::string::npos);
  TempDir old;
  write_raw(old.file("classes.txt"), Bytes{'c', 'a', 't', '\n', 'c', 'a', 't', '\n'});
  EXPECT_NE(usage_error_of([&] { read_class_names(old.str()); }).find("classes.txt names the class 'cat' twice"),
            std::string::npos);
}

// A FIFO (or device) where a shard, a manifest or the class list should be is refused naming it:
// each open waited for a writer for ever (only --start-timeout, 30 minutes, ended the run), and a
// manifest that is a directory was exit 1 with a stream error naming no file.
TEST(ShardDataset, AFifoOrDirectoryInPlaceOfADatasetFileIsRefusedNotWaitedFor) {
  TempDir dir;
  const std::string packed = packed_flat_dataset(dir);
  const std::string shard = packed_shards(packed, "train").at(0);
  const fs::path manifest = fs::path(packed) / "train.json", classes = fs::path(packed) / "classes.txt";
  for (const fs::path& file : {fs::path(shard), manifest, classes}) {
    SCOPED_TRACE(file.string());
    const fs::path kept = file.string() + ".kept";
    fs::rename(file, kept);
    ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
    const std::string error = usage_error_of([&] {
      if (file == classes) read_class_names(packed);
      else open_split(packed, "train");
    });
    EXPECT_NE(error.find(file.string() + " is not a regular file (a FIFO or device?)"), std::string::npos) << error;
    fs::remove(file);
    if (file == manifest) {
      fs::create_directory(file);
      const std::string as_dir = usage_error_of([&] { open_split(packed, "train"); });
      EXPECT_NE(as_dir.find(file.string() + " is not a regular file (a directory)"), std::string::npos) << as_dir;
      fs::remove(file);
    }
    fs::rename(kept, file);
  }
  ASSERT_NO_THROW(open_split(packed, "train"));
}

// classes.txt that is a directory is said to be one (it read as a list of no classes).
TEST(ShardDataset, AClassListThatIsADirectoryIsNamed) {
  TempDir dir;
  fs::create_directories(dir.path() / "classes.txt");
  EXPECT_NE(usage_error_of([&] { read_class_names(dir.path().string()); }).find("classes.txt is not a regular file (a directory)"),
            std::string::npos);
}

}  // namespace
}  // namespace hpc::data
