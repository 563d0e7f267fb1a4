// Gradient dumps: a magic line, the record count, then per record the parameter id, the element
// count, the indices (int64) and the values (fp32), all in the host's byte order (written and read
// on the same machine by one test).
#include "distplan/gpu_backend/gradient_dump.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>

namespace distplan::backend {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'G', 'R', 'A', 'D', '1', '\n'};

template <typename T>
void put(std::ofstream& f, const T* p, std::size_t n) {
  f.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(T)));
}
template <typename T>
void get(std::ifstream& f, T* p, std::size_t n, const std::string& path) {
  if (!f.read(reinterpret_cast<char*>(p), static_cast<std::streamsize>(n * sizeof(T))))
    throw std::runtime_error("truncated gradient dump " + path);
}

}  // namespace

void write_gradient_dump(const std::string& path, const std::vector<GradientRecord>& records) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write gradient dump " + path);
  put(f, kMagic, sizeof kMagic);
  const std::uint64_t count = records.size();
  put(f, &count, 1);
  for (const GradientRecord& r : records) {
    if (r.index.size() != r.value.size())
      throw std::runtime_error("gradient record with unequal index and value counts");
    const std::uint64_t n = r.index.size();
    put(f, &r.param, 1);
    put(f, &n, 1);
    put(f, r.index.data(), r.index.size());
    put(f, r.value.data(), r.value.size());
  }
  if (!f) throw std::runtime_error("cannot write gradient dump " + path);
}

std::vector<GradientRecord> read_gradient_dump(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read gradient dump " + path);
  char magic[sizeof kMagic];
  get(f, magic, sizeof magic, path);
  if (!std::equal(magic, magic + sizeof magic, kMagic))
    throw std::runtime_error(path + " is not a gradient dump");
  std::uint64_t count = 0;
  get(f, &count, 1, path);
  std::vector<GradientRecord> out(count);
  for (GradientRecord& r : out) {
    std::uint64_t n = 0;
    get(f, &r.param, 1, path);
    get(f, &n, 1, path);
    r.index.resize(n);
    r.value.resize(n);
    get(f, r.index.data(), n, path);
    get(f, r.value.data(), n, path);
  }
  return out;
}

// Ids as the trainer assigns them (gpu_backend/src/trainer_params.cpp, Trainer::uid): layer * 64 +
// slot, the embedding as layer 100000 and the LM head unit as layer 100001; slots in the layer op
// table's order.
std::string parameter_name(std::uint64_t param) {
  static const char* kLayer[] = {"input norm weight",
                                 "input norm bias",
                                 "qkv weight",
                                 "qkv bias",
                                 "attention out weight",
                                 "attention out bias",
                                 "post-attention norm weight",
                                 "post-attention norm bias",
                                 "mlp in weight",
                                 "mlp in bias",
                                 "mlp out weight",
                                 "mlp out bias"};
  static const char* kEmbedding[] = {"word", "position"};
  static const char* kHead[] = {"final norm weight", "final norm bias", "weight"};
  // MoE layers (trainer_moe.cpp): slots 12-15 of the layer, routed experts from 2^40 on.
  static const char* kMoe[] = {"router weight", "router bias", "shared experts in weight",
                               "shared experts out weight"};
  if (param >= (std::uint64_t{1} << 40)) {
    const std::uint64_t rest = param - (std::uint64_t{1} << 40);
    const std::uint64_t l = rest >> 20, e = (rest & ((1u << 20) - 1)) / 2, w = rest % 2;
    return "layer " + std::to_string(l) + " expert " + std::to_string(e) +
           (w == 0 ? " in weight" : " out weight");
  }
  const std::uint64_t layer = param / 64, slot = param % 64;
  if (layer < 100000 && slot >= 12 && slot < 16)
    return "layer " + std::to_string(layer) + " " + kMoe[slot - 12];
  if (layer == 100000 && slot < 2) return std::string("embedding ") + kEmbedding[slot];
  if (layer == 100001 && slot < 3) return std::string("lm head ") + kHead[slot];
  if (layer < 100000 && slot < 12) return "layer " + std::to_string(layer) + " " + kLayer[slot];
  // LoRA adapters (trainer_lora.cpp): slots 20 on, A then B of each adapter in the layer's order.
  if (layer < 100000 && slot >= 20 && slot < 36) {
    return "layer " + std::to_string(layer) + " lora " + std::to_string((slot - 20) / 2) +
           (slot % 2 == 0 ? " A" : " B");
  }
  return "parameter " + std::to_string(param);
}

}  // namespace distplan::backend
