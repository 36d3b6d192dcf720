#include "registry.h"

#include <map>
#include <mutex>

namespace torchtrt_dist
{
namespace
{
std::mutex gMutex;
std::map<GroupRanks, void*>& table()
{
    static std::map<GroupRanks, void*> entries;
    return entries;
}
} // namespace

std::string describeGroup(GroupRanks const& ranks)
{
    std::string text = "[";
    for (size_t i = 0; i < ranks.size(); ++i)
    {
        text += (i ? ", " : "") + std::to_string(ranks[i]);
    }
    return text + "]";
}

bool registerCommunicator(GroupRanks const& ranks, void* comm)
{
    if (ranks.empty() || comm == nullptr)
    {
        return false;
    }
    std::lock_guard<std::mutex> lock(gMutex);
    table()[ranks] = comm;
    return true;
}

bool unregisterCommunicator(GroupRanks const& ranks)
{
    std::lock_guard<std::mutex> lock(gMutex);
    return table().erase(ranks) > 0;
}

void* findCommunicator(GroupRanks const& ranks)
{
    std::lock_guard<std::mutex> lock(gMutex);
    auto const found = table().find(ranks);
    return found == table().end() ? nullptr : found->second;
}

int32_t communicatorCount()
{
    std::lock_guard<std::mutex> lock(gMutex);
    return static_cast<int32_t>(table().size());
}

void clearCommunicators()
{
    std::lock_guard<std::mutex> lock(gMutex);
    table().clear();
}

} // namespace torchtrt_dist
