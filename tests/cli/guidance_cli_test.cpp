// What the CLI tells a user who got something wrong or asked for something that cannot work:
// exports of layouts that do not fit, typos with did-you-mean, lists in `plan`.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace distplan::testing {
namespace {

using nlohmann::json;

json default_doc() {
  return json::parse(read_source_file("data/scenarios/default.json"));
}

// Llama 2 70B replicated on 8 GPUs without ZeRO: 140 GB of bf16 weights alone, on 80 GB GPUs.
// Planned under `framework`, the one an export to it needs.
json not_fitting(const std::string& framework = "megatron") {
  json doc = json::parse(R"({"model": "llama2-70b",
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
    "training": {"seq_length": 4096, "global_batch_size": 32},
    "parallel": {"tp": 1, "dp": 8}})");
  doc["training"]["framework"] = framework;
  return doc;
}

// The error object of a run that must fail with exit 2 and nothing on stdout.
json error_of(const CliResult& r) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.out, "");
  try {
    return json::parse(r.err).at("error");
  } catch (const json::exception& e) {
    ADD_FAILURE() << "stderr is not one JSON error: " << r.err;
    return {};
  }
}

// --- export of a layout that does not fit (exit 2 unless --force) ---------------------------

TEST(Guidance, ExportRefusesALayoutThatDoesNotFit) {
  TempDir dir;
  for (const char* to : {"megatron", "deepspeed", "torchtitan"}) {
    const auto file = dir.write(std::string(to) + ".json", not_fitting(to).dump());
    const json e = error_of(run_cli({"export", file.string(), "--to", to}));
    EXPECT_EQ(e.value("path", ""), "/parallel");
    const std::string m = e.value("message", "");
    EXPECT_NE(m.find("does not fit"), std::string::npos) << m;
    EXPECT_NE(m.find("GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("--force"), std::string::npos) << m;
  }
}

TEST(Guidance, ExportForcedCarriesTheWarning) {
  TempDir dir;
  const auto file = dir.write("big.json", not_fitting().dump());
  const CliResult r = run_cli({"export", file.string(), "--to", "megatron", "--force"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("# WARNING: this layout does not fit", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("warning: the layout does not fit"), std::string::npos) << r.err;
  const auto ds = dir.write("big-ds.json", not_fitting("deepspeed").dump());
  const CliResult d = run_cli({"export", ds.string(), "--to", "deepspeed", "--force"});
  EXPECT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NO_THROW({
    const json parsed = json::parse(d.out);
    static_cast<void>(parsed);
  });  // still a DeepSpeed config; the warning is on stderr
  EXPECT_NE(d.err.find("warning: the layout does not fit"), std::string::npos) << d.err;
}

TEST(Guidance, ExportOfAFittingLayoutExitsZeroWithoutWarning) {
  // The embedded default fits, planned under its framework, Megatron-LM.
  const CliResult r = run_cli({"export", "--to", "megatron"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("WARNING"), std::string::npos);
  EXPECT_NE(r.out.find("--tensor-model-parallel-size"), std::string::npos);
  EXPECT_NE(r.out.find("# you still add:"), std::string::npos);
}

// --- typos, presets, lists, file names (issue 17 item 8) --------------------------------------

// Runs `cmd FILE` on `doc` and returns the error object (exit 2, nothing on stdout).
json rejected(const json& doc, const std::string& cmd = "plan") {
  TempDir dir;
  const auto file = dir.write("s.json", doc.dump());
  std::vector<std::string> args{cmd, file.string()};
  if (cmd == "search") args.push_back("--quiet");
  return error_of(run_cli(args));
}

// Asked for a table, a person gets errors as text too: the same path and message as the JSON
// error object of the same command, on one line, exit 2, nothing on stdout.
TEST(Guidance, TableFormatPrintsErrorsAsText) {
  TempDir dir;
  json bad = default_doc();
  bad["parallel"]["tp"] = 3;
  const auto file = dir.write("bad.json", bad.dump());
  for (const std::vector<std::string>& format :
       {std::vector<std::string>{"--format", "table"}, {"--format=TABLE"}}) {
    for (const std::string command : {"plan", "simulate", "export"}) {
      std::vector<std::string> base = {command, file.string()};
      if (command == "export") base.insert(base.end(), {"--to", "megatron"});
      const json e = error_of(run_cli(base));
      std::vector<std::string> args = base;
      args.insert(args.end(), format.begin(), format.end());
      const CliResult t = run_cli(args);
      EXPECT_EQ(t.exit_code, 2) << t.err;
      EXPECT_EQ(t.out, "");
      EXPECT_EQ(t.err, "distplan: invalid input at " + e.at("path").get<std::string>() + ": " +
                           e.at("message").get<std::string>() + "\n")
          << command;
    }
  }
  // An option error, before the command's own options are read, follows the flag as well.
  const CliResult option = run_cli({"plan", "--format", "table", "--no-such-option"});
  EXPECT_EQ(option.exit_code, 2);
  EXPECT_EQ(option.err.rfind("distplan: invalid input: ", 0), 0u) << option.err;
}

TEST(Guidance, MisspeltRequiredFieldIsReportedFirstWithItsSuggestion) {
  json doc = default_doc();
  doc["training"].erase("global_batch_size");
  doc["training"]["global_batch"] = 2;
  const json e = rejected(doc);
  EXPECT_EQ(e.value("path", ""), "/training/global_batch");
  const std::string m = e.value("message", "");
  EXPECT_EQ(m.rfind("unknown field 'global_batch' (did you mean 'global_batch_size'?)", 0), 0u)
      << m;
  // A missing required field with no look-alike keeps the plain message.
  json plain = default_doc();
  plain["training"].erase("global_batch_size");
  EXPECT_EQ(rejected(plain).value("path", ""), "/training/global_batch_size");
}

TEST(Guidance, PresetNamesIgnoreCaseAndNearMissesAreSuggested) {
  json doc = default_doc();
  doc["cluster"]["gpu"] = "H100-SXM-80GB";
  doc["model"] = "LLAMA2-70B";
  TempDir dir;
  const CliResult r = run_cli({"plan", dir.write("s.json", doc.dump()).string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json plan = json::parse(r.out);
  EXPECT_EQ(plan["scenario"]["cluster"]["gpu"]["name"], "h100-sxm-80gb");
  EXPECT_EQ(plan["scenario"]["model"]["name"], "llama2-70b");
  doc["model"] = "llama-3.1-8b";
  EXPECT_NE(rejected(doc).value("message", "").find("did you mean 'llama3.1-8b'?"),
            std::string::npos);
}

TEST(Guidance, SearchKeysGetDidYouMean) {
  json doc = default_doc();
  doc.erase("parallel");
  doc["search"] = {{"topk", 3}};
  json e = rejected(doc, "search");
  EXPECT_EQ(e.value("path", ""), "/search/topk");
  EXPECT_NE(e.value("message", "").find("did you mean 'top_k'?"), std::string::npos);
  doc["search"] = {{"constraints", {{"tp_in_node", true}}}};
  e = rejected(doc, "search");
  EXPECT_NE(e.value("message", "").find("did you mean 'tp_within_node'?"), std::string::npos);
  doc.erase("search");
  doc["parallel"] = {{"zero", {1, 2}}};
  e = rejected(doc, "search");
  EXPECT_NE(e.value("message", "").find("did you mean 'zero_stage'?"), std::string::npos);
  doc.erase("parallel");
  doc["serach"] = {{"top_k", 3}};
  e = rejected(doc, "search");
  EXPECT_NE(e.value("message", "").find("did you mean 'search'?"), std::string::npos);
}

TEST(Guidance, ListsInAPlanPointToSearch) {
  json doc = default_doc();
  doc["parallel"]["tp"] = {1, 2};
  json e = rejected(doc);
  EXPECT_EQ(e.value("path", ""), "/parallel/tp");
  EXPECT_NE(e.value("message", "").find("distplan search"), std::string::npos);
  doc = default_doc();
  doc["parallel"]["recompute"] = {"none", "full"};
  EXPECT_NE(rejected(doc).value("message", "").find("distplan search"), std::string::npos);
  doc = default_doc();
  doc["search"] = {{"top_k", 3}};
  e = rejected(doc);
  EXPECT_EQ(e.value("path", ""), "/search");
  EXPECT_NE(e.value("message", "").find("distplan search"), std::string::npos);
}

TEST(Guidance, HfConfigFileNameSaysHowToReadIt) {
  json doc = default_doc();
  doc["model"] = {{"hf_config", "path.json"}};
  const json e = rejected(doc);
  EXPECT_EQ(e.value("path", ""), "/model/hf_config");
  EXPECT_NE(e.value("message", "").find("--hf-config path.json"), std::string::npos);
}

// --- validate's table (issue 17 item 10) -------------------------------------------------------

// A tiny model on 4 CPU ranks (pp 2, dp 2): more ranks than the cores of a small CI machine.
json four_rank_scenario() {
  return json::parse(R"({"model": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
      "ffn_hidden_size": 256, "vocab_size": 512, "mlp": "gelu", "norm": "layernorm",
      "position_embedding": "learned", "max_position_embeddings": 32, "bias": true},
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 4, "gpus_per_node": 8},
    "training": {"seq_length": 32, "global_batch_size": 8, "micro_batch_size": 1,
                 "precision": "fp32"},
    "parallel": {"tp": 1, "pp": 2, "dp": 2}})");
}

TEST(Guidance, ValidateTableLabelsWhatItCompares) {
  TempDir dir;
  const auto file = dir.write("v.json", four_rank_scenario().dump());
  const std::vector<std::string> mpi_env{"OMPI_ALLOW_RUN_AS_ROOT=1",
                                         "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                         "OMPI_MCA_btl=self,vader",
                                         "OMPI_MCA_btl_vader_single_copy_mechanism=none",
                                         "OMPI_MCA_rmaps_base_oversubscribe=1",
                                         "TMPDIR=" + dir.path().string()};
  // Rank 0 alone (collectives emulated): one process, never oversubscribed.
  const CliResult one = run_cli(
      {"validate", file.string(), "--steps", "1", "--emulate-rank", "0", "--format", "table"}, {},
      std::chrono::seconds(120), mpi_env);
  if (one.exit_code != 0 && one.err.find("MPI") != std::string::npos) {
    GTEST_SKIP() << "this build has no MPI backend: " << one.err;
  }
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::string& t = one.out;
  EXPECT_NE(t.find("simulated step, with measured costs"), std::string::npos) << t;
  // A CPU's timings against an H100's analytic time: labelled, no error computed.
  EXPECT_NE(t.find("analytic)"), std::string::npos) << t;
  EXPECT_NE(t.find("not comparable"), std::string::npos) << t;
  EXPECT_NE(t.find("  temporaries "), std::string::npos) << t;
  EXPECT_NE(t.find("(temporaries: activation gradients and collective staging"), std::string::npos)
      << t;
  EXPECT_EQ(t.find("oversubscribed"), std::string::npos) << t;

  // All 4 ranks under mpirun: oversubscribed exactly when the machine has fewer cores.
  const CliResult all = run_cli({"validate", file.string(), "--steps", "1", "--format", "table"},
                                {}, std::chrono::seconds(120), mpi_env);
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const bool fewer_cores = std::thread::hardware_concurrency() < 4;
  EXPECT_EQ(all.out.find("note: 4 ranks on ") != std::string::npos, fewer_cores) << all.out;
}

}  // namespace
}  // namespace distplan::testing
