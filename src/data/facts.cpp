#include "data/facts.hpp"

#include "core/error.hpp"
#include "data/shard_images.hpp"

namespace hpc::data {
namespace {

// The published label orders of each dataset (label i is names[i]).
const std::vector<std::string>& fashion_mnist_names() {
  static const std::vector<std::string> names{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                              "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

const std::vector<std::string>& mnist_names() {
  static const std::vector<std::string> names{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  return names;
}

const std::vector<std::string>& cifar10_names() {
  static const std::vector<std::string> names{"airplane", "automobile", "bird",  "cat",  "deer",
                                              "dog",      "frog",       "horse", "ship", "truck"};
  return names;
}

// CIFAR-100's fine labels, as its meta file lists them.
const std::vector<std::string>& cifar100_names() {
  static const std::vector<std::string> names{
      "apple",      "aquarium_fish", "baby",       "bear",       "beaver",      "bed",         "bee",
      "beetle",     "bicycle",       "bottle",     "bowl",       "boy",         "bridge",      "bus",
      "butterfly",  "camel",         "can",        "castle",     "caterpillar", "cattle",      "chair",
      "chimpanzee", "clock",         "cloud",      "cockroach",  "couch",       "crab",        "crocodile",
      "cup",        "dinosaur",      "dolphin",    "elephant",   "flatfish",    "forest",      "fox",
      "girl",       "hamster",       "house",      "kangaroo",   "keyboard",    "lamp",        "lawn_mower",
      "leopard",    "lion",          "lizard",     "lobster",    "man",         "maple_tree",  "motorcycle",
      "mountain",   "mouse",         "mushroom",   "oak_tree",   "orange",      "orchid",      "otter",
      "palm_tree",  "pear",          "pickup_truck", "pine_tree", "plain",      "plate",       "poppy",
      "porcupine",  "possum",        "rabbit",     "raccoon",    "ray",         "road",        "rocket",
      "rose",       "sea",           "seal",       "shark",      "shrew",       "skunk",       "skyscraper",
      "snail",      "snake",         "spider",     "squirrel",   "streetcar",   "sunflower",   "sweet_pepper",
      "table",      "tank",          "telephone",  "television", "tiger",       "tractor",     "train",
      "trout",      "tulip",         "turtle",     "wardrobe",   "whale",       "willow_tree", "wolf",
      "woman",      "worm"};
  return names;
}

DatasetFacts square(DatasetKind kind, int64_t side, int64_t channels, std::vector<std::string> names) {
  DatasetFacts f;
  f.name = dataset_name(kind);
  f.height = f.width = side;
  f.channels = channels;
  f.classes = static_cast<int>(names.size());
  f.class_names = std::move(names);
  f.norm = normalization_of(kind);
  return f;
}

}  // namespace

DatasetFacts dataset_facts(const std::string& name, int64_t image_size, const std::vector<std::string>& shard_classes) {
  DatasetKind kind{};
  HPC_REQUIRE(find_dataset(name, &kind), "unknown dataset '", name,
              "' (choose fashion-mnist, mnist, cifar10, cifar100, shards or synthetic)");
  if (kind == DatasetKind::FashionMnist) return square(kind, 28, 1, fashion_mnist_names());
  if (kind == DatasetKind::Mnist) return square(kind, 28, 1, mnist_names());
  if (kind == DatasetKind::Cifar10) return square(kind, 32, 3, cifar10_names());
  if (kind == DatasetKind::Cifar100) return square(kind, 32, 3, cifar100_names());
  const int64_t side = image_size > 0 ? image_size : 224;
  if (kind == DatasetKind::Synthetic) {
    DatasetFacts f = square(kind, side, 3, {});
    f.classes = kSyntheticClasses;
    return f;
  }
  HPC_CHECK(!shard_classes.empty(), "packed shards need their class names from the caller");
  DatasetFacts f = square(kind, side, 3, shard_classes);
  f.crop_fraction = kEvaluationCrop;
  return f;
}

}  // namespace hpc::data
