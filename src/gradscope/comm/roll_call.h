// Who is still there when a collective across hosts fails: every rank beats at the ranks'
// meeting point (a counter it raises four times a window, from a thread of its own), and a
// rank whose collective failed checks in there and watches the others until each has checked
// in, said it failed on its own, or let its beat stand still for a window (its host was
// killed, or cut off), or until the time a live rank may still be blocked in its own
// collective has passed.
//
// A request to the meeting point over a link that was cut can block for good (c10d's store
// client waits for its answer without a limit): the beat, the roll call and the failure mark
// run on threads of their own, and are given up (left to end with the process) when they
// overrun their time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gradscope/comm/comm.h"

namespace gradscope {

class RollCall {
 public:
  // Starts this rank's beat. `meeting`: an id every rank of this meeting shares (its keys'
  // prefix); `window`: roll_call_window_s; `blocked_s`: the longest a live rank may wait in a
  // collective before it fails (--dist-timeout less four windows).
  RollCall(const RankEnv& env, std::string meeting, std::vector<std::string> rank_hosts,
           double window_s, double blocked_s);
  ~RollCall();
  RollCall(const RollCall&) = delete;
  RollCall& operator=(const RollCall&) = delete;

  // Checks in and watches the others; what it found, for a failure's message: "lost host X
  // (ranks ...): its beat stopped (the process or its host)", "host X (rank r) failed (its own
  // output says why)", "lost node 0: its meeting point at A:P cannot be reached", or that
  // every rank answered. `waited_s`: how long the failed collective had run. A rank's beat
  // that stands still for two windows is lost; the roll call lasts at most until a live rank
  // blocked in its own collective must have failed, a window more (at least two windows).
  std::string take(double waited_s) noexcept;
  // Marks this rank as failed on its own at the meeting point (within a window, or not at all).
  void failed_here() noexcept;

  struct Beat;  // the beat thread's state, shared with it (it may outlive this object)

 private:
  // take()'s work, on a thread of its own that may outlive this object: it has copies.
  static std::string watch(const RankEnv& env, const std::string& meeting,
                           const std::vector<std::string>& rank_hosts, double window_s,
                           double watch_s);

  RankEnv env_;
  std::string meeting_;
  std::vector<std::string> rank_hosts_;
  double window_s_, blocked_s_;
  std::shared_ptr<Beat> beat_;
};

}  // namespace gradscope
