#include "data/dataset.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/rng.hpp"
#include "data/shard_images.hpp"
#include "data/shards.hpp"

namespace hpc::data {
namespace fs = std::filesystem;

namespace {

// An IDX file may be stored as NAME.gz or NAME, and some mirrors write NAME with a dot
// before "idx" (train-images.idx3-ubyte). The first that exists wins.
std::string find_idx(const std::string& dir, const std::string& stem) {
  std::string dotted = stem;
  dotted[dotted.find("-idx")] = '.';
  for (const std::string& name : {stem + ".gz", stem, dotted + ".gz", dotted}) {
    const std::string path = (fs::path(dir) / name).string();
    if (dataset_file_exists(path)) return path;
  }
  usage_error("dataset file ", (fs::path(dir) / (stem + ".gz")).string(), " does not exist (nor ", stem,
              " uncompressed)");
}

// The data directory must be one; the error says why it cannot be used (a permission
// denied is not "does not exist"), with a hint only where the default place was looked in.
void require_data_directory(DatasetKind kind, const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const bool missing = errno == ENOENT;
    HPC_REQUIRE(missing, "cannot read data directory ", dir, ": ", std::strerror(errno));
    const bool default_place = dir == default_data_dir(kind);
    // Where the default place was looked in (no --data-dir): how to get the dataset, too.
    const std::string name = dataset_name(kind);
    usage_error("data directory ", dir, " does not exist",
                !default_place                      ? ""
                : kind == DatasetKind::FashionMnist ? " (apt-get install dataset-fashion-mnist, or pass --data-dir)"
                : kind == DatasetKind::Shards
                    ? " (pack an image folder with hpcdata pack SRC DIR, then pass --data-dir DIR)"
                    : " (hpcdata prepare " + name + " --out DIR fetches it; then pass --data-dir DIR)");
  }
  HPC_REQUIRE(S_ISDIR(st.st_mode), "data directory ", dir, " is not a directory");
}

// The records of one dataset file (a CIFAR batch, an IDX pair).
struct FileRecords {
  const std::string* path;
  const uint8_t* images;
  const int32_t* labels;
};

// Whether two files hold the same n records of `bytes` pixel bytes each: one copied over the other.
bool same_records(const FileRecords& a, const FileRecords& b, int64_t n, int64_t bytes) {
  return std::memcmp(a.images, b.images, static_cast<size_t>(n * bytes)) == 0 &&
         std::equal(a.labels, a.labels + n, b.labels);
}

constexpr const char* kTrainedOnTest = ": the test set would be trained on";

// An IDX file of the published size: another count is a file of the other split (the test files
// copied over the training files train on the test set), or one cut short or extended.
void require_published_count(DatasetKind kind, const Dataset& d, int64_t published, const char* split) {
  HPC_REQUIRE(d.count == published, "dataset file ", d.source, " holds ", d.count, " images where ",
              dataset_name(kind), "'s ", split, " set has ", published,
              " (a file of the other set copied over it, or one cut short or extended?)");
}

DatasetPair load_idx_pair(DatasetKind kind, const std::string& dir, bool test_only) {
  DatasetPair p;
  p.norm = normalization_of(kind);
  if (test_only) {
    p.test = read_idx(find_idx(dir, "t10k-images-idx3-ubyte"), find_idx(dir, "t10k-labels-idx1-ubyte"), 28, 28, 10);
    require_published_count(kind, p.test, kIdxTestRecords, "test");
    return p;
  }
  p.train = read_idx(find_idx(dir, "train-images-idx3-ubyte"), find_idx(dir, "train-labels-idx1-ubyte"), 28, 28, 10);
  p.test = read_idx(find_idx(dir, "t10k-images-idx3-ubyte"), find_idx(dir, "t10k-labels-idx1-ubyte"), 28, 28, 10);
  // The same records in both first: that says what happened better than either count.
  const FileRecords train{&p.train.source, p.train.images.data(), p.train.labels.data()};
  const FileRecords test{&p.test.source, p.test.images.data(), p.test.labels.data()};
  HPC_REQUIRE(p.train.count != p.test.count || !same_records(train, test, p.test.count, p.test.sample_bytes()),
              "dataset files ", p.train.source, " and ", p.test.source, " hold the same records (one copied over "
              "the other?)", kTrainedOnTest);
  require_published_count(kind, p.train, kIdxTrainRecords, "training");
  require_published_count(kind, p.test, kIdxTestRecords, "test");
  return p;
}

// CIFAR-10's six files hold different images: one copied over another (the test batch as a
// training batch, which trains on the test set; one batch twice) is refused, naming both.
void require_distinct_files(const Dataset& train, const std::vector<std::string>& train_paths, const Dataset& test,
                            const std::string& test_path) {
  const int64_t n = kCifar10RecordsPerFile, bytes = n * train.sample_bytes();
  std::vector<FileRecords> files;
  for (size_t i = 0; i < train_paths.size(); ++i)
    files.push_back({&train_paths[i], train.images.data() + i * bytes, train.labels.data() + i * n});
  files.push_back({&test_path, test.images.data(), test.labels.data()});
  for (size_t a = 0; a < files.size(); ++a)
    for (size_t b = a + 1; b < files.size(); ++b)
      HPC_REQUIRE(!same_records(files[a], files[b], n, train.sample_bytes()), "dataset files ", *files[a].path,
                  " and ", *files[b].path, " hold the same records (one copied over the other?)",
                  b + 1 == files.size() ? kTrainedOnTest : "");
}

DatasetPair load_cifar10(const std::string& dir, bool test_only) {
  fs::path root(dir);
  std::error_code ec;
  // Accept the directory the tarball unpacks to, or its parent.
  if (!fs::exists(root / (test_only ? "test_batch.bin" : "data_batch_1.bin"), ec) &&
      fs::exists(root / "cifar-10-batches-bin", ec))
    root /= "cifar-10-batches-bin";
  DatasetPair p;
  p.norm = normalization_of(DatasetKind::Cifar10);
  const std::string test = (root / "test_batch.bin").string();
  if (test_only) {
    p.test = read_cifar10({test}, kCifar10RecordsPerFile);
    return p;
  }
  std::vector<std::string> train;
  for (int i = 1; i <= 5; ++i) train.push_back((root / ("data_batch_" + std::to_string(i) + ".bin")).string());
  p.train = read_cifar10(train, kCifar10RecordsPerFile);
  p.test = read_cifar10({test}, kCifar10RecordsPerFile);
  require_distinct_files(p.train, train, p.test, test);
  return p;
}

DatasetPair load_cifar100(const std::string& dir, bool test_only) {
  fs::path root(dir);
  std::error_code ec;
  if (!fs::exists(root / (test_only ? "test.bin" : "train.bin"), ec) && fs::exists(root / "cifar-100-binary", ec))
    root /= "cifar-100-binary";
  DatasetPair p;
  if (!test_only) p.train = read_cifar100({(root / "train.bin").string()}, kCifar100TrainRecords);
  p.test = read_cifar100({(root / "test.bin").string()}, kCifar100TestRecords);
  p.norm = normalization_of(DatasetKind::Cifar100);
  return p;
}

}  // namespace

void Dataset::truncate(int64_t n) {
  if (n <= 0 || n >= count) return;
  count = n;
  if (!shards) images.resize(n * sample_bytes());
  labels.resize(n);
}

void Dataset::truncate_to_option(int64_t n, const char* option, const char* which) {
  HPC_REQUIRE(n <= count, option, " ", n, " is more than the ", count, " ", which, " samples of ", source,
              " (0: all of them)");
  truncate(n);
}

Normalization normalization_of(DatasetKind kind) {
  switch (kind) {
    case DatasetKind::FashionMnist: return {{0.2860f}, {0.3530f}};
    case DatasetKind::Mnist: return {{0.1307f}, {0.3081f}};
    case DatasetKind::Cifar10: return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
    case DatasetKind::Cifar100: return {{0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}};
    case DatasetKind::Shards:
    case DatasetKind::Synthetic: break;
  }
  // Packed shards and synthetic data: ImageNet's, as torchvision uses.
  return {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
}

std::string default_data_dir(DatasetKind kind) {
  // Debian's dataset-fashion-mnist installs here; the others have no Debian package.
  if (kind == DatasetKind::FashionMnist) return "/usr/share/datasets/fashion-mnist";
  if (kind == DatasetKind::Mnist) return "/usr/share/datasets/mnist";
  return std::string("data/") + dataset_name(kind);
}

namespace {

// A shard file of a split: its path, and the file it is (device, inode).
struct ShardFile {
  std::string path;
  dev_t dev;
  ino_t ino;
};

ShardFile shard_file(const ShardReader& r) {
  struct stat st {};
  HPC_REQUIRE(::stat(r.path().c_str(), &st) == 0, "cannot read shard ", r.path(), ": ", std::strerror(errno));
  return {r.path(), st.st_dev, st.st_ino};
}

// The val split's images must not be trained on: a shard file listed in train.json and val.json
// both (a manifest edited by hand, or merged), or linked under a train shard's name, is refused as
// the other datasets refuse a test file copied over a training file. (It trained without a word.)
// (Shards of equal bytes in both splits are not refused: two packings of one image folder, or of
// folders with the same images, make them, and the trainer warns of the first.)
void require_distinct_splits(const std::vector<ShardFile>& train, const std::vector<ShardFile>& val) {
  std::map<std::pair<dev_t, ino_t>, const ShardFile*> trained;
  for (const ShardFile& t : train) trained.emplace(std::pair{t.dev, t.ino}, &t);
  for (const ShardFile& v : val) {
    const auto it = trained.find({v.dev, v.ino});
    if (it == trained.end()) continue;
    if (it->second->path == v.path) usage_error("the train and val splits both list the shard ", v.path, kTrainedOnTest);
    usage_error("the train split's shard ", it->second->path, " and the val split's ", v.path,
                " are one file (a link?)", kTrainedOnTest);
  }
}

}  // namespace

DatasetPair load_shards(const std::string& dir, int64_t image_size, bool test_only) {
  const int64_t size = image_size > 0 ? image_size : 224;
  std::vector<ShardFile> listed[2];  // train's, val's
  auto split = [&](const std::string& which) {
    OpenSplit open = open_split(dir, which);
    HPC_REQUIRE(!open.shards.empty(), "no ", which, " shards in ", dir, " (", which,
                ".json lists them): pack them with hpcdata pack --split ", which);
    for (const ShardReader& r : open.shards)
      listed[which == "train" ? 0 : 1].push_back(shard_file(r));
    Dataset d;
    d.source = dir;
    d.classes = static_cast<int>(open.classes.size());
    d.class_names = open.classes;
    d.packed_from = open.source;
    auto images = std::make_shared<const ShardImages>(std::move(open.shards), size);
    d.count = images->count();
    HPC_REQUIRE(d.count > 0, "the ", which, " shards in ", dir, " hold no images");
    d.height = d.width = size;
    d.channels = 3;
    d.labels = images->labels();
    d.shards = std::move(images);
    return std::make_pair(std::move(d), std::move(open.classes));
  };
  DatasetPair p;
  p.norm = normalization_of(DatasetKind::Shards);
  if (test_only) {
    p.test = split("val").first;
    return p;
  }
  auto [train, train_classes] = split("train");
  auto [test, test_classes] = split("val");
  require_distinct_splits(listed[0], listed[1]);
  if (train_classes != test_classes) {
    // Which class differs: the counts, or (the same count) the first name that differs.
    std::string which = detail::concat(train_classes.size(), " and ", test_classes.size());
    if (train_classes.size() == test_classes.size()) {
      const auto [a, b] = std::mismatch(train_classes.begin(), train_classes.end(), test_classes.begin());
      which = detail::concat("class ", a - train_classes.begin(), " is '", *a, "' and '", *b, "'");
    }
    usage_error("the train and val splits in ", dir, " have different classes (", which,
                "): pack both from folders with the same classes");
  }
  p.train = std::move(train);
  p.test = std::move(test);
  return p;
}

DatasetPair load_synthetic(int64_t image_size) {
  const int64_t size = image_size > 0 ? image_size : 224;
  auto split = [&](int64_t count, uint64_t which) {
    Dataset d;
    d.source = "synthetic";
    d.count = count;
    d.height = d.width = size;
    d.channels = 3;
    d.classes = kSyntheticClasses;
    d.images.resize(static_cast<size_t>(count * d.sample_bytes()));
    d.labels.resize(static_cast<size_t>(count));
    // One Philox stream per sample: the same bytes on every rank and machine.
    for (int64_t i = 0; i < count; ++i) {
      Philox rng(0, RngStream::Synthetic, which, static_cast<uint64_t>(i));
      d.labels[i] = static_cast<int32_t>(rng.below(kSyntheticClasses));
      uint8_t* px = d.images.data() + i * d.sample_bytes();
      for (int64_t b = 0; b < d.sample_bytes(); b += 4) {
        const uint32_t r = rng.next_u32();
        for (int64_t k = 0; k < 4 && b + k < d.sample_bytes(); ++k) px[b + k] = static_cast<uint8_t>(r >> (8 * k));
      }
    }
    return d;
  };
  DatasetPair p;
  p.train = split(kSyntheticTrain, 0);
  p.test = split(kSyntheticTest, 1);
  p.norm = normalization_of(DatasetKind::Synthetic);
  return p;
}

namespace {
// A directory hpcdata prepare made records its dataset in hpcdata.json ({"dataset": "mnist", ...}):
// Fashion-MNIST read as --dataset mnist (the same file names and sizes) trained without a word, with
// MNIST's normalisation and name. A file whose text does not read as one constrains nothing; one
// that is not a regular file (a FIFO blocked the run in open(), deaf to TERM; a directory failed
// with the C++ library's "basic_filebuf::underflow") or cannot be read is refused, as a dataset
// file is.
constexpr int64_t kMostPreparedManifestBytes = int64_t{16} << 20;  // prepare's is a few kB
void require_prepared_as(DatasetKind kind, const std::string& dir) {
  const std::string path = (fs::path(dir) / "hpcdata.json").string();
  if (!dataset_file_exists(path)) return;
  const std::vector<uint8_t> text = read_data_file(path, "dataset manifest", kMostPreparedManifestBytes);
  const nlohmann::json manifest = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object() || !manifest.contains("dataset") || !manifest["dataset"].is_string()) return;
  const std::string prepared = manifest["dataset"].get<std::string>();
  DatasetKind theirs;
  HPC_REQUIRE(!find_dataset(prepared, &theirs) || theirs == kind, "--data-dir ", dir, " holds ", prepared,
              " (its hpcdata.json, from hpcdata prepare, says so), not ", dataset_name(kind), ": give --dataset ",
              prepared);
}
}  // namespace

DatasetPair load_dataset(DatasetKind kind, const std::string& dir, int64_t image_size, bool test_only) {
  if (kind == DatasetKind::Synthetic) return load_synthetic(image_size);
  require_data_directory(kind, dir);
  require_prepared_as(kind, dir);
  if (kind == DatasetKind::Shards) return load_shards(dir, image_size, test_only);
  HPC_REQUIRE(image_size <= 0, "--image-size applies to packed shards and synthetic data only; ", dataset_name(kind),
              " has its own image size");
  if (kind == DatasetKind::FashionMnist || kind == DatasetKind::Mnist) return load_idx_pair(kind, dir, test_only);
  if (kind == DatasetKind::Cifar10) return load_cifar10(dir, test_only);
  return load_cifar100(dir, test_only);
}

}  // namespace hpc::data
