// Which samples a run's data serve: the run's own split, or --lr auto's search split.
//
// A run trains on the training side and reports its loss on the validation side. The
// learning-rate search must not choose on the samples the run then reports (the choice would
// fit them, and the reported loss would flatter it), so its trials evaluate on a search split
// carved from the training side, train on the rest of it, and never read the validation side.
// The run itself still trains on the whole training side, search split included.
#pragma once

namespace gradscope {

enum class DataSplit {
  kRun,       // train: the training side; evaluate: the validation side
  kLrSearch,  // train: the training side less the search split; evaluate: the search
                       // split
  kAll,       // text only, for `gradscope eval`: no training side; evaluate: every
                       // token of the data set
};

}  // namespace gradscope
