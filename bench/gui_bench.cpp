// distplan-gui's timeline: one paint of a simulated step, offscreen, at the pass counts of
// issue 18 item 5 (pp 64 with m 4096, and 2^20 passes). Painting merges blocks narrower than a
// pixel, so the time follows the widget's pixels, not the pass count.
#include <benchmark/benchmark.h>

#include <QApplication>
#include <QImage>
#include <QPainter>

#include "timelinedata.h"
#include "timelinewidget.h"

namespace {

using distplan::gui::BlockKind;
using distplan::gui::TimelineData;

/// `passes` forward and backward passes over `stages` rows, a transfer after every forward.
TimelineData step(int stages, long long passes) {
  TimelineData d;
  d.num_stages = stages;
  d.labels = {QStringLiteral("forward (compute)"), QStringLiteral("send (p2p)")};
  const long long perStage = passes / stages;
  const double slot = 1e-6;
  d.step_seconds = static_cast<double>(perStage) * 3 * slot;
  for (int s = 0; s < stages; ++s) {
    for (long long i = 0; i < perStage; ++i) {
      const double t = static_cast<double>(i) * 3 * slot;
      const int mb = static_cast<int>(i);
      d.blocks.push_back({s, BlockKind::forward, mb, 0, t, t + slot, 0});
      d.blocks.push_back({s, BlockKind::backward, mb, 0, t + slot, t + 3 * slot, 0});
      d.blocks.push_back({s, BlockKind::communication, mb, 0, t + slot, t + 1.5 * slot, 1});
    }
  }
  distplan::gui::indexTimeline(d);
  return d;
}

// Arg: passes per step, on 64 stages, painted at 1200 x 700.
void BM_TimelinePaint(benchmark::State& state) {
  distplan::gui::TimelineWidget widget;
  widget.resize(1200, 700);
  widget.setTimeline(step(64, state.range(0)));
  QImage image(widget.size(), QImage::Format_ARGB32_Premultiplied);
  for (auto _ : state) {
    widget.render(&image);
    benchmark::DoNotOptimize(image.bits());
  }
  state.counters["rectangles"] = static_cast<double>(widget.lastPaintedBlocks());
}
BENCHMARK(BM_TimelinePaint)->Arg(64LL * 4096)->Arg(1LL << 20)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
