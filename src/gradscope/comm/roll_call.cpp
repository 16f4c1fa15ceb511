#include "gradscope/comm/roll_call.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

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

// The meeting point did not answer a roll call's connection.
struct Unreachable : std::runtime_error {
  Unreachable() : std::runtime_error("the meeting point did not answer") {}
};


// c10d logs a failed connection with a stack trace: the failure's message says it instead.
// Nested and concurrent (the beat, the roll call): the first in quiets, the last out restores.
// Its state is never freed, since a thread left on a cut link may still leave it at exit.
class QuietC10d {
 public:
  QuietC10d() {
    std::lock_guard<std::mutex> lock(mutex());
    if (depth()++ == 0) {
      before() = FLAGS_caffe2_log_level;
      FLAGS_caffe2_log_level = 3;
    }
  }
  ~QuietC10d() {
    std::lock_guard<std::mutex> lock(mutex());
    if (--depth() == 0) FLAGS_caffe2_log_level = before();
  }

 private:
  static std::mutex& mutex() {
    static auto* m = new std::mutex;
    return *m;
  }
  static int& depth() {
    static auto* d = new int(0);
    return *d;
  }
  static int& before() {
    static auto* b = new int(0);
    return *b;
  }
};

// A client of the meeting point whose every request gives up after `timeout_s`, its keys under
// this meeting's own prefix (a store that outlives a meeting, as torchrun's agent's, keeps
// another meeting's keys).
c10::intrusive_ptr<c10d::Store> client(const RankEnv& env, const std::string& meeting,
                                       double timeout_s) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(env.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = ms(timeout_s);
  QuietC10d quiet;
  return c10::make_intrusive<c10d::PrefixStore>(
      "gradscope/roll-call/" + meeting, c10::make_intrusive<c10d::TCPStore>(env.master_addr, o));
}

// What `fn` returns, run on a thread of its own; nullopt when it takes longer than
// `limit_s` (the thread is then left to end with the process).
template <typename T>
std::optional<T> within(double limit_s, std::function<T()> fn) {
  auto result = std::make_shared<std::promise<T>>();
  std::future<T> done = result->get_future();
  std::thread([result, fn = std::move(fn)] {
    try {
      result->set_value(fn());
    } catch (...) {
      result->set_exception(std::current_exception());
    }
  }).detach();
  if (done.wait_for(ms(limit_s)) != std::future_status::ready) return std::nullopt;
  return done.get();
}

// A client of the meeting point, connected within `limit_s` (a connection to a host cut off
// can take c10d longer than its own timeout to give up); throws when it is not.
c10::intrusive_ptr<c10d::Store> client_within(const RankEnv& env, const std::string& meeting,
                                              double limit_s) {
  using Store = c10::intrusive_ptr<c10d::Store>;
  std::optional<Store> store;
  try {
    store = within<Store>(limit_s,
                          [env, meeting, limit_s] { return client(env, meeting, limit_s); });
  } catch (const std::exception&) {
    throw Unreachable();
  }
  if (!store) throw Unreachable();
  return *store;
}

}  // namespace

struct RollCall::Beat {
  RankEnv env;
  std::string meeting;
  double window_s = 1;
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false, finished = false;
};

RollCall::RollCall(const RankEnv& env, std::string meeting, std::vector<std::string> rank_hosts,
                   double window_s, double blocked_s)
    : env_(env),
      meeting_(std::move(meeting)),
      rank_hosts_(std::move(rank_hosts)),
      window_s_(window_s),
      blocked_s_(blocked_s),
      beat_(std::make_shared<Beat>()) {
  beat_->env = env;
  beat_->meeting = meeting_;
  beat_->window_s = window_s;
  // Four beats a window; a beat that cannot reach the meeting point is tried again at the next.
  std::thread([b = beat_] {
    const std::string key = "beat/" + std::to_string(b->env.rank);
    c10::intrusive_ptr<c10d::Store> store;
    std::unique_lock<std::mutex> lock(b->mutex);
    while (!b->stop) {
      lock.unlock();
      try {
        if (!store) store = client(b->env, b->meeting, b->window_s / 2);
        store->add(key, 1);
      } catch (const std::exception&) {
        store.reset();
      }
      lock.lock();
      b->wake.wait_for(lock, ms(b->window_s / 4), [&] { return b->stop; });
    }
    b->finished = true;
    b->wake.notify_all();
  }).detach();
}

RollCall::~RollCall() {
  // The beat ends at once when it waits for its next beat; one whose request hangs on a cut
  // link, or waits for an answer, is left to end with the process after a quarter window.
  std::unique_lock<std::mutex> lock(beat_->mutex);
  beat_->stop = true;
  beat_->wake.notify_all();
  beat_->wake.wait_for(lock, ms(window_s_ / 4), [this] { return beat_->finished; });
}

void RollCall::failed_here() noexcept {
  try {
    within<bool>(window_s_, [env = env_, meeting = meeting_, window = window_s_] {
      client(env, meeting, window)
          ->set("failed/" + std::to_string(env.rank), std::vector<uint8_t>{1});
      return true;
    });
  } catch (...) {
    // Best effort: the others then find this rank's beat stopped instead.
  }
}

std::string RollCall::take(double waited_s) noexcept {
  const auto lost_node0 = [this](const char* why) {
    return fmt::format("lost node 0: its meeting point at {}:{} {}", env_.master_addr,
                       env_.master_port, why);
  };
  // A live rank fails its own collective at most blocked_s after it began, about when this
  // one's began: watch until then and a window more, and at least two windows.
  const double watch_s = std::max(2 * window_s_, blocked_s_ + window_s_ - waited_s);
  try {
    const auto found = within<std::string>(
        watch_s + window_s_,
        [env = env_, meeting = meeting_, hosts = rank_hosts_, w = window_s_, watch_s] {
          return watch(env, meeting, hosts, w, watch_s);
        });
    return found ? *found : lost_node0("stopped answering");
  } catch (const Unreachable&) {
    return lost_node0("cannot be reached");
  } catch (const std::exception& e) {
    std::string why = e.what();
    return "the roll call failed: " + why.substr(0, why.find('\n'));
  } catch (...) {
    return "the roll call failed";
  }
}

std::string RollCall::watch(const RankEnv& env, const std::string& meeting,
                            const std::vector<std::string>& hosts, double window_s,
                            double watch_s) {
  const int world = env.world;
  const auto start = Clock::now();
  const auto deadline = start + ms(watch_s);
  std::vector<int> lost;
  {
    auto store = client_within(env, meeting, window_s);
    store->set("here/" + std::to_string(env.rank), std::vector<uint8_t>{1});
    // Per rank: answered, lost, or still watched (its beat's count and since when it stood).
    enum class State { kWatched, kHere, kFailed, kLost };
    std::vector<State> state(static_cast<size_t>(world), State::kWatched);
    std::vector<int64_t> count(static_cast<size_t>(world), -1);
    std::vector<Clock::time_point> since(static_cast<size_t>(world), start);
    state[static_cast<size_t>(env.rank)] = State::kHere;
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
        } else if (Clock::now() - since[i] >= ms(2 * window_s)) {
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
      return fmt::format("lost {}: its beat stopped (the process or its host)",
                         hosts_of_ranks(hosts, lost));
    if (!failed.empty())
      return fmt::format("{} failed (its own output says why)",
                         hosts_of_ranks(hosts, failed));
    if (!silent.empty())
      return fmt::format("{} still beat but did not answer the roll call",
                         hosts_of_ranks(hosts, silent));
    return "every rank answered the roll call";
  }
}

}  // namespace gradscope
