// Who is still there when a collective across hosts fails: every rank beats at the ranks'
// meeting point (a counter it raises a few times a window, from a thread of its own), and a
// rank whose collective failed checks in there and watches the others until each has checked
// in, or its beat has stood still for a window (its host was killed, or cut off), or the time
// a live rank may still be blocked in its own collective has passed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gradscope/comm/comm.h"

namespace gradscope {

class RollCall {
 public:
  // Starts this rank's beat. `window`: roll_call_window_s; `blocked_s`: the longest a live
  // rank may wait in a collective before it fails (--dist-timeout less twice the window).
  RollCall(const RankEnv& env, std::vector<std::string> rank_hosts, double window_s,
           double blocked_s);
  ~RollCall();
  RollCall(const RollCall&) = delete;
  RollCall& operator=(const RollCall&) = delete;

  // Checks in and watches the others; what it found, for a failure's message: "lost host X
  // (ranks ...): its beat stopped", "lost node 0, host X (rank 0): its meeting point at A:P
  // cannot be reached", or that every rank answered.
  std::string take();
  // Marks this rank as failed on its own at the meeting point (best effort, within a window).
  void failed_here();

 private:
  void beat();

  RankEnv env_;
  std::vector<std::string> rank_hosts_;
  double window_s_, blocked_s_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread beater_;
};

}  // namespace gradscope
