#include "data/dataset.hpp"

#include <algorithm>
#include <filesystem>

#include "core/error.hpp"
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
    std::error_code ec;
    if (fs::is_regular_file(fs::path(dir) / name, ec)) return (fs::path(dir) / name).string();
  }
  usage_error("dataset file ", (fs::path(dir) / (stem + ".gz")).string(), " does not exist (nor ", stem,
              " uncompressed)");
}

DatasetPair load_idx_pair(const std::string& dir, Normalization norm) {
  DatasetPair p;
  p.train = read_idx(find_idx(dir, "train-images-idx3-ubyte"), find_idx(dir, "train-labels-idx1-ubyte"), 28, 28, 10);
  p.test = read_idx(find_idx(dir, "t10k-images-idx3-ubyte"), find_idx(dir, "t10k-labels-idx1-ubyte"), 28, 28, 10);
  p.norm = std::move(norm);
  return p;
}

DatasetPair load_cifar10(const std::string& dir) {
  fs::path root(dir);
  std::error_code ec;
  // Accept the directory the tarball unpacks to, or its parent.
  if (!fs::exists(root / "data_batch_1.bin", ec) && fs::exists(root / "cifar-10-batches-bin", ec))
    root /= "cifar-10-batches-bin";
  std::vector<std::string> train;
  for (int i = 1; i <= 5; ++i) train.push_back((root / ("data_batch_" + std::to_string(i) + ".bin")).string());
  DatasetPair p;
  p.train = read_cifar10(train);
  p.test = read_cifar10({(root / "test_batch.bin").string()});
  p.norm = {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
  return p;
}

DatasetPair load_cifar100(const std::string& dir) {
  fs::path root(dir);
  std::error_code ec;
  if (!fs::exists(root / "train.bin", ec) && fs::exists(root / "cifar-100-binary", ec)) root /= "cifar-100-binary";
  DatasetPair p;
  p.train = read_cifar100({(root / "train.bin").string()});
  p.test = read_cifar100({(root / "test.bin").string()});
  p.norm = {{0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}};
  return p;
}

}  // namespace

void Dataset::truncate(int64_t n) {
  if (n <= 0 || n >= count) return;
  count = n;
  if (!shards) images.resize(n * sample_bytes());
  labels.resize(n);
}

const std::vector<std::string>& dataset_names() {
  static const std::vector<std::string> names{"fashion-mnist", "mnist", "cifar10", "cifar100", "shards"};
  return names;
}

std::string default_data_dir(const std::string& name) {
  // Debian's dataset-fashion-mnist installs here; the others have no Debian package.
  if (name == "fashion-mnist") return "/usr/share/datasets/fashion-mnist";
  if (name == "mnist") return "/usr/share/datasets/mnist";
  return "data/" + name;
}

DatasetPair load_shards(const std::string& dir, int64_t image_size) {
  const int64_t size = image_size > 0 ? image_size : 224;
  const std::vector<std::string> names = read_class_names(dir);
  const auto classes = static_cast<uint32_t>(names.size());
  auto split = [&](const std::string& which) {
    const std::vector<std::string> paths = list_shards(dir, which);
    HPC_REQUIRE(!paths.empty(), "no ", which, " shards (", which, "-NNNNN-of-MMMMM.hpcs) in ", dir,
                ": pack them with hpcdata pack --split ", which);
    Dataset d;
    d.source = dir;
    auto images = std::make_shared<const ShardImages>(paths, classes, size);
    d.count = images->count();
    HPC_REQUIRE(d.count > 0, "the ", which, " shards in ", dir, " hold no images");
    d.height = d.width = size;
    d.channels = 3;
    d.classes = static_cast<int>(classes);
    d.labels = images->labels();
    d.shards = std::move(images);
    return d;
  };
  DatasetPair p;
  p.train = split("train");
  p.test = split("val");
  p.norm = {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};  // ImageNet's, as torchvision uses
  return p;
}

DatasetPair load_dataset(const std::string& name, const std::string& dir, int64_t image_size) {
  const auto& names = dataset_names();
  HPC_REQUIRE(std::find(names.begin(), names.end(), name) != names.end(), "unknown --dataset '", name,
              "' (choose fashion-mnist, mnist, cifar10, cifar100 or shards)");
  std::error_code ec;
  HPC_REQUIRE(fs::is_directory(dir, ec), "data directory ", dir, " does not exist",
              name == "fashion-mnist" ? " (apt-get install dataset-fashion-mnist, or pass --data-dir)"
                                      : " (pass --data-dir)");
  if (name == "shards") return load_shards(dir, image_size);
  HPC_REQUIRE(image_size <= 0, "--image-size applies to packed shards only; ", name, " has its own image size");
  if (name == "fashion-mnist") return load_idx_pair(dir, {{0.2860f}, {0.3530f}});
  if (name == "mnist") return load_idx_pair(dir, {{0.1307f}, {0.3081f}});
  if (name == "cifar10") return load_cifar10(dir);
  return load_cifar100(dir);
}

}  // namespace hpc::data
