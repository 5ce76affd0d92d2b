// Dataset files as hpctrain loads them (data/dataset.hpp): IDX image and label files (MNIST,
// Fashion-MNIST), raw or gzip-compressed (gunzipped by ISA-L), and CIFAR-10 and CIFAR-100 binary
// batches. The first byte picks the reader; for IDX the next two say where the image file's
// bytes end and the label file's begin.
#include <cstdint>
#include <span>

#include "contract.hpp"
#include "data/dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hpc;
  if (size < 3) return 0;
  const int reader = data[0] % 3;
  const size_t split = std::min<size_t>(size - 3, size_t{data[1]} | (size_t{data[2]} << 8));
  const std::span<const uint8_t> rest(data + 3, size - 3);
  const fuzz::Scratch& scratch = fuzz::Scratch::get();
  fuzz::usage_error_or_success([&] {
    if (reader == 0) {
      const std::string images = scratch.write("train-images-idx3-ubyte.gz", rest.first(split));
      const std::string labels = scratch.write("train-labels-idx1-ubyte.gz", rest.subspan(split));
      (void)data::read_idx(images, labels, 28, 28, 10);
    } else {
      const std::string batch = scratch.write("data_batch_1.bin", rest);
      (void)(reader == 1 ? data::read_cifar10({batch}) : data::read_cifar100({batch}));
    }
  });
  return 0;
}
