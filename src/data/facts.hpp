// What a model trained on a dataset needs to know of it at inference time, without reading
// its files: the shape of a sample, the number of classes and their names, the normalisation
// and how evaluation frames an image. `hpctrain export` writes these into the ONNX metadata and
// `hpctrain predict` prepares the user's images by them, on machines that hold no dataset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.hpp"

namespace hpc::data {

struct DatasetFacts {
  std::string name;
  int64_t height = 0, width = 0, channels = 0;
  int classes = 0;
  std::vector<std::string> class_names;  // empty where the dataset has none (synthetic)
  Normalization norm;
  // Evaluation's framing of an image of another size: packed shards take the centre crop of
  // 7/8 of the shorter side (shard_images.hpp); the fixed-size datasets, whose test images
  // already have the model's size, the centre square (the whole image when it is square).
  double crop_fraction = 1.0;
};

// The facts of a dataset as a checkpoint names it. image_size: the side of packed shards and
// synthetic images (0: 224). shard_classes: packed shards' class names (the checkpoint's record, or
// an older checkpoint's data directory's classes.txt), which only they need; the other datasets'
// are fixed.
DatasetFacts dataset_facts(const std::string& name, int64_t image_size,
                           const std::vector<std::string>& shard_classes = {});

}  // namespace hpc::data
