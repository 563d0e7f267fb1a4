// Times one GPT layer stack forward + backward on the GPU (cuda.h: time_layer_stack) and prints
// one JSON object: achieved TFLOP/s against the GPU's dense bf16 peak, for the full stack and for
// its GEMMs alone. scripts/gpu_validate.sh runs it.
//   distplan-cuda-layer-bench [--hidden H] [--heads A] [--ffn F] [--seq S] [--batch B]
//                             [--layers L] [--reps R] [--peak-tflops P]
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "distplan/gpu_backend/cuda.h"

namespace {

// Dense (no sparsity) bf16 tensor-core peaks, FLOP/s: H100 SXM5 and H200 989.4e12 (NVIDIA H100
// Tensor Core GPU datasheet: 1,979 TFLOPS with sparsity; H200 product brief: same), H100 PCIe
// 756e12 (same datasheet), A100 312e12 (NVIDIA A100 datasheet). 0 where unknown.
double dense_bf16_peak(const std::string& name, int cc) {
  if (cc == 90) return name.find("PCIe") != std::string::npos ? 756e12 : 989.4e12;
  if (cc == 80) return 312e12;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cuda = distplan::backend::cuda;
  cuda::LayerStackConfig c;
  double peak_override = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--hidden")
      c.hidden = v;
    else if (k == "--heads")
      c.heads = v;
    else if (k == "--ffn")
      c.ffn = v;
    else if (k == "--seq")
      c.seq = v;
    else if (k == "--batch")
      c.batch = v;
    else if (k == "--layers")
      c.layers = v;
    else if (k == "--reps")
      c.reps = v;
    else if (k == "--peak-tflops")
      peak_override = std::atof(argv[i + 1]) * 1e12;
    else {
      std::cerr << "unknown option " << k << "\n";
      return 2;
    }
  }
  if (cuda::device_count() == 0) {
    std::cerr << "no GPU visible\n";
    return 3;
  }
  try {
    cuda::set_device(0);
    const std::string name = cuda::device_name();
    const int cc = cuda::compute_capability();
    const double peak = peak_override > 0 ? peak_override : dense_bf16_peak(name, cc);
    // The GEMMs alone first (fast, and logged at once), then the whole stack.
    cuda::LayerStackConfig g = c;
    g.gemm_only = true;
    const cuda::LayerStackTiming gemm = cuda::time_layer_stack(g);
    std::cerr << "gemms only: " << gemm.seconds << " s, "
              << (gemm.seconds > 0 ? gemm.gemm_flops / gemm.seconds / 1e12 : 0.0) << " TFLOP/s\n";
    c.gemm_only = false;
    const cuda::LayerStackTiming full = cuda::time_layer_stack(c);
    auto tflops = [](double flops, double s) { return s > 0 ? flops / s / 1e12 : 0.0; };
    nlohmann::json j;
    j["schema"] = "distplan.layer_stack/v1";
    j["gpu"] = name;
    j["compute_capability"] = cc;
    j["dense_bf16_peak_tflops"] = peak / 1e12;
    j["config"] = {
        {"hidden", c.hidden}, {"heads", c.heads}, {"ffn", c.ffn > 0 ? c.ffn : 4 * c.hidden},
        {"seq", c.seq},       {"batch", c.batch}, {"layers", c.layers},
        {"reps", c.reps}};
    j["stack"] = {{"seconds", full.seconds},
                  {"model_flops", full.model_flops},
                  {"tflops", tflops(full.model_flops, full.seconds)},
                  {"fraction_of_peak", peak > 0 ? full.model_flops / full.seconds / peak : 0.0},
                  {"flops_counted", "causal attention: s(s+1)/2 query-key pairs"},
                  {"noncausal_model_flops", full.noncausal_model_flops},
                  {"noncausal_tflops", tflops(full.noncausal_model_flops, full.seconds)},
                  {"timer", "CUDA events on the kernels' stream"},
                  {"device_bytes", full.device_bytes}};
    j["gemms_only"] = {
        {"seconds", gemm.seconds},
        {"gemm_flops", gemm.gemm_flops},
        {"tflops", tflops(gemm.gemm_flops, gemm.seconds)},
        {"fraction_of_peak", peak > 0 ? gemm.gemm_flops / gemm.seconds / peak : 0.0}};
    j["target_fraction_of_peak"] = 0.5;
    std::cout << j.dump(2) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "layer stack benchmark failed: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
