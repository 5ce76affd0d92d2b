// Image files as hpcdata pack and hpctrain predict read them (data/image_file.hpp, data/jpeg.hpp):
// the JPEG header alone (the shard reader's size check), a whole decode by libjpeg-turbo or
// libpng through hpctrain's wrappers, and what is done with a decoded image (resized and framed
// for a 28x28 grey model, and for packed shards' 64x64 model with its 7/8 centre crop, as
// predict frames its inputs).
#include <cstdint>
#include <span>
#include <vector>

#include "contract.hpp"
#include "data/facts.hpp"
#include "data/image_file.hpp"
#include "data/jpeg.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hpc;
  const std::span<const uint8_t> bytes(data, size);
  fuzz::usage_error_or_success([&] {
    int64_t h = 0, w = 0;
    data::jpeg_size(bytes, "fuzz.jpg", h, w);
  });
  data::Image image;
  const bool png = size >= 8 && data[0] == 0x89 && data[1] == 'P';
  const bool decoded = fuzz::usage_error_or_success([&] {
    image = png ? data::decode_png(bytes, "fuzz.png") : data::decode_jpeg(bytes, "fuzz.jpg");
  });
  if (!decoded) return 0;
  fuzz::usage_error_or_success([&] {
    for (const data::DatasetFacts& facts : {data::dataset_facts("fashion-mnist", 0), data::dataset_facts("shards", 64, {"a", "b"})}) {
      std::vector<uint8_t> out(static_cast<size_t>(facts.height * facts.width * facts.channels));
      data::frame_for_model(image, facts, out.data());
    }
  });
  return 0;
}
