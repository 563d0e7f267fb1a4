// The bad-input contract of `distplan plan` (shared API.md, "Errors"): every invalid document ends
// with exit code 2, nothing on stdout, and exactly one JSON object on stderr,
// {"error": {"code": "invalid_input", "path": <JSON pointer>, "message": ...}}, within a second.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace distplan::testing {
namespace {

using nlohmann::json;

json default_doc() {
  return json::parse(read_source_file("data/scenarios/default.json"));
}

// The default scenario with the value at `pointer` replaced (or removed when `value` is
// discarded).
json with(const std::string& pointer, const json& value) {
  json doc = default_doc();
  doc[json::json_pointer(pointer)] = value;
  return doc;
}

json without(const std::string& pointer) {
  json doc = default_doc();
  const json::json_pointer p(pointer);
  doc[p.parent_pointer()].erase(p.back());
  return doc;
}

// Runs `plan FILE` on `bytes` and holds the whole contract; returns the error object.
json expect_rejected(const std::string& bytes, const std::string& path,
                     const std::string& message_part = {}) {
  TempDir dir;
  const auto file = dir.write("scenario.json", bytes);
  const CliResult r = run_cli({"plan", file.string()});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.out, "") << "stdout must stay empty on bad input";
  EXPECT_LT(r.elapsed.count(), bad_input_budget().count());
  // One line, one JSON object.
  EXPECT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  json err;
  try {
    err = json::parse(r.err);
  } catch (const json::exception& e) {
    ADD_FAILURE() << "stderr is not JSON: " << e.what() << "\n" << r.err;
    return {};
  }
  EXPECT_EQ(err.size(), 1u) << r.err;
  const json& e = err.value("error", json::object());
  EXPECT_EQ(e.value("code", ""), "invalid_input") << r.err;
  EXPECT_EQ(e.value("path", "<none>"), path) << r.err;
  EXPECT_FALSE(e.value("message", "").empty()) << r.err;
  if (!message_part.empty()) {
    EXPECT_NE(e.value("message", "").find(message_part), std::string::npos) << r.err;
  }
  return e;
}

json expect_rejected(const json& doc, const std::string& path,
                     const std::string& message_part = {}) {
  return expect_rejected(doc.dump(), path, message_part);
}

// --- malformed text -----------------------------------------------------------------------------

TEST(BadInput, EmptyInputIsMalformed) {
  expect_rejected(std::string(), "", "malformed JSON");
  expect_rejected(std::string(" \n\t "), "", "malformed JSON");
}

TEST(BadInput, EmptyStdinIsMalformed) {
  const CliResult r = run_cli({"plan", "-"}, "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(json::parse(r.err)["error"]["path"], "");
}

TEST(BadInput, SyntaxErrorsAreMalformed) {
  for (const char* text : {"{\"model\": ", "{\"model\": \"llama2-70b\",}", "{'model': 1}",
                           "{\"model\": \"llama2-70b\"} trailing", "// comment\n{}", "{\"a\" 1}",
                           "[1, 2", "tru", "{\"model\": \"llama2-70b\"\x00}", "\"unterminated"}) {
    SCOPED_TRACE(text);
    expect_rejected(std::string(text), "", "malformed JSON");
  }
  // An embedded NUL byte (the literal above stops at it).
  expect_rejected(std::string("{\"model\": \"llama\0\"}", 19), "", "malformed JSON");
}

TEST(BadInput, DocumentMustBeAnObject) {
  for (const char* text : {"[]", "42", "\"plan\"", "null", "true"}) {
    SCOPED_TRACE(text);
    expect_rejected(std::string(text), "", "must be an object");
  }
}

TEST(BadInput, NonUtf8BytesAreMalformed) {
  // Invalid lead byte, stray continuation, overlong '/', truncated sequence, UTF-16 surrogate
  // encoded in UTF-8, and bytes outside any string.
  for (const std::string bad : {"\xff", "\x80", "\xc0\xaf", "\xe2\x82", "\xed\xa0\x80"}) {
    SCOPED_TRACE(::testing::PrintToString(bad));
    expect_rejected("{\"model\": \"" + bad + "\"}", "", "malformed JSON");
  }
  expect_rejected(std::string("\xfe\xff{}"), "", "malformed JSON");
  // A lone surrogate written as an escape is not a character either.
  expect_rejected(std::string(R"({"model": "\ud800"})"), "", "malformed JSON");
}

TEST(BadInput, DeepNestingIsRejectedWithoutCrashing) {
  // Refused before a tree is built, at the container that holds the first one nested deeper
  // than 64 levels (a scenario nests about 5).
  const int depth = 10'000;
  auto repeat = [](const std::string& step, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += step;
    return out;
  };
  const std::string arrays = std::string(depth, '[') + std::string(depth, ']');
  expect_rejected(arrays, repeat("/0", 64), "nested deeper than 64 levels");
  // The same depth under a field: the pointer starts at that field.
  json doc = default_doc();
  std::string text = doc.dump();
  text.insert(text.size() - 1, ",\"deep\":" + arrays);
  expect_rejected(text, "/deep" + repeat("/0", 63), "nested deeper than 64 levels");
  std::string objects;
  for (int i = 0; i < depth; ++i) objects += "{\"a\":";
  objects += "1" + std::string(depth, '}');
  expect_rejected(R"({"model": )" + objects + "}", "/model" + repeat("/a", 63),
                  "nested deeper than 64 levels");
  // Unbalanced: deep and truncated; the depth is met first.
  expect_rejected(std::string(depth, '['), repeat("/0", 64), "nested deeper than 64 levels");
  // Truncated within the limit: malformed.
  expect_rejected(std::string(10, '['), "", "malformed JSON");
}

TEST(BadInput, HundredMegabyteDocumentIsRejectedQuickly) {
  // 100 MB of numbers after a valid scenario: rejected by size before it is parsed.
  const std::size_t n = 100u << 20;
  std::string big = default_doc().dump();
  std::string arr = ",\"extra\":[";
  arr.reserve(n + 64);
  while (arr.size() < n) arr += "1234567,";
  arr += "0]";
  big.insert(big.size() - 1, arr);
  expect_rejected(big, "", "larger than 16 MiB");
  // The same through stdin.
  const CliResult r = run_cli({"plan", "-"}, big);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_LT(r.elapsed.count(), bad_input_budget().count());
  EXPECT_EQ(json::parse(r.err)["error"]["path"], "");
}

TEST(BadInput, LargeDocumentUnderTheSizeLimitIsParsedQuickly) {
  // 15 MiB: a 15 MiB model name is parsed and rejected at its field, with a bounded message.
  std::string text = R"({"model": ")";
  text.append(std::size_t{15} << 20, 'x');
  text += "\"}";
  const json e = expect_rejected(text, "/model", "unknown model preset");
  EXPECT_LT(e.value("message", "").size(), 512u);
  // A valid scenario padded with 15 MiB of whitespace is still a valid scenario.
  std::string padded = default_doc().dump();
  padded.insert(1, std::string(std::size_t{15} << 20, ' '));
  TempDir dir;
  const CliResult r = run_cli({"plan", dir.write("padded.json", padded).string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(r.elapsed.count(), bad_input_budget().count());
  EXPECT_EQ(json::parse(r.out)["schema"], "distplan.plan/v1");
}

// --- NaN and infinity (JSON has neither)
// -----------------------------------------------------------

TEST(BadInput, NanAndInfinityLiteralsAreMalformed) {
  for (const char* lit : {"NaN", "nan", "Infinity", "-Infinity", "inf", "-inf"}) {
    SCOPED_TRACE(lit);
    std::string text = default_doc().dump();
    const auto pos = text.find("\"micro_batch_size\":1");
    ASSERT_NE(pos, std::string::npos);
    text.replace(pos, 20, std::string("\"micro_batch_size\":") + lit);
    expect_rejected(text, "", "malformed JSON");
  }
}

TEST(BadInput, NumbersBeyondDoubleRangeNameTheirField) {
  for (const char* lit : {"1e999", "-1e999", "1e309"}) {
    SCOPED_TRACE(lit);
    std::string text = default_doc().dump();
    const auto pos = text.find("\"micro_batch_size\":1");
    text.replace(pos, 20, std::string("\"micro_batch_size\":") + lit);
    expect_rejected(text, "/training/micro_batch_size", "finite");
  }
  expect_rejected(std::string(R"({"model": "llama2-70b", "training": {"dropout": [0, 1e999]}})"),
                  "/training/dropout/1", "finite");
}

TEST(BadInput, NanSpelledAsStringIsAWrongType) {
  expect_rejected(with("/training/dropout", "NaN"), "/training/dropout", "must be a number");
  expect_rejected(with("/cluster/intra_node_latency", "Infinity"), "/cluster/intra_node_latency",
                  "must be a number");
}

// --- wrong types ---------------------------------------------------------------------------------

TEST(BadInput, WrongTypesNameTheField) {
  expect_rejected(with("/model", 42), "/model", "must be an object");
  expect_rejected(with("/cluster", json::array()), "/cluster", "must be an object");
  expect_rejected(with("/cluster/num_gpus", "64"), "/cluster/num_gpus", "integer");
  expect_rejected(with("/training/seq_length", 4096.5), "/training/seq_length", "integer");
  expect_rejected(with("/parallel/tp", true), "/parallel/tp", "integer");
  expect_rejected(with("/parallel/tp", nullptr), "/parallel/tp", "integer");
  expect_rejected(with("/parallel/sequence_parallel", "yes"), "/parallel/sequence_parallel",
                  "true or false");
  expect_rejected(with("/training/precision", 16), "/training/precision", "string");
  expect_rejected(with("/parallel/layers_per_stage", "20,20,20,20"), "/parallel/layers_per_stage",
                  "array");
  expect_rejected(with("/parallel/layers_per_stage", json::array({20, 20, "20", 20})),
                  "/parallel/layers_per_stage/2");
  expect_rejected(with("/cluster/gpu", json::array({"h100-sxm-80gb"})), "/cluster/gpu",
                  "must be an object");
  expect_rejected(with("/training/dropout", json::object()), "/training/dropout",
                  "must be a number");
}

TEST(BadInput, MissingRequiredSectionsNameThem) {
  expect_rejected(without("/model"), "/model", "required");
  expect_rejected(without("/training"), "/training", "required");
  expect_rejected(without("/cluster"), "/cluster", "required");
  expect_rejected(without("/cluster/gpu"), "/cluster/gpu", "required");
  expect_rejected(without("/training/seq_length"), "/training/seq_length", "required");
  expect_rejected(without("/training/global_batch_size"), "/training/global_batch_size",
                  "required");
  json custom = with("/model", {{"num_layers", 4}, {"hidden_size", 256}});
  expect_rejected(custom, "/model/num_attention_heads", "required");
}

// --- negative, zero and huge sizes
// -----------------------------------------------------------------

TEST(BadInput, ZeroAndNegativeSizesNameTheField) {
  for (const char* p :
       {"/parallel/tp", "/parallel/pp", "/parallel/dp", "/cluster/num_gpus", "/training/seq_length",
        "/training/global_batch_size", "/training/micro_batch_size", "/parallel/virtual_stages"}) {
    for (int v : {0, -1, -64}) {
      SCOPED_TRACE(std::string(p) + "=" + std::to_string(v));
      expect_rejected(with(p, v), p, "at least");
    }
  }
  expect_rejected(with("/model", {{"preset", "llama2-70b"}, {"hidden_size", 0}}),
                  "/model/hidden_size", "at least");
  expect_rejected(with("/model", {{"preset", "llama2-70b"}, {"num_layers", -80}}),
                  "/model/num_layers", "at least");
  expect_rejected(with("/cluster/gpu", {{"preset", "h100-sxm-80gb"}, {"memory_bytes", -1}}),
                  "/cluster/gpu/memory_bytes", "at least");
  expect_rejected(with("/cluster/runtime_reserve_bytes", -1), "/cluster/runtime_reserve_bytes",
                  "at least");
  expect_rejected(with("/training/dropout", -0.1), "/training/dropout", "at least");
  expect_rejected(with("/parallel/zero_stage", -1), "/parallel/zero_stage", "at least");
  expect_rejected(with("/parallel/zero_stage", 4), "/parallel/zero_stage", "too large");
  expect_rejected(with("/cluster/intra_node_bandwidth", 0), "/cluster/intra_node_bandwidth",
                  "at least");
}

TEST(BadInput, SizesBeyondSixtyFourBitsAreRejected) {
  // 10^9 GPUs, and counts that do not fit int64 (as integers and as doubles).
  expect_rejected(with("/cluster/num_gpus", 1'000'000'000), "/cluster/num_gpus", "too large");
  expect_rejected(with("/cluster/num_gpus", std::uint64_t{18446744073709551615u}),
                  "/cluster/num_gpus", "too large");
  expect_rejected(with("/parallel/tp", std::int64_t{9223372036854775807}), "/parallel/tp",
                  "too large");
  expect_rejected(with("/parallel/dp", 1e30), "/parallel/dp", "too large");
  expect_rejected(with("/parallel/dp", -1e30), "/parallel/dp", "at least");
  std::string text = default_doc().dump();
  const auto pos = text.find("\"global_batch_size\":512");
  text.replace(pos, 23, "\"global_batch_size\":123456789012345678901234567890");
  expect_rejected(text, "/training/global_batch_size", "too large");
  expect_rejected(with("/cluster/gpu", {{"preset", "h100-sxm-80gb"}, {"memory_bytes", 1e300}}),
                  "/cluster/gpu/memory_bytes", "too large");
}

TEST(BadInput, QuadrillionParameterModelIsRejected) {
  // 12·L·h² ≈ 12 · 100000 · 65536² ≈ 5.2e15 parameters, above the supported 1e14.
  const json model = {{"num_layers", 100000},       {"hidden_size", 65536},
                      {"num_attention_heads", 512}, {"ffn_hidden_size", 262144},
                      {"vocab_size", 32000},        {"position_embedding", "rotary"}};
  expect_rejected(with("/model", model), "/model", "parameters");
}

TEST(BadInput, ProductsThatWouldOverflowAreRejected) {
  // Activations: a 4M-token sequence of a 70B model with many micro-batches in flight, its
  // s x s attention scores saved (standard attention; flash attention saves none and plans).
  json doc = with("/training/seq_length", 1 << 22);
  doc["parallel"]["sequence_parallel"] = false;
  doc["training"]["attention"] = "standard";
  expect_rejected(doc, "/training/seq_length", "bytes");
  // Tokens per step: 2^32 sequences of 2^20 tokens.
  json tokens = default_doc();
  tokens["model"] = {{"preset", "tiny-gpt"}, {"max_position_embeddings", 1 << 20}};
  tokens["cluster"]["num_gpus"] = 1;
  tokens["parallel"] = {{"tp", 1}, {"pp", 1}};
  tokens["training"]["seq_length"] = 1 << 20;
  tokens["training"]["global_batch_size"] = std::int64_t{1} << 32;
  const CliResult r = run_cli({"plan", "-"}, tokens.dump());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_LT(r.elapsed.count(), bad_input_budget().count());
}

// --- invalid layouts (issue 2)
// --------------------------------------------------------------------

TEST(BadInput, UnknownFieldsNameTheirPathWithAHint) {
  json doc = default_doc();
  doc["paralel"] = doc["parallel"];
  doc.erase("parallel");
  expect_rejected(doc, "/paralel", "did you mean 'parallel'");
  expect_rejected(with("/parallel/tensor_parallel", 8), "/parallel/tensor_parallel",
                  "unknown field");
  expect_rejected(with("/training/seq_lenght", 4096), "/training/seq_lenght",
                  "did you mean 'seq_length'");
  expect_rejected(with("/cluster/gpu", {{"preset", "h100-sxm-80gb"}, {"memory", 1}}),
                  "/cluster/gpu/memory", "unknown field");
  expect_rejected(with("/model", {{"preset", "llama2-70b"}, {"hidden", 1}}), "/model/hidden",
                  "unknown field");
  // Keys that need escaping in a JSON pointer (RFC 6901).
  json tilde = default_doc();
  tilde["parallel"]["a~b"] = 1;
  expect_rejected(tilde, "/parallel/a~0b", "unknown field");
  json slash = default_doc();
  slash["parallel"]["a/b"] = 1;
  expect_rejected(slash, "/parallel/a~1b", "unknown field");
}

TEST(BadInput, TpMustDivideHeadsKvHeadsAndFfn) {
  json heads = with("/parallel", {{"tp", 3}, {"pp", 1}});
  heads["cluster"]["num_gpus"] = 3;
  heads["training"]["global_batch_size"] = 3;
  expect_rejected(heads, "/parallel/tp", "num_attention_heads");
  // Llama-2-70B: 64 query heads, 8 KV heads; tp=16 divides 64 but not 8.
  json kv = with("/parallel", {{"tp", 16}, {"pp", 4}, {"dp", 1}});
  expect_rejected(kv, "/parallel/tp", "num_kv_heads");
  json ffn = with("/model", {{"preset", "llama2-7b"}, {"ffn_hidden_size", 11009}});
  ffn["parallel"] = {{"tp", 2}, {"pp", 1}};
  expect_rejected(ffn, "/parallel/tp", "ffn_hidden_size");
}

TEST(BadInput, LayoutProductMustEqualNumGpus) {
  expect_rejected(with("/parallel/dp", 4), "/parallel", "num_gpus");
  json no_dp = without("/parallel/dp");
  no_dp["cluster"]["num_gpus"] = 48;  // 48 is not a multiple of tp*pp = 32
  expect_rejected(no_dp, "/parallel", "divisible");
}

TEST(BadInput, GlobalBatchMustDivideByDpTimesMicroBatch) {
  expect_rejected(with("/training/global_batch_size", 511), "/training/global_batch_size",
                  "divisible");
  expect_rejected(with("/training/micro_batch_size", 3), "/training/global_batch_size",
                  "divisible");
}

TEST(BadInput, PipelineCannotExceedLayers) {
  json doc = with("/parallel", {{"tp", 1}, {"pp", 128}, {"dp", 1}});
  doc["cluster"]["num_gpus"] = 128;
  expect_rejected(doc, "/parallel/pp", "num_layers");
}

TEST(BadInput, VirtualStagesMustHoldALayerEach) {
  // 80 layers over pp=4: any split of 12 virtual stages (v = 3) plans; 100 (v = 25) leave some
  // without a layer under the even rule.
  json doc = with("/parallel/schedule", "interleaved_1f1b");
  doc["parallel"]["virtual_stages"] = 25;
  expect_rejected(doc, "/parallel/virtual_stages", "cannot fill");
  expect_rejected(with("/parallel/virtual_stages", 2), "/parallel/virtual_stages",
                  "interleaved_1f1b");
}

TEST(BadInput, OtherLayoutRulesNameTheirField) {
  expect_rejected(with("/parallel/fsdp_shard_size", 3), "/parallel/fsdp_shard_size", "divide");
  json hybrid = with("/parallel/zero_stage", 0);
  hybrid["parallel"]["fsdp_shard_size"] = 1;
  expect_rejected(hybrid, "/parallel/fsdp_shard_size", "zero_stage");
  expect_rejected(with("/training/seq_length", 4097), "/parallel/sequence_parallel", "seq_length");
  expect_rejected(with("/parallel/layers_per_stage", json::array({20, 20, 20})),
                  "/parallel/layers_per_stage", "one per stage");
  expect_rejected(with("/parallel/layers_per_stage", json::array({20, 20, 20, 19})),
                  "/parallel/layers_per_stage", "sums to 79");
  expect_rejected(with("/cluster/runtime_reserve_bytes", std::int64_t{80} << 30),
                  "/cluster/runtime_reserve_bytes", "leaves nothing");
}

TEST(BadInput, UnknownPresetsAndChoicesNameTheField) {
  expect_rejected(with("/model", "llama9-1t"), "/model", "unknown model preset");
  expect_rejected(with("/model", {{"preset", "gpt5"}}), "/model/preset", "unknown model preset");
  expect_rejected(with("/cluster/gpu", "h1000"), "/cluster/gpu", "unknown GPU preset");
  expect_rejected(with("/cluster/gpu", {{"preset", "tpu"}}), "/cluster/gpu/preset",
                  "unknown GPU preset");
  expect_rejected(with("/parallel/schedule", "1f2b"), "/parallel/schedule", "not one of");
  expect_rejected(with("/training/precision", "fp4"), "/training/precision", "not one of");
  expect_rejected(with("/parallel/recompute", "some"), "/parallel/recompute", "not one of");
  // Preset names match without case (issue 17: `A100-80GB` is a100-80gb); a near miss is
  // suggested.
  expect_rejected(with("/model", "llama-3.1-8b"), "/model", "did you mean 'llama3.1-8b'?");
  expect_rejected(with("/cluster/gpu", "h100-sxm"), "/cluster/gpu",
                  "did you mean 'h100-sxm-80gb'?");
}

TEST(BadInput, UnreadableFilesAreInputErrors) {
  const CliResult r = run_cli({"plan", "/nonexistent/distplan/scenario.json"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(json::parse(r.err)["error"]["code"], "invalid_input");
  TempDir dir;
  const auto bad_hf = dir.write("config.json", "{\"n_layer\": ");
  const CliResult h = run_cli({"plan", "--hf-config", bad_hf.string()});
  EXPECT_EQ(h.exit_code, 2) << h.err;
  EXPECT_EQ(h.out, "");
  EXPECT_EQ(json::parse(h.err)["error"]["path"], "/model/hf_config");
  // An empty file name is refused, not ignored (issue 29, item 15).
  for (const char* option : {"--hf-config", "--calibration"}) {
    const CliResult e = run_cli({"plan", option, ""});
    EXPECT_EQ(e.exit_code, 2) << option << e.err;
    EXPECT_EQ(e.out, "") << option;
    EXPECT_NE(e.err.find(option), std::string::npos) << e.err;
  }
}

}  // namespace
}  // namespace distplan::testing
