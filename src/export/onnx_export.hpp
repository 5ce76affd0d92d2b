// A model of the zoo as an ONNX graph in inference form, built with Debian's libonnx (the ONNX
// project's own protobuf classes and checker), never by hand.
//
// The graph takes `input`, float32 N x C x H x W (NCHW, as every ONNX runtime expects; N is
// dynamic): the pixel values 0..255, RGB or grey. Its first two nodes normalise them the way
// training did ((x / 255 - mean) / std per channel, as Mul and Add); its output `logits` is
// N x classes. Batch norm is a BatchNormalization node with the running statistics, or, with
// fold_batch_norm, folded into the convolution or linear layer before it. hpctrain computes in
// NHWC: convolution weights are transposed to OIHW, and the first linear layer after a flatten
// has its columns reordered from HWC to CHW, so the graph computes the same function.
//
// Every attribute is written, also those ONNX calls optional (kernel_shape, strides, pads on
// Conv and MaxPool; alpha, beta, transA, transB on Gemm; epsilon on BatchNormalization): some
// runtimes' importers (OpenCV 4.6's) need them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "data/dataset.hpp"
#include "nn/model.hpp"

namespace hpc::onnx_export {

// Opset 13: what ONNX Runtime, TensorRT and OpenCV's importer all read.
constexpr int kOpset = 13;
constexpr const char* kInputName = "input";
constexpr const char* kOutputName = "logits";

struct ExportSpec {
  bool fold_batch_norm = false;
  data::Normalization norm;  // per channel, of pixels scaled to [0, 1]
  int64_t model_version = 0;  // ModelProto.model_version: the checkpoint's step
  std::string doc;            // the model's doc_string
  std::vector<std::pair<std::string, std::string>> metadata;  // metadata_props, in order
};

// The serialised ModelProto. It has passed libonnx's checker and strict shape inference (whose
// output shape must be N x classes); a graph that fails them is hpctrain's bug (internal error).
std::vector<char> export_onnx(const nn::Model<float>& model, const ExportSpec& spec);

}  // namespace hpc::onnx_export
