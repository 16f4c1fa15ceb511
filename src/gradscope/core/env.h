// The environment a run happens in: versions, host, data directory. Every run records it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace gradscope {

struct EnvInfo {
  std::string gradscope_version;
  std::string libtorch;     // e.g. "2.13.0+cpu"
  std::string cuda;         // CUDA runtime LibTorch was built with, "" when CPU-only
  std::string device_name;  // CPU model name or GPU name
  int threads = 1;          // LibTorch intra-op threads in use
  int blas_threads = 0;     // MKL's threads (drawn from the same OpenMP pool); 0 without MKL
  std::string git_commit;
  std::string host;
  std::string build_type;  // warns when not an optimized build
};

EnvInfo current_env(const std::string& device);

// The threads MKL (the BLAS of PyTorch's x86 wheels) would use, read through the dynamic
// linker; 0 when the BLAS is not MKL. at::set_num_threads sets them with the intra-op threads,
// and both draw on one OpenMP pool, so they never add up past it.
int blas_threads();

// The cores this process may run on (its CPU affinity, which a container or `taskset` narrows;
// the machine's count where affinity cannot be read); at least 1.
int64_t usable_cores();

// What a run may ask of this machine, derived from usable_cores(). Beyond these a run only
// takes turns on the cores (its step times measure the queue, not the work), and the counts
// the flags allow (--threads 100000) would create threads or processes until memory or the
// address space runs out. Exceeding one is a usage error naming the flag, the limit and the
// cores.
//   --threads: at most 4 x cores per process (oversubscribing a little stays possible, for
//              testing how a run behaves on a busy machine);
//   --nproc:   at most cores + 4 ranks started on this machine by `gradscope run --nproc`
//              (a few more ranks than cores stays possible, for testing several ranks on a
//              small machine; ranks that torchrun or srun start are each their own process on
//              the nodes the launcher chose, and are not counted here).
int64_t max_threads_here();
int64_t max_local_ranks_here();
void check_threads_here(int64_t threads);
void check_local_ranks_here(int64_t nproc);

// $GRADSCOPE_DATA, else ~/.cache/gradscope.
std::string data_dir();

// The whole number in environment variable `name`; nullopt when it is unset or empty. A usage
// error naming the variable and its value (with `hint`) when it is not a whole number in
// [min, max]: what a launcher or scheduler sets is input like any other.
std::optional<int64_t> env_integer(const char* name, int64_t min, int64_t max,
                                   const std::string& hint);

// "512MiB", "8GiB", "1.5GB", "1000000" -> bytes. Throws a usage error naming the text.
int64_t parse_bytes(const std::string& text);
// 1536 -> "1.50 KiB"
std::string format_bytes(double bytes);
// 1.2e9 -> "1.20 G"
std::string format_si(double value);
// Now, in UTC, as "2024-05-01T12:34:56Z" (sorts as text in time order).
std::string utc_now_iso8601();
// "1m23s", "4.2s", "850ms"; "n/a" for a negative or non-finite value
std::string format_duration(double seconds);

}  // namespace gradscope
