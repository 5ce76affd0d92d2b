#include "nn/library_conv.hpp"

namespace hpc::nn {
std::unique_ptr<LibraryConv> make_library_conv(const ConvGeometry&) { return nullptr; }
const char* library_conv_name() { return "im2col+gemm"; }
std::string library_conv_kernels() { return ""; }
}  // namespace hpc::nn
