#include "data/loader.hpp"

#include <algorithm>
#include <exception>
#include <chrono>
#include <cstring>
#include <optional>
#include <type_traits>

#include "core/rng.hpp"
#include "data/shard_images.hpp"

namespace hpc::data {

BatchAssembler::BatchAssembler(const Dataset& ds, const Normalization& norm, AugmentSpec aug, uint64_t seed,
                               int threads, bool bytes, bool jpeg)
    : ds_(ds),
      aug_(aug),
      seed_(seed),
      threads_(std::max(1, threads)),
      bytes_(bytes),
      jpeg_(jpeg && bytes && ds.shards) {
  HPC_CHECK(static_cast<int64_t>(norm.mean.size()) == ds.channels && norm.std.size() == norm.mean.size(),
            "normalisation has ", norm.mean.size(), " channels, dataset ", ds.channels);
  table_.resize(ds.channels * 256);
  for (int64_t c = 0; c < ds.channels; ++c)
    for (int v = 0; v < 256; ++v)
      table_[c * 256 + v] = (static_cast<float>(v) / 255.0f - norm.mean[c]) / norm.std[c];
}

template <class T, class Put>
void BatchAssembler::assemble_shards(const std::vector<uint32_t>& indices, int64_t epoch, bool augment, T* dst,
                                     Put put) const {
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t c = ds_.channels, per = ds_.sample_bytes();
  std::exception_ptr error;
  // Decoding dominates: the batch's images are decoded in parallel, each keyed by its own
  // (seed, epoch, index) stream, so the result does not depend on the number of threads.
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    try {
      const uint32_t idx = indices[static_cast<size_t>(i)];
      T* o = dst + i * per;
      // Bytes are decoded straight into the batch; floats through this thread's buffer.
      uint8_t* pixels;
      thread_local std::vector<uint8_t> buffer;
      if constexpr (std::is_same_v<T, uint8_t>) {
        pixels = o;
      } else {
        buffer.resize(static_cast<size_t>(per));
        pixels = buffer.data();
      }
      if (augment && aug_.resized_crop) {
        Philox rng(seed_, RngStream::Augment, static_cast<uint64_t>(epoch), idx);
        ds_.shards->fill(idx, &rng, aug_.flip, pixels);
      } else {
        ds_.shards->fill(idx, nullptr, false, pixels);
      }
      if constexpr (!std::is_same_v<T, uint8_t>)
        for (int64_t p = 0; p < per; ++p) o[p] = put(p % c, pixels[p]);
    } catch (...) {
#pragma omp critical
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void BatchAssembler::assemble_jpeg(const std::vector<uint32_t>& indices, int64_t epoch, bool augment,
                                   Batch& out) const {
  const auto n = static_cast<int64_t>(indices.size());
  out.jpeg.resize(static_cast<size_t>(n));  // each keeps its capacity from batch to batch
  out.jpeg_samples.assign(static_cast<size_t>(n), {});
  out.jpeg_side = ds_.shards->size();
  std::exception_ptr error;
  // Reading and the header's dimensions only (the views are drawn as ShardImages::fill draws them).
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 4)
  for (int64_t i = 0; i < n; ++i) {
    try {
      const uint32_t idx = indices[static_cast<size_t>(i)];
      JpegSample& s = out.jpeg_samples[static_cast<size_t>(i)];
      std::optional<Philox> rng;
      if (augment && aug_.resized_crop) rng.emplace(seed_, RngStream::Augment, static_cast<uint64_t>(epoch), idx);
      ds_.shards->jpeg(idx, rng ? &*rng : nullptr, rng && aug_.flip, out.jpeg[static_cast<size_t>(i)], s.height,
                       s.width, s.view);
    } catch (...) {
#pragma omp critical
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

namespace {

// The crop and flip of sample idx in epoch (its own stream: the same on every rank and thread).
CropFlip draw_crop_flip(const AugmentSpec& aug, uint64_t seed, int64_t epoch, uint32_t idx) {
  Philox rng(seed, RngStream::Augment, static_cast<uint64_t>(epoch), idx);
  const int64_t pad = aug.crop_padding;
  CropFlip cf;
  if (pad) {
    const auto span = static_cast<uint32_t>(2 * pad + 1);
    cf.dy = static_cast<int32_t>(rng.below(span)) - static_cast<int32_t>(pad);
    cf.dx = static_cast<int32_t>(rng.below(span)) - static_cast<int32_t>(pad);
  }
  cf.flip = aug.flip && (rng.next_u32() & 1u) ? 1 : 0;
  return cf;
}

// One h x w x c sample cropped and flipped into o through put(channel, byte).
template <class T, class Put>
void crop_flip(const uint8_t* src, int64_t h, int64_t w, int64_t c, CropFlip cf, T* o, Put put) {
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      const int64_t sy = y + cf.dy, sx = (cf.flip ? w - 1 - x : x) + cf.dx;
      T* px = o + (y * w + x) * c;
      const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
      for (int64_t ch = 0; ch < c; ++ch)  // padding is a black pixel, normalised like any other
        px[ch] = put(ch, inside ? src[(sy * w + sx) * c + ch] : uint8_t{0});
    }
  }
}

}  // namespace

Tensor apply_crops(const Batch& batch) {
  HPC_CHECK(batch.images.dtype() == DType::U8 && batch.images.shape().rank() == 4, "apply_crops of a batch of ",
            dtype_name(batch.images.dtype()), " ", batch.images.shape().str());
  const Shape& s = batch.images.shape();
  Tensor out(s, DType::U8);
  const int64_t n = s[0], h = s[1], w = s[2], c = s[3], per = h * w * c;
  const uint8_t* src = batch.images.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  if (batch.crops.empty()) {
    std::memcpy(dst, src, static_cast<size_t>(n * per));
    return out;
  }
  HPC_CHECK(static_cast<int64_t>(batch.crops.size()) == n, batch.crops.size(), " crops for ", n, " samples");
  for (int64_t i = 0; i < n; ++i)
    crop_flip(src + i * per, h, w, c, batch.crops[static_cast<size_t>(i)], dst + i * per,
              [](int64_t, uint8_t v) { return v; });
  return out;
}

template <class T, class Put>
void BatchAssembler::assemble_memory(const std::vector<uint32_t>& indices, int64_t epoch, bool augment, T* dst,
                                     Put put, std::vector<CropFlip>* crops) const {
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t h = ds_.height, w = ds_.width, c = ds_.channels, per = ds_.sample_bytes();
  const bool cropped = augment && aug_.any();
  if (crops) crops->resize(cropped ? static_cast<size_t>(n) : 0);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t idx = indices[i];
    const uint8_t* src = ds_.images.data() + static_cast<int64_t>(idx) * per;
    T* o = dst + i * per;
    if (!cropped || crops) {  // as stored (the consumer crops what it is told to)
      if (cropped) (*crops)[static_cast<size_t>(i)] = draw_crop_flip(aug_, seed_, epoch, idx);
      if (c == 1) {
        for (int64_t p = 0; p < per; ++p) o[p] = put(0, src[p]);
      } else {
        for (int64_t p = 0; p < per; ++p) o[p] = put(p % c, src[p]);
      }
      continue;
    }
    crop_flip(src, h, w, c, draw_crop_flip(aug_, seed_, epoch, idx), o, put);
  }
}

void BatchAssembler::assemble(const std::vector<uint32_t>& indices, int64_t epoch, bool augment,
                              Batch& out) const {
  const int64_t n = static_cast<int64_t>(indices.size());
  const Shape shape{n, ds_.height, ds_.width, ds_.channels};
  out.labels.resize(n);
  for (int64_t i = 0; i < n; ++i) out.labels[i] = ds_.labels[indices[i]];
  out.decoded = nullptr;
  if (jpeg_) {  // the decoder decodes them into out.decoded
    out.images = Tensor();
    out.table = &table_;
    out.crops.clear();
    assemble_jpeg(indices, epoch, augment, out);
    return;
  }
  out.jpeg.clear();
  out.jpeg_samples.clear();
  if (bytes_) {  // in page-locked memory where there is a GPU: it copies the batch from there
    if (out.images.defined()) out.images.resize<uint8_t>(shape);
    else out.images = Tensor::pinned(shape, DType::U8);
    out.table = &table_;
    auto put = [](int64_t, uint8_t v) { return v; };
    out.crops.clear();
    if (ds_.shards) assemble_shards(indices, epoch, augment, out.images.data<uint8_t>(), put);
    else assemble_memory(indices, epoch, augment, out.images.data<uint8_t>(), put, &out.crops);
    return;
  }
  out.images.resize<float>(shape);
  out.table = nullptr;
  out.crops.clear();
  const float* table = table_.data();
  auto put = [table](int64_t ch, uint8_t v) { return table[ch * 256 + v]; };
  if (ds_.shards) assemble_shards(indices, epoch, augment, out.images.data<float>(), put);
  else assemble_memory(indices, epoch, augment, out.images.data<float>(), put);
}

Loader::Loader(const Dataset& ds, const Normalization& norm, AugmentSpec aug, ShardedSampler sampler,
               uint64_t seed, int depth, int threads, bool bytes, BatchDecoder* decoder, int64_t epochs)
    : assembler_(ds, norm, aug, seed, threads, bytes, decoder != nullptr),
      decoder_(decoder),
      sampler_(std::move(sampler)),
      augment_(aug.any()),
      epochs_(epochs),
      // With a decoder, a slot more: one being read while another is decoded.
      pool_(static_cast<size_t>(depth + (decoder ? 1 : 0))) {}

Loader::~Loader() { stop(); }

void Loader::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (producer_.joinable()) producer_.join();
  if (decoding_.joinable()) decoding_.join();
}

void Loader::start_epoch(int64_t epoch, int64_t first_step) {
  {
    std::lock_guard lock(mu_);
    if (first_step == 0 && epoch == continues_at_) {  // its batches are on their way already
      at_end_ = false;
      continues_at_ = -1;
      return;
    }
  }
  stop();
  free_.clear();
  made_.clear();
  ready_.clear();
  for (int i = 0; i < static_cast<int>(pool_.size()); ++i) free_.push_back(i);
  in_use_ = continues_at_ = -1;
  at_end_ = made_all_ = done_ = stop_ = false;
  error_ = decode_error_ = nullptr;
  producer_ = std::thread([this, epoch, first_step] { produce(epoch, first_step); });
  if (decoder_) decoding_ = std::thread([this] { decode_all(); });
}

// The first thread: the epochs' batches, from epoch's first_step on, each one's samples read (and,
// without a decoder, decoded) into a free slot.
void Loader::produce(int64_t epoch, int64_t first_step) {
  try {
    for (int64_t e = epoch; make_epoch(e, e == epoch ? first_step : 0) && goes_on_after(e); ++e) {
    }
  } catch (...) {
    failed();
  }
  std::lock_guard lock(mu_);
  made_all_ = true;
  if (!decoder_) done_ = true;
  cv_.notify_all();
}

// Epoch e's batches from first_step on, then its end; false: stopped (or the decoder failed).
bool Loader::make_epoch(int64_t e, int64_t first_step) {
  std::deque<Item>& out = decoder_ ? made_ : ready_;
  for (int64_t s = first_step; s < sampler_.steps_per_epoch(); ++s) {
    int slot;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || error_ || !free_.empty(); });
      if (stop_ || error_) return false;
      slot = free_.front();
      free_.pop_front();
    }
    // The sampler is used by this thread only while it runs.
    assembler_.assemble(sampler_.indices(e, s), e, augment_, pool_[slot]);
    pool_[slot].epoch = e;
    pool_[slot].step = s;
    pass_on(out, {slot, e});
  }
  pass_on(out, {-1, e});
  return true;
}

// The second thread, with a decoder: the batches made, decoded in order.
void Loader::decode_all() {
  try {
    for (Item item{}; take_made(item);) {
      if (item.slot >= 0 && !pool_[item.slot].jpeg_samples.empty()) decoder_->decode(pool_[item.slot]);
      pass_on(ready_, item);
    }
  } catch (...) {
    failed(true);
  }
  std::lock_guard lock(mu_);
  done_ = true;
  cv_.notify_all();
}

// The decoder's next item; false: none will come (or the loader stops). After the producer
// failed, the batches it read before are still decoded: they go to the consumer ahead of the error.
bool Loader::take_made(Item& item) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return stop_ || !made_.empty() || made_all_; });
  if (stop_ || made_.empty()) return false;
  item = made_.front();
  made_.pop_front();
  return true;
}

void Loader::pass_on(std::deque<Item>& to, Item item) {
  {
    std::lock_guard lock(mu_);
    to.push_back(item);
  }
  cv_.notify_all();
}

void Loader::failed(bool decoding) {
  std::lock_guard lock(mu_);
  if (!error_) error_ = std::current_exception();
  if (decoding) decode_error_ = std::current_exception();
  cv_.notify_all();
}

const Batch* Loader::next() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lock(mu_);
  if (in_use_ >= 0) {  // the consumer is done with the previous batch
    free_.push_back(in_use_);
    in_use_ = -1;
    cv_.notify_all();
  }
  if (at_end_) return nullptr;
  // Errors in their batch's place: a batch read ahead (the next epoch's, while this one ends)
  // that cannot be read or decoded fails the step that would take it, not the steps, the
  // evaluation and the checkpoint before it. Every thread that fails sets done_ as it ends.
  cv_.wait(lock, [&] { return !ready_.empty() || done_; });
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (ready_.empty()) {
    // The decoder takes the batches in order behind the reader: its failure is of the earlier batch.
    if (decode_error_) std::rethrow_exception(decode_error_);
    if (error_) std::rethrow_exception(error_);
    at_end_ = true;  // (stopped: not reached while an epoch runs)
    return nullptr;
  }
  const Item item = ready_.front();
  ready_.pop_front();
  if (item.slot < 0) {  // the epoch's end; the next epoch's batches follow where the producer goes on
    at_end_ = true;
    if (goes_on_after(item.epoch)) continues_at_ = item.epoch + 1;
    return nullptr;
  }
  in_use_ = item.slot;
  return &pool_[in_use_];
}

}  // namespace hpc::data
