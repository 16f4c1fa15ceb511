// What ranks settle once they have met, before they train: that they are one run of one build,
// and, on several hosts, what the link between them carries.
#pragma once

#include <optional>

#include "gradscope/comm/comm.h"
#include "gradscope/core/config.h"

namespace gradscope {

// Every rank tells the others its build (gradscope's version and commit, LibTorch's version,
// the build type and the executable's size) and the settings that define the run (those in
// its id, with --dist-timeout); a usage error on every rank names the first rank, its host
// and what differs from rank 0's, so that no rank trains a run other than rank 0's.
void check_same_run(Communicator& comm, const RunConfig& config);

// On several hosts, the link between them measured (Communicator::probe_link: 256 KiB up to
// 64 MiB, best of 3); nullopt on one host.
std::optional<LinkProbe> probe_hosts_link(Communicator& comm);

}  // namespace gradscope
