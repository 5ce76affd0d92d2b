// What oneDNN computes with on this CPU, as far as it sets the bits: its version and the
// instruction set it chose at run time (the CPU's widest, or less where ONEDNN_MAX_CPU_ISA says).
// Shared by the oneDNN GEMM and convolution backends.
#pragma once

#include <dnnl.h>
#include <dnnl_debug.h>

#include <string>

namespace hpc::nn::detail {

// "avx512_core": oneDNN's name of the instruction set without its "cpu_isa_" prefix.
inline std::string isa_name() {
  std::string isa = dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa());
  if (isa.rfind("cpu_isa_", 0) == 0) isa.erase(0, 8);
  return isa;
}

inline std::string dnnl_kernels() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " " + isa_name();
}

}  // namespace hpc::nn::detail
