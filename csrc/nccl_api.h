// NCCL resolved at run time (dlopen/dlsym): the library never links libnccl, so it uses the
// copy torch already loaded (dlopen with RTLD_NOLOAD on the soname) or an explicit path.
#pragma once

#include <nccl.h>

#include <string>

namespace torchtrt_dist
{

struct NcclApi
{
    decltype(&ncclGetVersion) getVersion{nullptr};
    decltype(&ncclGetErrorString) getErrorString{nullptr};
    decltype(&ncclAllReduce) allReduce{nullptr};
    decltype(&ncclAllGather) allGather{nullptr};
    decltype(&ncclReduceScatter) reduceScatter{nullptr};
    decltype(&ncclBroadcast) broadcast{nullptr};
    decltype(&ncclSend) send{nullptr};
    decltype(&ncclRecv) recv{nullptr};
    decltype(&ncclGroupStart) groupStart{nullptr};
    decltype(&ncclGroupEnd) groupEnd{nullptr};
    decltype(&ncclCommCount) commCount{nullptr};
    int version{0};     // ncclGetVersion's code, e.g. 23007 for 2.30.7
    std::string path;   // where the symbols came from (dladdr), for messages
};

// Use the NCCL at `path` (nullptr/empty: forget any explicit path). Returns false (and sets the
// last error) if it cannot be opened or lacks a symbol. Call before the first collective.
bool setNcclLibrary(char const* path);

// The resolved NCCL (resolving it on first use), or nullptr with the last error set.
NcclApi const* ncclApi();

} // namespace torchtrt_dist
