// The configuration of one run: a plain struct (leveldb's Options) whose every field is one
// row of the settings table (core/settings.h). The table gives each its flag, TOML key, record
// key, help, check and role; the defaults are the member initializers below, so that a
// default-constructed RunConfig is the documented default run.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gradscope {

// --dtype: the dtype the matrix products run in.
enum class Dtype {
  kFp32,  // float32 everywhere
  kBf16,  // bfloat16 autocast; parameters, gradients and optimizer state stay float32
};

// --lr-schedule
enum class LrSchedule {
  kConstant,
  kCosine,  // linear warm-up over --lr-warmup-steps, then cosine to 0
};

// --recompute (and --checkpoint-policy): what a checkpointed block recomputes in backward.
enum class Recompute {
  kNone,       // nothing: every activation is kept for backward
  kFull,       // the whole block (least memory, one extra forward of it)
  kAttention,  // only its attention sub-layer (keeps the MLP's activations)
  kMlp,        // only its MLP sub-layer
};

// --optimizer-step: where the parameters are updated.
enum class OptimizerStep {
  kAfterBackward,  // one optimizer step over all gradients once backward ends
  kInBackward,     // each parameter as soon as its gradient is complete (fused)
};

// --loss: how a language-model head takes its cross-entropy.
enum class LossKind {
  kFull,     // the logits of every position at once, then their cross-entropy
  kChunked,  // --loss-chunk positions at a time; the logits are never held for the whole
                 // batch, and each chunk's gradients are taken in forward while they exist
};

// --projections: how the projections that read the same input are multiplied.
enum class Projections {
  kSeparate,  // one matrix product per projection (q, k, v; gate, up)
  kPacked,    // one product over the stacked weights of q, k and v, and of gate
                         // and up; the parameters stay separate tensors
};

// --attention: how attention's softmax(QK^T / sqrt(d) + mask) V is computed.
enum class Attention {
  kAuto,  // sdpa where it runs a fused kernel (CUDA; the CPU without dropout), else math
  kSdpa,  // LibTorch's scaled_dot_product_attention, which picks its own kernel
  kMath,  // written out: the (B, heads, T, S) scores and weights are materialized
};

// How the work of a step is spread over --nproc ranks (processes, one per device).
enum class Shard {
  kNone,   // one process
  kDdp,    // every rank holds everything; gradients all-reduced in buckets during backward
  kZero1,  // optimizer state split over the ranks (ZeRO stage 1)
  kZero2,  // optimizer state and gradients split (ZeRO stage 2)
  kFsdp,   // also the parameters, gathered per block for its forward and backward (ZeRO-3)
};

// --grad-reduce: how fsdp reduces a block's gradients to the rank that keeps each shard.
enum class GradReduce {
  kAllReduce,      // the whole unit summed on every rank; each keeps its shard
  kReduceScatter,  // c10d's reduce-scatter: each rank receives only its shard's sum
};

// --strategy: the study's memory strategies, each a shorthand for a way of computing a step.
// "standard" is none of the parts; the others join the parts they use with '+', in the order
// checkpoint, accumulation, fused ("checkpoint+accumulation").
struct StrategyShorthand {
  bool checkpoint = false;    // recompute blocks in backward (--checkpoint-policy says what)
  bool accumulation = false;  // micro-batches (--accum-steps of them)
  bool fused = false;         // the optimizer steps in backward
  bool operator==(const StrategyShorthand& o) const {
    return checkpoint == o.checkpoint && accumulation == o.accumulation && fused == o.fused;
  }
};

// How one optimizer step is computed, resolved from --strategy and the settings that refine it
// (--recompute, --checkpoint-policy, --checkpoint-every, --accum-steps, --optimizer-step).
// Without --strategy the settings alone say it: --accum-steps 4 is accumulation. A strategy
// fixes the parts it names, and the settings may only refine them: checkpoint recomputes
// (full, or as --recompute / --checkpoint-policy say), standard and fused take one batch.
struct StepPlan {
  Recompute recompute = Recompute::kNone;
  int64_t recompute_every = 1;  // blocks 0, k, 2k, ... are recomputed
  int64_t accum_steps = 1;      // micro-batches per optimizer step
  bool micro_batches = false;   // accumulation asked for (by name or by accum_steps > 1)
  OptimizerStep optimizer_step = OptimizerStep::kAfterBackward;
  // The loss of a language-model head, which combines with every part above (and is not in
  // the strategy's name).
  LossKind loss = LossKind::kFull;
  int64_t loss_chunk = 0;  // positions per chunk with kChunked
  // What a checkpoint keeps of its input until backward: as computed, or rounded to bfloat16.
  Dtype saved_input = Dtype::kFp32;

  // The strategy's name: "standard", or the parts in use joined by '+' (as StrategyShorthand).
  // The study's five strategies keep the names they had, so run ids stay as they were.
  std::string strategy_name() const;
};

struct RunConfig {
  // --- what is trained ---
  std::string model = "llama";
  std::string preset = "tiny";
  std::string dataset;                                // "" = the model's
  std::string tokenizer;                              // "" = the preset's
  std::optional<double> dropout;                      // unset = the model's published dropout
  std::map<std::string, std::string> arch_overrides;  // --arch NAME=VALUE

  // --- how it is optimized ---
  std::string optimizer = "adam";
  double lr = 0;         // 0 = the optimizer's default for the model
  bool lr_auto = false;  // --lr auto
  // How a fixed --lr was chosen, in words ("" = not said): recorded, not in the run id.
  std::string lr_chosen_by;
  int64_t lr_search_trials = 5;
  int64_t lr_search_steps = 0;             // 0 = a tenth of --steps, at least 10
  double lr_search_span = 1.0;             // decades either side of the default
  std::map<std::string, std::string> opt;  // --opt NAME=VALUE, PyTorch's names
  double weight_decay = 0;
  LrSchedule lr_schedule = LrSchedule::kConstant;
  int64_t lr_warmup_steps = 0;
  double clip_grad_norm = 0;  // 0 = off

  // --- how a step is computed (memory) ---
  // Unset: the step is what the settings below say; given: they must agree with it.
  std::optional<StrategyShorthand> strategy;
  std::optional<Recompute> recompute;          // unset = as --strategy says, else none
  std::optional<Recompute> checkpoint_policy;  // unset = full; never none
  int64_t checkpoint_every = 1;
  Dtype saved_input = Dtype::kFp32;  // --saved-input: what a checkpoint keeps its input in
  int64_t accum_steps = 1;
  std::optional<OptimizerStep> optimizer_step;  // unset = as --strategy says
  LossKind loss = LossKind::kFull;
  int64_t loss_chunk = 256;  // positions per chunk of --loss chunked
  Projections projections = Projections::kSeparate;
  Attention attention = Attention::kAuto;
  // Weights to start from instead of a seeded initialisation: a folder with config.json and
  // model.safetensors (or a sharded set), or one .safetensors file; "" = the seed's.
  std::string init_from;
  std::string init_adapters;  // with LoRA: a PEFT adapters folder the adapters start from
  // --- adapters (LoRA, Hu et al. 2022): low-rank updates of the blocks' projections, the
  // rest frozen. Empty targets: every parameter trains.
  std::vector<std::string> lora_targets;  // of lora_target_names(), in that order
  int64_t lora_rank = 8;
  double lora_alpha = 16;   // the update is scaled by alpha / rank
  double lora_dropout = 0;  // on the adapter's input, in training only
  bool lora() const { return !lora_targets.empty(); }

  // --- shape of the work ---
  int64_t batch = 8;    // micro-batch of one rank; effective batch = batch * accum_steps
  int64_t seq_len = 0;  // 0 = the preset's
  int64_t steps = 100;
  int64_t warmup_steps = 2;
  uint64_t seed = 0;

  // --- evaluation ---
  int64_t eval_every = 0;  // 0 = only at the end
  int64_t eval_batches = 8;

  // --- where it runs ---
  std::string device = "cpu";  // cpu | cuda | cuda:N
  // Ranks (processes) that train together; each reads its share of every micro-batch, so a
  // step sees global_batch() samples.
  int64_t nproc = 1;
  // Hosts the ranks are spread over, nproc / nnodes on each (torchrun's vocabulary). With
  // several, each host starts its own ranks (`gradscope run --nnodes M --node-rank R ...`)
  // and they meet at master_addr:master_port, which node 0's launcher hosts.
  int64_t nnodes = 1;
  int64_t nproc_per_node = 0;  // as given (--nproc-per-node); 0 = not given, nproc holds all
  int64_t node_rank = 0;
  std::string master_addr;    // with nnodes > 1: node 0's address, reachable from every host
  int64_t master_port = 29500;
  std::string ifname;  // the network interface the ranks use ("" = GLOO_SOCKET_IFNAME, else
                       // the address the host name resolves to)
  // A name for the interconnect between the hosts ("" = none): in the run id, so that the same
  // run on two networks is two runs.
  std::string network;
  Shard shard = Shard::kNone;
  GradReduce grad_reduce = GradReduce::kAllReduce;
  int64_t bucket_bytes = 25LL << 20;  // gradients reduced together (ddp, zero) or gathered
  double dist_timeout_s = 120;        // a collective that waits longer fails the run
  Dtype dtype = Dtype::kFp32;
  int threads = 0;               // 0 = LibTorch's default
  int64_t memory_cap_bytes = 0;  // 0 = no cap
  double timeout_s = 0;          // 0 = no limit
  double diverge_above = 10;     // a loss above this multiple of the first ends the run; 0 = off

  // --- how it is measured ---
  double sample_period_s = 0.1;  // 0 = no sampler
  bool phase_timing = true;
  bool log_grad_norm = true;  // the global gradient norm of every step, in the record
  double watts_per_core = 10.0;
  double grid_g_per_kwh = 0;  // 0 = no carbon figure

  // --- outputs ---
  std::string memory_snapshot;  // CUDA allocator history file, "" = none
  std::string memory_timeline;  // the columnar memory timeline (core/memory_timeline.h), "" = none
  std::string memory_steps;     // its steps, "A" or "A-B" (1-based); "" = the first timed step
  int64_t memory_timeline_cap_bytes = int64_t{256} << 20;  // its file's size cap
  std::string db_path = "gradscope.db";
  std::string json_path;       // "" = no JSON record
  std::string sweep;           // the sweep the run belongs to, "" for a single run
  std::string save_weights;    // folder for config.json + model.safetensors at the end, "" = none
  std::string save_state;      // folder for the training state, "" = none
  int64_t state_every = 0;     // save the training state every N steps (0 = only when stopped)
  std::string resume;          // training state folder to continue from, "" = from step 0
  bool save_adapters = false;  // with LoRA: --save-weights writes the adapters alone
  bool quiet = false;

  // Samples of one optimizer step on one rank, and over all ranks.
  int64_t effective_batch() const { return batch * accum_steps; }
  int64_t global_batch() const { return effective_batch() * nproc; }
  // n ranks on one host: what a reference run or a what-if of this configuration is.
  void set_ranks_on_one_host(int64_t n) {
    nproc = n;
    nnodes = 1;
    nproc_per_node = 0;
    node_rank = 0;
    master_addr.clear();
  }
  // How a step is computed, from the strategy and the settings that refine it. A usage error
  // when they disagree (--strategy standard with --accum-steps 4, --recompute attention with
  // --checkpoint-policy mlp).
  StepPlan step_plan() const;
  // The same, but never refusing: where the parts disagree, the strategy's name wins and the
  // other settings are taken as given. For what a record says of a configuration that was
  // refused (a failed attempt's record), so that writing or grouping it cannot fail.
  StepPlan step_plan_as_given() const;
  // step_plan_as_given().strategy_name(): the name the record and every table show.
  std::string strategy_label() const { return step_plan_as_given().strategy_name(); }
};

// Names of the enumerations, as flags and records write them ("bf16", "cosine", "mlp",
// "in-backward"), and back (nullopt for an unknown name).
const char* dtype_name(Dtype d);
const char* lr_schedule_name(LrSchedule s);
const char* recompute_name(Recompute r);
const char* optimizer_step_name(OptimizerStep s);
const char* loss_kind_name(LossKind k);
const char* projections_name(Projections p);
const char* attention_name(Attention a);
const char* shard_name(Shard s);
const char* grad_reduce_name(GradReduce g);
std::string strategy_name(const StrategyShorthand& s);
// Every value's name, in declaration order: the settings table's choices.
std::vector<std::string> dtype_names();
std::vector<std::string> lr_schedule_names();
std::vector<std::string> recompute_names();
std::vector<std::string> optimizer_step_names();
std::vector<std::string> loss_kind_names();
std::vector<std::string> projections_names();
std::vector<std::string> attention_names();
std::vector<std::string> shard_names();
std::vector<std::string> grad_reduce_names();
std::optional<Dtype> parse_dtype(const std::string& name);
std::optional<LrSchedule> parse_lr_schedule(const std::string& name);
std::optional<Recompute> parse_recompute(const std::string& name);
std::optional<OptimizerStep> parse_optimizer_step(const std::string& name);
std::optional<LossKind> parse_loss_kind(const std::string& name);
std::optional<Projections> parse_projections(const std::string& name);
std::optional<Attention> parse_attention(const std::string& name);
std::optional<Shard> parse_shard(const std::string& name);
std::optional<GradReduce> parse_grad_reduce(const std::string& name);
std::optional<StrategyShorthand> parse_strategy(const std::string& name);

// The projections LoRA can adapt, in canonical order: q, k, v, o, gate, up, down.
const std::vector<std::string>& lora_target_names();

// The study's strategies and the fused step, with what each does, in documentation order.
// --strategy also takes the other combinations of the parts by name ("checkpoint+fused").
struct StrategyDescription {
  std::string name;
  std::string description;
};
const std::vector<StrategyDescription>& strategy_shorthands();
// The settings that combine with every strategy ("--loss chunked"), with what each trades, in
// documentation order.
const std::vector<StrategyDescription>& step_options();

// The steps --memory-steps names, 1-based and inclusive ({first, last}); without it the first
// timed step. A usage error naming the flag for text that is not A or A-B with
// 1 <= A <= B <= warm-up + steps.
std::pair<int64_t, int64_t> memory_window_steps(const RunConfig& c);

}  // namespace gradscope
