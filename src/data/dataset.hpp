// Datasets held in memory as uint8 pixels (NHWC) and labels, as the files store them;
// normalisation to float happens per batch in the loader.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/choice.hpp"

namespace hpc::data {

class ShardImages;

struct Dataset {
  std::string source;  // file or directory it came from, for messages
  int64_t count = 0, height = 0, width = 0, channels = 0;
  int classes = 10;
  // The names of the labels where the files give them (packed shards: the packing's classes, label i
  // named class_names[i]); empty for the datasets whose names are fixed (data/facts.hpp).
  std::vector<std::string> class_names;
  std::vector<uint8_t> images;  // count x height x width x channels (empty when `shards` holds them)
  std::vector<int32_t> labels;  // count
  // Packed image shards, decoded per batch (shard_images.hpp); null for the in-memory datasets.
  std::shared_ptr<const ShardImages> shards;
  std::string packed_from;  // packed shards: the image folder hpcdata pack read ("": not known)
  int64_t sample_bytes() const { return height * width * channels; }
  // Keeps the first n samples (short test runs); n <= 0 keeps all.
  void truncate(int64_t n);
  // truncate(n) for the option `option` (--train-samples, --test-samples): n above the set's count
  // is a usage error naming both (it was taken as the whole set, and recorded as given).
  void truncate_to_option(int64_t n, const char* option, const char* which);
};

struct Normalization {
  std::vector<float> mean, std;  // per channel, on pixels scaled to [0, 1]
};

struct DatasetPair {
  Dataset train, test;
  Normalization norm;
};

// The datasets hpctrain reads, and their names (--dataset, checkpoints), in --help's order.
enum class DatasetKind { FashionMnist, Mnist, Cifar10, Cifar100, Shards, Synthetic };
inline constexpr Named<DatasetKind> kDatasetNames[] = {
    {"fashion-mnist", DatasetKind::FashionMnist}, {"mnist", DatasetKind::Mnist},
    {"cifar10", DatasetKind::Cifar10},           {"cifar100", DatasetKind::Cifar100},
    {"shards", DatasetKind::Shards},             {"synthetic", DatasetKind::Synthetic}};
inline const char* dataset_name(DatasetKind kind) { return name_of(kDatasetNames, kind); }
// A name to its kind: a usage error "unknown --dataset 'x' (choose ...)" for any other.
inline DatasetKind parse_dataset(const std::string& name) { return parse_named(kDatasetNames, name, "--dataset"); }
inline bool find_dataset(const std::string& name, DatasetKind* kind) { return find_named(kDatasetNames, name, kind); }
// The per-channel mean and standard deviation (of pixels scaled to [0, 1]) that training and
// evaluation normalise a dataset's images with.
Normalization normalization_of(DatasetKind kind);
// Where the dataset is found when --data-dir is not given (Debian's package for Fashion-MNIST).
std::string default_data_dir(DatasetKind kind);
// Loads train and test sets; every problem with the files is a usage error naming the file.
// image_size: the side of the square images of packed shards (cropped to it) and of synthetic
// data (0: 224);
// the other datasets have their own size and take 0 only. test_only (evaluate): the test set alone
// (train left empty), its files checked as ever; the training files need not be there, and are
// not read (evaluate asked for them: "no train shards ...: pack them", or 60000 images read for nothing).
DatasetPair load_dataset(DatasetKind kind, const std::string& dir, int64_t image_size = 0, bool test_only = false);
// Random images and labels from a fixed seed, ImageNet-shaped (3 channels, 1000 classes;
// image_size 0: 224): for benchmarks that measure the training step without a dataset's files,
// as the peer's synthetic workload. --train-samples / --test-samples cut them shorter.
constexpr int64_t kSyntheticTrain = 2048, kSyntheticTest = 256;
constexpr int kSyntheticClasses = 1000;
DatasetPair load_synthetic(int64_t image_size);
// Packed shards (hpcdata pack): the train and val splits their manifests DIR/train.json and
// DIR/val.json list (shards.hpp).
DatasetPair load_shards(const std::string& dir, int64_t image_size, bool test_only = false);

// IDX files (MNIST, Fashion-MNIST), gzip-compressed or raw. Expected image size is checked.
// load_dataset also asks for the published counts (kIdxTrainRecords, kIdxTestRecords) and refuses
// a training set and a test set that hold the same records.
Dataset read_idx(const std::string& images_path, const std::string& labels_path, int64_t height, int64_t width,
                 int classes);
// CIFAR-10 binary batches: records of 1 label byte and 3072 pixel bytes (planar RGB 32x32).
// records_per_file > 0: each file must hold exactly that many (load_dataset asks for the
// published counts, so that records appended to a batch, or cut from it, are refused).
Dataset read_cifar10(const std::vector<std::string>& paths, int64_t records_per_file = 0);
// CIFAR-100 binary files: records of a coarse and a fine label byte (the fine one, 0..99, is the
// class) and the same 3072 pixel bytes.
Dataset read_cifar100(const std::vector<std::string>& paths, int64_t records_per_file = 0);
// The published record counts of MNIST's and Fashion-MNIST's IDX files and of the CIFAR binary files.
constexpr int64_t kIdxTrainRecords = 60000, kIdxTestRecords = 10000;
constexpr int64_t kCifar10RecordsPerFile = 10000, kCifar100TrainRecords = 50000, kCifar100TestRecords = 10000;

// How much of a gzipped dataset file is worth decoding: what its first `header` bytes (none for a
// format without a header) declare the whole decoded file to hold. A file whose stream holds more
// is refused there, never inflated whole (a small file can inflate to gigabytes); a header that
// declares nothing (bytes 0: not this format's) stops the decoding after it, for the reader to
// say what is wrong. No `declared`: decoded whole.
struct DecodedSize {
  struct Declared {
    uint64_t bytes = 0;
    std::string what;  // "the 60000 labels its header declares", for the error
  };
  size_t header = 0;
  std::function<Declared(const uint8_t* header)> declared;
};

// Reads a whole file, gunzipping when it starts with the gzip magic (no further than `limit`).
std::vector<uint8_t> read_file_maybe_gzip(const std::string& path, const DecodedSize& limit = {});
// Whether a dataset file is at `path` (false: nothing there). Anything else that stops it being
// read is a usage error with the system's reason: a permission denied is not "does not exist".
bool dataset_file_exists(const std::string& path);

}  // namespace hpc::data
