// What a training state keeps of the run record (steps, evaluations, the timeline, the memory
// timeline, the learning-rate search): every field of those parts comes back from a saved
// state as the record's own JSON holds it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradscope/core/json_input.h"
#include "gradscope/train/session.h"
#include "gradscope/train/train_state.h"
#include "record_keys.h"
#include "record_sample.h"
#include "test_util.h"

namespace gradscope {
namespace {

using nlohmann::json;

// The record parts a state keeps, at their places in the record and in state.json.
const std::vector<std::pair<std::string, std::string>> kKeptParts = {
    {"/steps", "/tally/steps"},
    {"/eval", "/tally/eval"},
    {"/timeline", "/tally/timeline"},
    {"/memory/timeline", "/tally/memory_timeline"},
    {"/lr_search", "/lr_search"}};

// The record whose parts `p` holds, as a finished run would write them.
json record_of_progress(const TrainProgress& p) {
  RunRecord r = testing::full_record();
  r.steps = p.tally.steps;
  r.evals = p.tally.evals;
  r.timeline = p.tally.timeline;
  r.memory->timeline = p.tally.memory_timeline;
  r.lr_search = p.lr_search;
  r.resumed_from_steps = p.resumed_from_steps;
  return record_to_json(r);
}

TEST(TrainStateRecord, TheRecordsPartsComeBackWhole) {
  testing::TempDir dir("gradscope-state-record");
  RunConfig c = testing::tiny_llama_config();
  c.steps = 2;
  Session session(c);
  const RunRecord full = testing::full_record();
  TrainProgress progress;
  progress.step = 2;
  progress.tally.steps = full.steps;
  progress.tally.evals = full.evals;
  progress.tally.timeline = full.timeline;
  progress.tally.memory_timeline = full.memory->timeline;
  progress.lr_search = full.lr_search;
  progress.resumed_from_steps = full.resumed_from_steps;
  save_train_state(dir.file("s"), session, progress);

  const json record = record_to_json(full);
  const json state =
      parse_json_input(testing::slurp(dir.file("s/state.json")), "state.json");
  for (const auto& [in_record, in_state] : kKeptParts) {
    const json& kept = state.at(json::json_pointer(in_state));
    const json& written = record.at(json::json_pointer(in_record));
    EXPECT_EQ(testing::missing_keys(json{{"part", written}}, json{{"part", kept}}),
              std::vector<std::string>{})
        << in_record;
    EXPECT_EQ(kept, written) << in_record;
  }
  EXPECT_EQ(state.at("resumed_from_steps"), record.at("resumed_from_steps"));

  const TrainProgress back = read_train_progress(dir.file("s"));
  EXPECT_EQ(record_of_progress(back), record);
}

}  // namespace
}  // namespace gradscope
