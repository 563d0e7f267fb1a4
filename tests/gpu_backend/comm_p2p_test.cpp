// The pipeline group's batched send_recv under mpirun with two ranks (the p2p probe): 1F1B's
// crossing pair completes with large messages and exact data; a receive that the schedule pairs
// with a different send, or a message of another size, fails naming both sides.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

struct Result {
  int rc = 0;
  std::string out;
};

Result run_probe(const std::string& args) {
  // One log per test process: CTest runs these tests in parallel.
  const std::string log = ::testing::TempDir() + "/p2p_probe_" +
                          ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                          std::to_string(::getpid()) + ".log";
  const std::string cmd =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader "
      "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
      "timeout 120 mpirun -np 2 --oversubscribe " DISTPLAN_P2P_PROBE " " +
      args + " > " + log + " 2>&1";
  Result r;
  r.rc = std::system(cmd.c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  r.out = ss.str();
  return r;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(CommP2P, CrossingPairOfLargeMessagesCompletesWithExactData) {
  const Result r = run_probe("paired");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(count(r.out, "PAIRED OK"), 2) << r.out;
}

TEST(CommP2P, ReceiveOutOfScheduleOrderFailsNamingBoth) {
  const Result r = run_probe("misordered");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_EQ(count(r.out, "P2POrderError"), 2) << r.out;
  // Rank 1 expects micro-batch 1 first and gets micro-batch 0 (sent first), then the reverse.
  EXPECT_NE(r.out.find("expected the activation of micro-batch 1 for virtual stage 1 (4096 "
                       "bytes), received the activation of micro-batch 0 for virtual stage 1"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("expected the activation of micro-batch 0 for virtual stage 1 (4096 "
                       "bytes), received the activation of micro-batch 1 for virtual stage 1"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("rank 1 of its pp group from rank 0"), std::string::npos) << r.out;
}

// The V's activations and gradients each in their own stream: received in the other order than
// sent, both arrive with the headers they were expected with (on one stream this is the
// misordered case above).
TEST(CommP2P, VStreamsKeepEachKindInItsOwnOrder) {
  const Result r = run_probe("streams");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(count(r.out, "STREAMS OK"), 1) << r.out;
  EXPECT_EQ(count(r.out, "P2POrderError"), 0) << r.out;
}

TEST(CommP2P, MessageOfAnotherSizeFailsByName) {
  const Result r = run_probe("sizes");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_EQ(count(r.out, "P2POrderError"), 2) << r.out;
  EXPECT_NE(r.out.find("expected the activation of micro-batch 0 for virtual stage 1"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("differs in size"), std::string::npos) << r.out;
}

// NCCL on device buffers: one GPU per rank; the probe prints SKIP where there are fewer.
TEST(CommP2P, NcclCrossingPairCompletes) {
  const Result r = run_probe("paired --nccl");
  if (r.out.find("SKIP") != std::string::npos) GTEST_SKIP() << r.out;
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(count(r.out, "PAIRED OK"), 2) << r.out;
}

}  // namespace
