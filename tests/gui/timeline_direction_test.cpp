// The timeline shows which way each pass's chunk runs under a V schedule: chunk 0 (virtual stage
// s) from stage 0 to the last stage, chunk 1 (virtual stage 2p - 1 - s) back to stage 0; under
// DualPipe chunk 0 is the forward direction and chunk 1 the reverse one. The blocks carry the
// direction from the simulator's chunk map and the widget paints them.
#include <QtTest>
#include <nlohmann/json.hpp>

#include <string>

#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "timelinewidget.h"
#ifdef DISTPLAN_GUI_HAVE_SIMULATOR
#include "simulationadapter.h"
#endif

using namespace distplan;
using namespace distplan::gui;

class TimelineDirectionTest : public QObject {
  Q_OBJECT

 private slots:
  void vChunksCarryTheirDirection() {
#ifndef DISTPLAN_GUI_HAVE_SIMULATOR
    QSKIP("built without the simulator");
#else
    for (const char* sched : {"zb_v", "dualpipe_v", "interleaved_1f1b", "dualpipe"}) {
      const bool vee = std::string(sched) != "interleaved_1f1b";
      // DualPipe: each micro-batch runs in one direction only, chunk 0 from stage 0 down, chunk 1
      // from stage 3 up: 4 micro-batches x 4 stages each way.
      const bool dual = std::string(sched) == "dualpipe";
      const nlohmann::json j = {
          {"model", {{"preset", "llama2-7b"}, {"num_layers", 8}}},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 4}}},
          {"training",
           {{"framework", "generic"},
            {"seq_length", 256},
            {"global_batch_size", 8},
            {"micro_batch_size", 1}}},
          {"parallel", {{"pp", 4}, {"schedule", sched}, {"virtual_stages", 2}}}};
      const Scenario s = scenario_from_json(j);
      const SimulationSummary sum = simulateScenario(s, estimate(s));
      const TimelineData& d = *sum.timeline;
      QCOMPARE(d.v_shape, vee);
      int up = 0, down = 0;
      for (const TimelineBlock& b : d.blocks) {
        if (b.kind != BlockKind::forward) continue;
        QCOMPARE(b.upward, vee && b.chunk == 1);
        (b.upward ? up : down) += 1;
      }
      // 8 micro-batches x 4 stages per chunk.
      QCOMPARE(up, dual ? 16 : vee ? 32 : 0);
      QCOMPARE(down, dual ? 16 : vee ? 32 : 64);
      TimelineWidget w;
      w.resize(800, 300);
      w.setTimeline(d);
      QImage image(w.size(), QImage::Format_ARGB32);
      w.render(&image);  // paints both directions' blocks and labels
      QVERIFY(w.blockCount(BlockKind::forward) == (dual ? 32 : 64));
    }
#endif
  }
};

QTEST_MAIN(TimelineDirectionTest)
#include "timeline_direction_test.moc"
