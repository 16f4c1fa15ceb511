// The run record: what one attempt of a run measured, as one typed struct. Its JSON is schema
// gradscope.run/2 (docs/record.md gives every field and its unit); record_to_json and
// record_from_json are the one mapping, used by the trainer, the database, `collect`, the
// sweep and the report. Records of schema gradscope.run/1 load too: version 2 added settings
// to "config" (recompute, optimizer_step, log_grad_norm) and nothing else.
//
// A value that was not measured is nullopt here and null in the JSON, never 0. A record the
// sweep writes for a run that ended without its own (crashed, killed, past its time) has the
// identity, the configuration, the status, the failure and the attempt's elapsed time
// (time.wall_s); every other measured part is null.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/core/contention.h"
#include "gradscope/core/config.h"

namespace gradscope {

inline constexpr const char* kRunSchema = "gradscope.run/2";
inline constexpr const char* kRunSchemaV1 = "gradscope.run/1";
// The largest record file gradscope reads (a run of a million steps is about 200 MB).
inline constexpr int64_t kMaxRecordBytes = int64_t{1} << 30;
// The longest sweep name a record (and `run --sweep`) may give: the report shows it in every
// table of the sweep's runs.
inline constexpr size_t kMaxSweepLabel = 256;

enum class RunStatus {
  kOk,
  kOom,       // out of memory (allocator, --memory-cap, or the sweep's memory limit)
  kDiverged,  // the loss became NaN or infinite, or rose above --diverge-above x the first
  kTimeout,   // --timeout, or the sweep's run_timeout
  kError,     // any other failure of the run
  kCrashed,   // the process ended without a record (the sweep writes it)
  // stopped by SIGTERM or SIGINT between steps (or with its sweep): not finished, and not a
  // failure; with --save-state, --resume continues it (docs/training-state.md)
  kInterrupted,
};
const char* status_name(RunStatus s);  // "ok", "oom", ...
std::optional<RunStatus> parse_status(const std::string& name);
// ok, oom and diverged end a run for good (they are what the configuration does); error,
// crashed and timeout may be retried; interrupted is resumed or started again.
bool is_final_status(RunStatus s);

// A memory method tried against the cap of a run that ran out of memory (train/fit_hint.h):
// the run's own settings with the method's flags added, and the estimate's peak for them.
struct MemoryMethodFit {
  std::string method;  // "chunked loss", "recompute attention in every block", ...
  // Why it costs what it costs, the rule's tiers in order: "keeps the math and the compute",
  // "recomputes", "changes what is trained or its precision", "needs more devices".
  std::string cost;
  std::vector<std::string> flags;     // to add to the run's command line: {"--loss", "chunked"}
  int64_t estimated_peak_bytes = 0;   // one rank's with --nproc
  bool fits = false;                  // estimated_peak_bytes <= the cap
  std::optional<double> recompute_flops_per_step;  // what a checkpoint runs again; recompute only
};

// What the estimate says would have fitted the cap under the run's settings.
struct MemoryFit {
  int64_t cap_bytes = 0;
  int64_t estimated_peak_bytes = 0;  // the run as it was configured
  int64_t max_batch = 0;  // the largest --batch whose estimated peak fits; 0: not even 1
  std::optional<MemoryMethodFit> cheapest;  // the first of `tried` that fits, if any
  std::vector<MemoryMethodFit> tried;       // every method gradscope allows here, cheapest first
};

// Live bytes of one label of the tracking allocator (core/memory_timeline.h's TimelineLabel):
// its component ("activations"), module ("block 1 attention"; "" when nothing named it) and
// phase.
struct MemoryLabelBytes {
  std::string component;
  std::string module;
  std::string phase;
  int64_t bytes = 0;
};

// The most labels a failure's `live` keeps, largest first; the others are summed.
inline constexpr size_t kFailureLiveLabels = 12;

// What memory looked like when a run ran out of it. Under --memory-cap on the CPU, the tracking
// allocator's refusal: the request and who made it, the live bytes and the cap, the largest
// labels live then and their sum by component. On CUDA only what the caching allocator says
// (its reserved peak) and the cap; never figures of another source standing in for those.
struct FailureMemory {
  std::optional<int64_t> cap_bytes;
  std::optional<int64_t> live_bytes;
  std::optional<MemoryLabelBytes> request;  // bytes: what was asked for
  std::vector<MemoryLabelBytes> live;       // at most kFailureLiveLabels, largest first
  std::optional<int64_t> live_rest_bytes;   // the labels left out of `live`, summed
  std::vector<MemoryLabelBytes> live_by_component;  // module and phase "", largest first
  std::optional<int64_t> reserved_peak_bytes;       // CUDA's caching allocator
  std::optional<MemoryFit> fit;  // null without a cap or without an estimate of the run
};

// Where a failed run stopped. Step and phase are unknown for a run the sweep had to record.
struct RunFailure {
  RunFailure() = default;
  RunFailure(std::optional<int64_t> step, std::optional<std::string> phase, std::string message)
      : step(step), phase(std::move(phase)), message(std::move(message)) {}

  std::optional<int64_t> step;       // 1-based, warm-up steps included
  std::optional<std::string> phase;  // data, forward, backward, optimizer
  std::string message;
  std::optional<FailureMemory> memory;  // status oom, when the run recorded it itself
};

// One optimizer step (warm-up included).
struct StepEntry {
  int64_t step = 0;                 // 1-based
  std::optional<double> loss;       // mean per-target loss of the step's effective batch
  double lr = 0;                    // the learning rate the step used
  std::optional<double> grad_norm;  // global L2 norm before clipping; null when not taken
  double time_s = 0;
  int64_t samples = 0;
  int64_t tokens = 0;
  int64_t targets = 0;
  int64_t evaluations = 1;  // forward + backward passes over the step's batch
  bool warmup = false;
  // Joules of this step by the run's energy source (timed steps only; absent for warm-up
  // steps and in records written before it existed).
  std::optional<double> energy_j;
  // What competed for the cores during this step (timed steps only; core/contention.h).
  StepContention contention;
};

struct EvalEntry {
  int64_t step = 0;  // steps done when evaluated
  std::optional<double> val_loss;
  std::optional<double> accuracy;  // classifiers only
};

struct RunTime {
  std::optional<double> total_s;  // sum of the timed steps' time_s
  std::optional<double> wall_s;   // the whole run: warm-up and evaluation included
  std::optional<double> step_median_s;
  // Per phase, summed over the timed steps; null without phase timing.
  std::optional<double> data_s, forward_s, backward_s, optimizer_s;
  // Waiting on collectives between ranks (--shard); null for one process.
  std::optional<double> comm_s;
  std::optional<int64_t> timed_steps;
};

struct RunThroughput {
  std::optional<double> samples_per_s;
  std::optional<double> tokens_per_s;
};

// The peak split into what was allocated at the moment of the peak (the parts sum to the
// peak); null parts were not measured.
struct MemoryBreakdown {
  int64_t params = 0;            // the parameters that train (all of them without LoRA)
  int64_t frozen_params = 0;     // parameters that do not train (LoRA's base weights)
  std::optional<int64_t> grads;  // null when no buffer of every gradient exists (fused step)
  int64_t optimizer_state = 0;
  std::optional<int64_t> activations;  // null without phase timing
  int64_t other = 0;
  // Of activations, what the loss head of a language model held (its logits, turned into
  // their gradient, with --loss full): a part of activations, not a summand; null without such
  // a head or without phase timing.
  std::optional<int64_t> logits;
  // With --shard: the buffers of collectives (buckets being reduced, shards being gathered),
  // the most alive at once, when the peak fell in backward or communication; null for one
  // process.
  std::optional<int64_t> collective_buffers;
};

// One phase of a step, as the memory timeline holds it: [phase, entry, peak, exit].
struct PhaseMemory {
  std::string phase;
  int64_t entry_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t exit_bytes = 0;
};

struct StepMemory {
  int64_t step = 0;
  std::vector<PhaseMemory> phases;  // in the order entered
};

struct PhasePeaks {
  int64_t data = 0, forward = 0, backward = 0, optimizer = 0;
  std::optional<int64_t> comm;  // with --shard
};

// The steps a memory timeline recorded (--memory-timeline, --memory-snapshot on the CPU) and
// the allocator's own peak over them: peak_bytes above covers the whole run, warm-up included.
struct MemoryWindow {
  int64_t first_step = 0, last_step = 0;  // 1-based, inclusive
  int64_t peak_bytes = 0;
};

// One of the record's memory figures beside the others (docs/metrics.md, "Which memory
// number to read"): what it counts, its peak over the run, and how far that lies above the
// live tensors' peak (peak_bytes): on the CPU the heap's free blocks, LibTorch's own memory and
// everything else in the process; on CUDA the caching allocator's cached and fragmented bytes.
struct MemoryFigure {
  std::string figure;  // the record's key: "peak_bytes", "reserved_peak_bytes", ...
  std::string counts;  // "live tensors", "allocator reserved", "process resident", ...
  int64_t bytes = 0;
  int64_t over_live_bytes = 0;  // bytes - peak_bytes
};

struct RunMemory {
  int64_t peak_bytes = 0;
  MemoryBreakdown breakdown;
  // When the peak happened: the phase ("data", "forward", "backward", "optimizer", or "between
  // steps") and the step (1-based, warm-up included); null without phase timing.
  std::optional<std::string> peak_phase;
  std::optional<int64_t> peak_step;
  std::vector<StepMemory> timeline;  // every timed step, with phase timing
  int64_t params_bytes = 0;          // every parameter, frozen ones included
  int64_t frozen_params_bytes = 0;   // of params_bytes, what does not train (LoRA's base)
  std::optional<int64_t> grads_bytes;
  int64_t optimizer_state_bytes = 0;
  std::optional<int64_t> activations_peak_bytes;
  // Bytes the loss head of a language model left allocated when its forward ended (what it
  // keeps for backward), the most over the timed micro-batches; null without such a head.
  std::optional<int64_t> logits_bytes;
  std::optional<PhasePeaks> phase_peak_bytes;
  std::optional<int64_t> reserved_peak_bytes;  // CUDA's caching allocator only
  std::optional<int64_t> peak_rss_bytes;       // null where the system does not say
  std::optional<MemoryWindow> window;          // with a memory timeline
  std::vector<MemoryFigure> figures;           // the figures above this device has, side by side
};

struct RunUtilization {
  std::string device;  // "cpu" or "gpu"
  std::optional<double> mean_pct, p50_pct, p95_pct;
  int64_t samples = 0;
  std::string source;
};

// One sample of the sampler's series (or, without the sampler, one per timed step).
struct TimelineSample {
  double t_s = 0;  // from the first timed step
  std::optional<int64_t> allocated_bytes;
  std::optional<double> util_pct;
  std::optional<double> cpu_util_pct;
  std::optional<int64_t> rss_bytes;
  std::optional<double> gpu_util_pct;
  std::optional<int64_t> gpu_memory_used_bytes;
  std::optional<double> power_w;
  std::optional<double> sm_clock_mhz;
  std::optional<double> energy_j;
};

struct RunEnergy {
  std::optional<double> joules;
  std::optional<std::string> source;  // "rapl", "nvml", "estimate", ...
  std::optional<double> co2_g;
  std::optional<std::string> detail;
};

struct SamplerInfo {
  double period_s = 0;
  int64_t samples = 0;
  double busy_s = 0;
  std::string gpu;
  std::string rapl;
};

struct RunFlops {
  double per_step = 0;           // model FLOPs of one optimizer step (3 x forward)
  double hardware_per_step = 0;  // with the forward a checkpoint recomputes
  std::optional<double> achieved_per_s;
  std::optional<double> mfu, hfu;
  std::optional<double> peak_per_s;
  std::optional<std::string> peak_source;
  std::string formula;
};

struct RunEnv {
  std::string gradscope;
  std::string libtorch;
  std::optional<std::string> cuda;
  std::string device_name;
  int threads = 0;
  int blas_threads = 0;
  std::string git_commit;
  std::string host;
  std::string build;
};

// One trial of --lr auto.
struct LrTrial {
  double lr = 0;
  int64_t steps = 0;
  std::optional<double> final_loss;
  std::optional<double> val_loss;
  std::string status;
  std::optional<double> time_s;
};

// Toy problems: where the optimizer ended and the known minimum.
struct ToyResult {
  std::vector<double> final_params;
  double min_loss = 0;
  std::vector<double> min_params;
  double distance = 0;  // ||final - minimum||
};

// One rank's figures of a run with several ranks (rank 0 gathers them at the end).
struct RankFigures {
  int64_t rank = 0;
  int64_t peak_bytes = 0;
  MemoryBreakdown breakdown;  // at this rank's peak, as RunMemory::breakdown
  std::optional<std::string> peak_phase;
  int64_t params_bytes = 0;            // what this rank holds of the parameters
  std::optional<int64_t> grads_bytes;  // of the gradients (zero2: its shard)
  int64_t optimizer_state_bytes = 0;   // of the optimizer state (zero: its shard)
  int64_t collective_buffer_peak_bytes = 0;
  std::optional<double> step_median_s;
  std::optional<double> comm_s;  // waiting on collectives over the timed steps
  std::optional<double> backward_s;
  // Bytes this rank sends per timed step by the ring algorithms' volume (docs/metrics.md).
  std::optional<double> bytes_sent_per_step;
  // Seconds per timed step this rank was blocked on collectives: the exposed communication.
  std::optional<double> comm_wait_per_step_s;
  // Of the gradients all-reduced, the share whose bucket had finished when backward ended.
  std::optional<double> overlapped_share;
};

nlohmann::json rank_figures_to_json(const RankFigures& f);
// A usage error names `path` and the key of a value of the wrong type.
RankFigures rank_figures_from_json(const nlohmann::json& j, const std::string& path = "rank");

// The link between the hosts of a run's ranks, measured as they met (docs/metrics.md).
struct RunLink {
  int64_t probe_bytes = 0;  // the buffer all-reduced
  int64_t repeats = 0;
  double best_s = 0;        // the fastest all-reduce of it
  double bus_bytes_per_s = 0;  // 2(N-1)/N x probe_bytes / best_s
};

// How a run with several ranks was spread (null for one process).
struct RunDistributed {
  int64_t world = 1;
  std::string shard;               // ddp, zero1, zero2, fsdp
  std::string launcher;            // gradscope, torchrun, slurm (or "single" for one rank)
  std::string backend;             // gloo, or "none" for one rank
  int64_t flat_params = 0;         // trainable elements laid end to end
  int64_t shard_params = 0;        // of them, one rank's share (zero, fsdp) or all (ddp)
  std::vector<RankFigures> ranks;  // in rank order
  // Distinct hosts among the ranks, and each rank's host in rank order (as the ranks told each
  // other when they met; empty in records that predate it).
  int64_t nnodes = 1;
  std::vector<std::string> hosts;
  std::optional<std::string> interface;  // the network interface named for the ranks
  std::optional<RunLink> link;           // with several hosts
};

struct RunRecord {
  std::string schema = kRunSchema;
  std::string run_id;
  std::string attempt_uid;  // one attempt of the run; "" until the attempt is stored
  std::optional<std::string> sweep;
  // The configuration as it ran: the run's settings with its defaults resolved (learning
  // rate, sequence length, data set, tokenizer); `arch` is the resolved architecture (in the
  // JSON, config.arch).
  RunConfig config;
  nlohmann::json arch;  // null when the run never resolved one
  RunStatus status = RunStatus::kOk;
  std::optional<RunFailure> failure;
  std::optional<int64_t> params;
  // Parameters that train (all but LoRA's frozen base); null in records that predate it.
  std::optional<int64_t> trainable_params;
  nlohmann::json data;  // what the data source says of itself (kind-specific)
  std::vector<StepEntry> steps;
  std::vector<EvalEntry> evals;
  std::optional<double> final_loss;
  std::optional<double> final_val_loss;
  std::optional<double> final_accuracy;
  std::optional<std::vector<LrTrial>> lr_search;
  // The steps (warm-up included) at which this attempt, or the attempts it continues,
  // resumed from a training state (--resume), in order; empty for a run trained in one go.
  std::vector<int64_t> resumed_from_steps;
  std::optional<ToyResult> toy;
  nlohmann::json estimate;  // `gradscope estimate`'s prediction, null where it has no model
  // The update rule where it is not the optimizer's own: "adama" (Adam's second moment
  // accumulated per micro-batch: accumulation+fused with adam or adamw); nullopt otherwise.
  std::optional<std::string> update_rule;
  std::optional<RunTime> time;
  std::optional<RunThroughput> throughput;
  std::optional<RunMemory> memory;
  std::optional<RunDistributed> distributed;
  std::optional<RunUtilization> utilization;
  // What competed for the cores over the timed steps, and whether that disturbed the run's
  // timings; null in records written before it was measured.
  std::optional<RunContention> contention;
  std::vector<TimelineSample> timeline;
  std::optional<RunEnergy> energy;
  std::optional<SamplerInfo> sampler;
  std::optional<RunFlops> flops;
  std::optional<RunEnv> env;
  std::string started_at;  // UTC, ISO 8601; "" until set
  std::string finished_at;
  std::optional<std::string> log;  // the output of a run the sweep recorded

  bool ok() const { return status == RunStatus::kOk; }
};

// A measured value as the record holds it: nullopt when it is NaN or infinite.
std::optional<double> finite_or_null(double v);

// The JSON of schema gradscope.run/2.
nlohmann::json record_to_json(const RunRecord& record);
// A record of schema 1 or 2. A usage error names the first field that is missing where it is
// required (schema, run_id, config, status) or has the wrong type, or an unknown schema.
RunRecord record_from_json(const nlohmann::json& json);

}  // namespace gradscope
