#include "optim/sgd.hpp"

#include <cmath>

namespace hpc::optim {

template <class T>
Sgd<T>::Sgd(const ParamStore<T>& params, SgdSpec spec) : spec_(spec) {
  HPC_REQUIRE(spec.momentum >= 0 && spec.momentum < 1, "--momentum must be in [0, 1), got ", spec.momentum);
  HPC_REQUIRE(spec.weight_decay >= 0, "--weight-decay must not be negative, got ", spec.weight_decay);
  HPC_REQUIRE(!spec.nesterov || spec.momentum > 0, "Nesterov momentum needs --momentum > 0");
  for (const ParamSlot& s : params.slots()) {
    const bool decay = s.role == ParamRole::Weight || spec.decay_bias_and_norm;
    ranges_.push_back({s.offset, s.offset + s.shape.numel(), decay});
  }
  velocity_ = Tensor::zeros<T>(params.values().shape());
}

namespace {
// a * b + c in the update: one rounding (a fused multiply-add) where the CPU has FMA, two where
// it has not. GCC contracts these expressions on its own on FMA machines; written out, the
// rounding no longer depends on the compiler's choice, and the GPU update is told which it is.
// GCC says FMA with __FP_FAST_FMAF; Clang does not define it, only the instruction set's macro
// (__FMA__ on x86, __ARM_FEATURE_FMA on Arm), and contracts `a * b + c` by default: read as no
// FMA, a Clang build's steps were partly fused while the GPU's were told they were not.
#if defined(__FP_FAST_FMAF) || defined(__FMA__) || defined(__ARM_FEATURE_FMA)
constexpr bool kFused = true;
#else
constexpr bool kFused = false;
#endif

template <class T>
inline T muladd(T a, T b, T c) {
  if constexpr (kFused) return std::fma(a, b, c);
  else return a * b + c;
}
}  // namespace

bool sgd_fuses_multiply_add() { return kFused; }

template <class T>
void Sgd<T>::step(ParamStore<T>& params, double lr_d, double momentum) {
  T* p = params.values().template data<T>();
  const T* g = params.grads().template data<T>();
  T* v = velocity_.data<T>();
  const T neg_lr = -static_cast<T>(lr_d), mu = static_cast<T>(momentum);
  for (const Range& r : ranges_) {
    const T wd = r.decay ? static_cast<T>(spec_.weight_decay) : T(0);
    if (spec_.nesterov) {
      for (int64_t i = r.begin; i < r.end; ++i) {
        const T gi = muladd(wd, p[i], g[i]);
        v[i] = muladd(mu, v[i], gi);
        p[i] = muladd(neg_lr, muladd(mu, v[i], gi), p[i]);
      }
    } else {
      for (int64_t i = r.begin; i < r.end; ++i) {
        const T gi = muladd(wd, p[i], g[i]);
        v[i] = muladd(mu, v[i], gi);
        p[i] = muladd(neg_lr, v[i], p[i]);
      }
    }
  }
}

template class Sgd<float>;
template class Sgd<double>;

}  // namespace hpc::optim
