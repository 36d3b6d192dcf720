// The process-wide communicator registry: a group's ordered global ranks -> the ncclComm_t
// that torch.distributed's ProcessGroupNCCL owns for it. Filled from Python; the plugins only
// read it when they run (enqueue), never when TensorRT builds an engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torchtrt_dist
{

using GroupRanks = std::vector<int32_t>;

std::string describeGroup(GroupRanks const& ranks); // "[0, 2, 4]"

// Registers (or replaces) the communicator of `ranks`; false for an empty group or null comm.
bool registerCommunicator(GroupRanks const& ranks, void* comm);
// Removes the entry; false if there was none.
bool unregisterCommunicator(GroupRanks const& ranks);
// The communicator of `ranks`, or nullptr.
void* findCommunicator(GroupRanks const& ranks);
int32_t communicatorCount();
void clearCommunicators();

} // namespace torchtrt_dist
