// The discrete-event core: a binary min-heap of events ordered by (time, sequence number), so
// events at equal times always pop in the order they were pushed and a run is bit-for-bit
// repeatable, and serial resources (a GPU stream, one direction of a link) that run one task at
// a time in submission order. docs/simulator.md, "Event model".
#pragma once

#include <cstdint>
#include <vector>

#include "distplan/planner/units.h"

namespace distplan::sim {

/// Event time in seconds since the start of the step.
using EventTime = Seconds;

struct Event {
  EventTime time = 0;
  std::uint64_t seq = 0;      // push order; breaks ties between equal times
  std::uint32_t kind = 0;     // meaning defined by the user of the queue
  std::uint32_t target = 0;   // e.g. a stage
  std::uint32_t payload = 0;  // e.g. a (chunk, micro-batch) slot
};

/// Min-heap on (time, seq). Storage is reused across clear() calls: no allocation once the
/// vector has grown to the largest number of pending events.
class EventQueue {
 public:
  void clear() noexcept {
    heap_.clear();
    next_seq_ = 0;
    now_ = 0;
    popped_ = 0;
  }
  void reserve(std::size_t n) { heap_.reserve(n); }

  /// Schedules an event; `time` must not precede now() (causality).
  void push(EventTime time, std::uint32_t kind, std::uint32_t target, std::uint32_t payload) {
    heap_.push_back(Event{time, next_seq_++, kind, target, payload});
    sift_up(heap_.size() - 1);
  }

  /// Removes and returns the earliest event and advances now() to its time. Precondition: !empty().
  Event pop() noexcept {
    Event top = heap_.front();
    heap_.front() = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) sift_down(0);
    now_ = top.time;
    ++popped_;
    return top;
  }

  [[nodiscard]] bool empty() const noexcept { return heap_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return heap_.size(); }
  /// Time of the last event popped (0 before the first).
  [[nodiscard]] EventTime now() const noexcept { return now_; }
  /// Events popped since the last clear().
  [[nodiscard]] std::uint64_t events_processed() const noexcept { return popped_; }

 private:
  static bool before(const Event& a, const Event& b) noexcept {
    return a.time < b.time || (a.time == b.time && a.seq < b.seq);
  }
  void sift_up(std::size_t i) noexcept {
    Event e = heap_[i];
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (!before(e, heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = e;
  }
  void sift_down(std::size_t i) noexcept {
    const std::size_t n = heap_.size();
    Event e = heap_[i];
    for (;;) {
      std::size_t child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && before(heap_[child + 1], heap_[child])) ++child;
      if (!before(heap_[child], e)) break;
      heap_[i] = heap_[child];
      i = child;
    }
    heap_[i] = e;
  }

  std::vector<Event> heap_;
  std::uint64_t next_seq_ = 0;
  EventTime now_ = 0;
  std::uint64_t popped_ = 0;
};

/// A stream or one direction of a link: runs one task at a time, first submitted first served.
/// Because the engine submits in event order (non-decreasing time), FIFO service reduces to
/// tracking when the resource frees.
struct Resource {
  EventTime free_at = 0;
  Seconds busy_seconds = 0;

  /// Queues a task that can start at `ready` and runs `duration`; returns its start time.
  EventTime submit(EventTime ready, Seconds duration) noexcept {
    const EventTime start = ready > free_at ? ready : free_at;
    free_at = start + duration;
    busy_seconds += duration;
    return start;
  }
};

}  // namespace distplan::sim
