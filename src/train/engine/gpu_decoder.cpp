// The GPU's JPEG decoder for packed shards (--jpeg-decode gpu), as NVIDIA DALI decodes: the
// loader's threads read the records and draw each sample's view (data::BatchAssembler, the same
// draws as the CPU path), nvJPEG decodes the batch (batched; the hardware decoder where the GPU
// has one, else the CUDA one) into device memory, and kernels::resized_crop_normalize crops,
// resizes, flips and normalises it into the batch's floats (Batch::decoded).
//
// Threads and streams (DESIGN.md principle 6): decode() runs on the loader's thread, on a stream
// of its own, and waits for that stream before it returns, so a batch handed to the engine is
// complete and the engine's copy of it (on its compute stream, gpu_engine.cpp's stage) needs no
// event. The loader reuses a batch (and this decoder its output buffer) only after the consumer
// asked for the next one, and the engine's step ends with a wait for its stream: its copy is done
// by then. The decoder's memory is its own (cuda_memory.hpp), grown, never shrunk.
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "core/log.hpp"
#include "data/nvjpeg.hpp"
#include "kernels/kernels.hpp"
#include "train/engine/cuda_memory.hpp"
#include "train/engine/engine.hpp"

namespace hpc::train {
namespace {

namespace nv = data::nvjpeg;

// One nvJPEG handle for one backend and its batched-decode state.
class NvjpegHandle {
 public:
  NvjpegHandle(const data::NvjpegLibrary& lib, int backend) : lib_(lib) {
    status_ = lib_.create_ex(backend, nullptr, nullptr, 0, &handle_);
    if (status_ != nv::kSuccess) {
      handle_ = nullptr;
      return;
    }
    status_ = lib_.state_create(handle_, &state_);
    if (status_ != nv::kSuccess) state_ = nullptr;
  }
  ~NvjpegHandle() {
    if (state_) lib_.state_destroy(state_);
    if (handle_) lib_.destroy(handle_);
  }
  NvjpegHandle(const NvjpegHandle&) = delete;
  NvjpegHandle& operator=(const NvjpegHandle&) = delete;
  bool ok() const { return state_ != nullptr; }
  int status() const { return status_; }
  nv::Handle handle() const { return handle_; }

  // The n images into out[i] (interleaved RGB) on stream; nvJPEG's status.
  int decode(const unsigned char* const* data, const size_t* lengths, nv::Image* out, int n, cudaStream_t stream) {
    if (n != batch_) {  // nvJPEG initialises for one batch size, and again after a failed batch
      const int s = lib_.batched_initialize(handle_, state_, n, 1, nv::kOutputRgbi);
      if (s != nv::kSuccess) return s;
      batch_ = n;
    }
    const int s = lib_.decode_batched(handle_, state_, data, lengths, out, stream);
    if (s != nv::kSuccess) batch_ = 0;
    return s;
  }

 private:
  const data::NvjpegLibrary& lib_;
  nv::Handle handle_ = nullptr;
  nv::State state_ = nullptr;
  int status_ = nv::kSuccess;
  int batch_ = 0;
};

class GpuBatchDecoder final : public data::BatchDecoder {
 public:
  // Every CUDA and nvJPEG call of the decoder's is made holding device::exclude_capture: its
  // buffers and nvJPEG's (default allocators) grow with cudaFree and cudaFreeHost, which could
  // invalidate a step being captured on the main thread meanwhile.
  explicit GpuBatchDecoder(int gpu) : gpu_(gpu) {
    const auto excluded = device::exclude_capture();
    std::string why;
    lib_ = data::NvjpegLibrary::load_installed(&why);
    HPC_REQUIRE(lib_, "--jpeg-decode gpu: ", why);
    CUDA_CHECK(cudaSetDevice(gpu_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    hardware_ = std::make_unique<NvjpegHandle>(*lib_, nv::kBackendHardware);
    if (!hardware_->ok()) {
      log::info("JPEG decode on the GPU with nvJPEG's CUDA decoder (no hardware decoder: ",
                nv::status_name(hardware_->status()), ")");
      hardware_.reset();
      cuda();
    } else {
      log::info("JPEG decode on the GPU with nvJPEG's hardware decoder");
    }
  }
  ~GpuBatchDecoder() override {
    const auto excluded = device::exclude_capture();
    // A decode that failed partway may have left work on the stream: done before its state goes.
    if (stream_) cudaStreamSynchronize(stream_);
    hardware_.reset();
    cuda_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }

  void decode(data::Batch& b) override {
    const auto excluded = device::exclude_capture();
    CUDA_CHECK(cudaSetDevice(gpu_));  // the loader's thread: its current device is its own
    const auto n = static_cast<int>(b.jpeg_samples.size());
    HPC_CHECK(n > 0 && b.jpeg.size() == b.jpeg_samples.size() && b.table && b.table->size() == 3 * 256,
              "a batch of ", n, " JPEG samples without its files or table");
    lay_out(b);
    nv::Image* out = images_.data();
    if (!hardware_ || !try_decode(*hardware_, out, n)) {
      const int s = cuda().decode(data_.data(), lengths_.data(), out, n, stream_);
      HPC_REQUIRE(s == nv::kSuccess, "nvJPEG cannot decode the batch of epoch ", b.epoch, " step ", b.step, ": ",
                  nv::status_name(s), "; --jpeg-decode cpu names a damaged record");
    }
    crop(b);
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // the batch is complete when handed over (see the top)
  }

 private:
  // The CUDA backend, made when first needed.
  NvjpegHandle& cuda() {
    if (!cuda_) {
      cuda_ = std::make_unique<NvjpegHandle>(*lib_, nv::kBackendDefault);
      HPC_REQUIRE(cuda_->ok(), "--jpeg-decode gpu: nvJPEG cannot start its decoder: ",
                  nv::status_name(cuda_->status()));
    }
    return *cuda_;
  }

  // The hardware decoder refuses some files (progressive ones): such a batch is decoded again by
  // the CUDA decoder, said once.
  bool try_decode(NvjpegHandle& h, nv::Image* out, int n) {
    const int s = h.decode(data_.data(), lengths_.data(), out, n, stream_);
    if (s == nv::kSuccess) return true;
    if (!warned_)
      log::info("nvJPEG's hardware decoder refused a batch (", nv::status_name(s),
                "): such batches are decoded by its CUDA decoder");
    warned_ = true;
    return false;
  }

  // Where each image is decoded to: one block, each image's rows 3 x width bytes apart, aligned
  // to 256 bytes. The dimensions nvJPEG reads must be those the views were drawn for (a guard for
  // the buffers too).
  void lay_out(const data::Batch& b) {
    const size_t n = b.jpeg_samples.size();
    data_.resize(n);
    lengths_.resize(n);
    offsets_.resize(n);
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      const data::JpegSample& s = b.jpeg_samples[i];
      data_[i] = b.jpeg[i].data();
      lengths_[i] = b.jpeg[i].size();
      int components = 0, subsampling = 0, widths[nv::kMaxComponent] = {}, heights[nv::kMaxComponent] = {};
      const int st = lib_->image_info(info_handle(), data_[i], lengths_[i], &components, &subsampling, widths, heights);
      HPC_REQUIRE(st == nv::kSuccess && widths[0] == s.width && heights[0] == s.height, "nvJPEG reads sample ", i,
                  " of the batch of epoch ", b.epoch, " step ", b.step, " as ", widths[0], "x", heights[0], " (",
                  nv::status_name(st), "), libjpeg-turbo as ", s.width, "x", s.height,
                  "; --jpeg-decode cpu decodes it");
      offsets_[i] = total;
      total += (static_cast<size_t>(s.height * s.width * 3) + 255) / 256 * 256;
    }
    auto* base = static_cast<unsigned char*>(decoded_.get(total));
    images_.assign(n, nv::Image{});
    for (size_t i = 0; i < n; ++i) {
      images_[i].channel[0] = base + offsets_[i];
      images_[i].pitch[0] = static_cast<size_t>(b.jpeg_samples[i].width * 3);
    }
  }

  nv::Handle info_handle() { return hardware_ ? hardware_->handle() : cuda().handle(); }

  // The views resampled and normalised into this batch's output.
  void crop(data::Batch& b) {
    const size_t n = b.jpeg_samples.size();
    if (*b.table != table_host_) {
      table_host_ = *b.table;
      CUDA_CHECK(cudaMemcpyAsync(table_.get(table_host_.size() * sizeof(float)), table_host_.data(),
                                 table_host_.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
    }
    crops_host_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const data::JpegSample& s = b.jpeg_samples[i];
      crops_host_[i] = {images_[i].channel[0], s.width * 3, static_cast<int32_t>(s.height),
                        static_cast<int32_t>(s.width), s.view.y0, s.view.x0, s.view.h, s.view.w, s.view.flip ? 1 : 0};
    }
    void* crops = crops_.get(n * sizeof(kernels::ResizedCrop));
    CUDA_CHECK(cudaMemcpyAsync(crops, crops_host_.data(), n * sizeof(kernels::ResizedCrop), cudaMemcpyHostToDevice,
                               stream_));
    const int64_t side = b.jpeg_side;
    auto* out = static_cast<float*>(outputs_[&b].get(n * static_cast<size_t>(side * side * 3) * sizeof(float)));
    kernels::resized_crop_normalize(static_cast<const kernels::ResizedCrop*>(crops), static_cast<int64_t>(n), side,
                                    out, static_cast<const float*>(table_.get(0)), stream_);
    b.decoded = out;
  }

  int gpu_;
  std::unique_ptr<data::NvjpegLibrary> lib_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<NvjpegHandle> hardware_, cuda_;
  bool warned_ = false;
  std::vector<const unsigned char*> data_;
  std::vector<size_t> lengths_, offsets_;
  std::vector<nv::Image> images_;
  DeviceBuffer decoded_, table_, crops_;
  std::vector<float> table_host_;
  std::vector<kernels::ResizedCrop> crops_host_;  // read by the copy until the stream's wait
  std::map<const data::Batch*, DeviceBuffer> outputs_;  // one per batch of the loader's pool
};

}  // namespace

std::unique_ptr<data::BatchDecoder> make_gpu_decoder(int gpu) { return std::make_unique<GpuBatchDecoder>(gpu); }

}  // namespace hpc::train
