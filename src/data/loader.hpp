// Batches as the model wants them: float NHWC, normalised, augmented, with int32 labels.
// The Loader builds the next batches on a prefetch thread (and decodes packed JPEGs on a second,
// with a BatchDecoder) while the model trains on the current one, on into the next epoch;
// augmentation randomness is keyed by (seed, epoch, sample index), so the same sample is
// augmented identically whichever rank, thread or run reads it.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/tensor.hpp"
#include "data/dataset.hpp"
#include "data/sampler.hpp"
#include "data/shard_images.hpp"

namespace hpc::data {

struct AugmentSpec {
  int64_t crop_padding = 0;   // random crop of the original size from the image padded by this
  bool flip = false;          // horizontal flip with probability 1/2
  bool resized_crop = false;  // packed shards: random resized crop (else the centre crop)
  bool any() const { return crop_padding > 0 || flip || resized_crop; }
};

// One sample's random crop and flip: output pixel (y, x) is source pixel
// (y + dy, (flip ? w - 1 - x : x) + dx), black where that falls outside the image. Three
// int32 in a row, as kernels::crop_flip_normalize_u8 reads them.
struct CropFlip {
  int32_t dy = 0, dx = 0, flip = 0;
};
static_assert(sizeof(CropFlip) == 3 * sizeof(int32_t));

// A packed sample left for the GPU to decode (--jpeg-decode gpu): the image's dimensions (from its
// JPEG header) and the view of it the model is given, drawn on the loader's thread from the
// sample's own stream exactly as the CPU path draws it (ShardImages::fill).
struct JpegSample {
  int64_t height = 0, width = 0;
  View view;
};

struct Batch {
  // n x H x W x C: normalised floats (F32), or, from an assembler asked for bytes, the samples'
  // bytes (U8) with `table` the normalisation that the consumer applies (the GPU does it).
  Tensor images;
  std::vector<int32_t> labels;  // n
  int64_t epoch = 0, step = 0;
  const std::vector<float>* table = nullptr;  // bytes: BatchAssembler::table()
  // Bytes of an in-memory dataset, augmented: each sample's crop and flip, which the consumer
  // applies (images then hold the samples as stored). Empty: images are final.
  std::vector<CropFlip> crops;
  // Packed shards for a BatchDecoder (the loader's `decoder`): each sample's JPEG file and its
  // view (images is then empty), and the side of the square images they become.
  std::vector<std::vector<uint8_t>> jpeg;
  std::vector<JpegSample> jpeg_samples;
  int64_t jpeg_side = 0;
  // Once decoded: the images, size() x jpeg_side x jpeg_side x 3 normalised floats (NHWC) in the
  // decoder's device memory, valid until it decodes into this batch again.
  const float* decoded = nullptr;
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

// Decodes the JPEG samples of a batch (Batch::jpeg) into its images where the consumer wants them:
// the GPU's nvJPEG decoder (train/engine/gpu_decoder.cpp), which leaves the batch's normalised floats in
// device memory. The loader's decoding thread calls it for each batch, in order, before handing the
// batch over, so decoding overlaps the consumer's steps on earlier batches and the reading of the
// next batch, as DALI's pipeline stages do.
class BatchDecoder {
 public:
  virtual ~BatchDecoder() = default;
  // On return, batch.decoded holds the decoded images, ready to read (no work left in flight).
  virtual void decode(Batch& batch) = 0;
};

// A batch of bytes with its crops applied on the host: what the GPU computes before its table
// (the reference its kernel is tested against). Without crops, a copy.
Tensor apply_crops(const Batch& batch);

// Turns uint8 samples into normalised floats (a 256-entry table per channel), or, with
// bytes, into batches of bytes that a GPU normalises (a quarter of the data to copy, and no
// float pass on the host). With bytes, in-memory datasets leave the crops and flips to the
// GPU too (Batch::crops), drawn from the same streams as on the host: either path gives the
// same floats. Packed shards crop while they decode, so their bytes come cropped.
class BatchAssembler {
 public:
  // threads: how many decode packed images in parallel (in-memory datasets need none). jpeg (with
  // bytes, for packed shards): the samples' JPEG files and views instead (Batch::jpeg), for a
  // BatchDecoder to decode.
  BatchAssembler(const Dataset& ds, const Normalization& norm, AugmentSpec aug, uint64_t seed, int threads = 1,
                 bool bytes = false, bool jpeg = false);
  // Fills out with the given samples; augmentation (if any) is keyed by (seed, epoch, index).
  void assemble(const std::vector<uint32_t>& indices, int64_t epoch, bool augment, Batch& out) const;
  // byte value -> normalised float, channels x 256 (the GPU path normalises with the same
  // table: kernels::normalize_u8).
  const std::vector<float>& table() const { return table_; }

 private:
  // T: float or uint8_t; put(channel, byte) is what the batch stores.
  template <class T, class Put>
  void assemble_shards(const std::vector<uint32_t>& indices, int64_t epoch, bool augment, T* dst, Put put) const;
  // crops: where the consumer crops and flips (the samples are copied as stored), else null.
  void assemble_jpeg(const std::vector<uint32_t>& indices, int64_t epoch, bool augment, Batch& out) const;
  template <class T, class Put>
  void assemble_memory(const std::vector<uint32_t>& indices, int64_t epoch, bool augment, T* dst, Put put,
                       std::vector<CropFlip>* crops = nullptr) const;
  const Dataset& ds_;
  AugmentSpec aug_;
  uint64_t seed_;
  int threads_;
  bool bytes_, jpeg_;
  std::vector<float> table_;  // channels x 256
};

class Loader {
 public:
  // bytes: batches of bytes for a GPU to normalise (BatchAssembler). decoder (packed shards, with
  // bytes): decodes each batch's JPEGs on a thread of its own, the next batch being read meanwhile
  // (it must outlive the loader). epochs: how many the run has; after an epoch's last batch the
  // loader goes on with the next epoch's (up to the last), so that the first step of an epoch
  // does not wait for its batch while the previous epoch ends (evaluation, checkpoint). 0: one
  // epoch at a time.
  Loader(const Dataset& ds, const Normalization& norm, AugmentSpec aug, ShardedSampler sampler, uint64_t seed,
         int depth = 3, int threads = 1, bool bytes = false, BatchDecoder* decoder = nullptr, int64_t epochs = 0);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts producing the batches of `epoch` from step `first_step` on (resume starts mid-epoch).
  // The epoch that follows the one just ended, from its first step, keeps what was made ahead.
  void start_epoch(int64_t epoch, int64_t first_step = 0);
  // The next batch of the epoch, or nullptr after its last one (until start_epoch). The batch
  // stays valid until the next call. Time spent waiting here is the data-wait time.
  const Batch* next();
  int64_t steps_per_epoch() const { return sampler_.steps_per_epoch(); }
  double wait_seconds() const { return wait_seconds_; }

 private:
  // A batch of pool_, or (slot -1) the end of an epoch's batches.
  struct Item {
    int slot;
    int64_t epoch;
  };
  void stop();
  // Whether the producer goes on past epoch e's end (and start_epoch(e + 1) keeps its batches).
  bool goes_on_after(int64_t e) const { return e + 1 < epochs_; }
  void produce(int64_t epoch, int64_t first_step);
  bool make_epoch(int64_t epoch, int64_t first_step);
  void decode_all();
  bool take_made(Item& item);
  void pass_on(std::deque<Item>& to, Item item);
  void failed(bool decoding = false);

  BatchAssembler assembler_;
  BatchDecoder* decoder_;
  ShardedSampler sampler_;
  bool augment_;
  int64_t epochs_;
  std::vector<Batch> pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_: slots free for the producer; batches made, waiting for the decoder (with one);
  // batches ready for the consumer, in order, each epoch's followed by its end.
  std::deque<int> free_;
  std::deque<Item> made_, ready_;
  int in_use_ = -1;             // batch handed to the consumer
  bool at_end_ = true;          // the consumer has had its epoch's end: next() gives nullptr
  int64_t continues_at_ = -1;   // the epoch whose batches follow in ready_ (start_epoch keeps them)
  bool made_all_ = false, done_ = false, stop_ = false;  // producer ended; last stage ended; asked to stop
  std::exception_ptr error_;         // the first failure of either thread: both stop
  std::exception_ptr decode_error_;  // the decoder's: of an earlier batch than the reader's, if both failed
  std::thread producer_, decoding_;
  double wait_seconds_ = 0;
};

}  // namespace hpc::data
