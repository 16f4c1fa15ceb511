#include "gradscope/comm/roll_call.h"

#include <chrono>
#include <optional>

#include <fmt/format.h>

#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace gradscope {
namespace {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

std::chrono::milliseconds ms(double s) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Seconds(s));
}

// A client of the meeting point whose every request gives up after `timeout_s`.
c10::intrusive_ptr<c10d::Store> client(const RankEnv& env, double timeout_s) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(env.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = ms(timeout_s);
  return c10::make_intrusive<c10d::PrefixStore>(
      "gradscope/roll-call", c10::make_intrusive<c10d::TCPStore>(env.master_addr, o));
}

// c10d logs a failed connection with a stack trace: the failure's message says it instead.
struct QuietC10d {
  int before = FLAGS_caffe2_log_level;
  QuietC10d() { FLAGS_caffe2_log_level = 3; }
  ~QuietC10d() { FLAGS_caffe2_log_level = before; }
};

}  // namespace

RollCall::RollCall(const RankEnv& env, std::vector<std::string> rank_hosts, double window_s,
                   double blocked_s)
    : env_(env), rank_hosts_(std::move(rank_hosts)), window_s_(window_s), blocked_s_(blocked_s) {
  beater_ = std::thread([this] { beat(); });
}

RollCall::~RollCall() {
  stop_ = true;
  wake_.notify_all();
  beater_.join();
}

void RollCall::beat() {
  // Four beats a window; a beat that cannot reach the meeting point is tried again at the next.
  const auto period = ms(window_s_ / 4);
  const std::string key = "beat/" + std::to_string(env_.rank);
  c10::intrusive_ptr<c10d::Store> store;
  while (!stop_) {
    try {
      QuietC10d quiet;
      if (!store) store = client(env_, window_s_ / 2);
      store->add(key, 1);
    } catch (const std::exception&) {
      store.reset();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait_for(lock, period, [this] { return stop_.load(); });
  }
}

void RollCall::failed_here() {
  try {
    QuietC10d quiet;
    client(env_, window_s_)->set("failed/" + std::to_string(env_.rank), std::vector<uint8_t>{1});
  } catch (const std::exception&) {
  }
}

std::string RollCall::take() {
  QuietC10d quiet;
  const int world = env_.world;
  const auto start = Clock::now();
  const auto deadline = start + ms(std::max(window_s_, blocked_s_));
  std::vector<int> lost;
  try {
    auto store = client(env_, window_s_);
    store->set("here/" + std::to_string(env_.rank), std::vector<uint8_t>{1});
    // Per rank: answered, lost, or still watched (its beat's count and since when it stood).
    enum class State { kWatched, kHere, kFailed, kLost };
    std::vector<State> state(static_cast<size_t>(world), State::kWatched);
    std::vector<int64_t> count(static_cast<size_t>(world), -1);
    std::vector<Clock::time_point> since(static_cast<size_t>(world), start);
    state[static_cast<size_t>(env_.rank)] = State::kHere;
    while (true) {
      bool watching = false;
      for (int r = 0; r < world; ++r) {
        const auto i = static_cast<size_t>(r);
        if (state[i] != State::kWatched) continue;
        if (store->check({"here/" + std::to_string(r)})) {
          state[i] = State::kHere;
          continue;
        }
        if (store->check({"failed/" + std::to_string(r)})) {
          state[i] = State::kFailed;
          continue;
        }
        const int64_t c = store->add("beat/" + std::to_string(r), 0);
        if (c != count[i]) {
          count[i] = c;
          since[i] = Clock::now();
        } else if (Clock::now() - since[i] >= ms(window_s_)) {
          state[i] = State::kLost;
          continue;
        }
        watching = true;
      }
      if (!watching || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::vector<int> silent, failed;
    for (int r = 0; r < world; ++r) {
      if (state[static_cast<size_t>(r)] == State::kLost) lost.push_back(r);
      if (state[static_cast<size_t>(r)] == State::kWatched) silent.push_back(r);
      if (state[static_cast<size_t>(r)] == State::kFailed) failed.push_back(r);
    }
    if (!lost.empty())
      return fmt::format("lost {}: its beat stopped", hosts_of_ranks(rank_hosts_, lost));
    if (!failed.empty())
      return fmt::format("{} failed (its own output says why)",
                         hosts_of_ranks(rank_hosts_, failed));
    if (!silent.empty())
      return fmt::format("{} still beat but did not answer the roll call",
                         hosts_of_ranks(rank_hosts_, silent));
    return "every rank answered the roll call";
  } catch (const std::exception&) {
    return fmt::format("lost node 0, {}: its meeting point at {}:{} cannot be reached",
                       hosts_of_ranks(rank_hosts_, {0}), env_.master_addr, env_.master_port);
  }
}

}  // namespace gradscope
