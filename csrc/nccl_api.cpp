#include "nccl_api.h"

#include "errors.h"

#include <dlfcn.h>

#include <mutex>

namespace torchtrt_dist
{
namespace
{
std::mutex gMutex;
std::string gExplicitPath;
NcclApi gApi;
bool gResolved{false};

template <typename T>
bool bind(void* handle, char const* name, T& slot, std::string& missing)
{
    slot = reinterpret_cast<T>(dlsym(handle, name));
    if (slot == nullptr)
    {
        missing += missing.empty() ? name : std::string(", ") + name;
        return false;
    }
    return true;
}

// Open NCCL: the explicit path, else the copy already in the process, else the loader's.
void* openNccl(std::string& tried)
{
    if (!gExplicitPath.empty())
    {
        tried = gExplicitPath;
        return dlopen(gExplicitPath.c_str(), RTLD_NOW | RTLD_LOCAL);
    }
    tried = "libnccl.so.2 (already loaded, RTLD_NOLOAD)";
    void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr)
    {
        tried += ", then libnccl.so.2 through the system loader";
        handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    }
    return handle;
}

bool resolveLocked()
{
    std::string tried;
    void* handle = openNccl(tried);
    if (handle == nullptr)
    {
        char const* why = dlerror();
        setLastError("cannot open NCCL: tried " + tried + " (" + (why ? why : "unknown") +
            "); import torch first (it loads NCCL) or pass the path of libnccl.so.2");
        return false;
    }
    NcclApi api;
    std::string missing;
    bind(handle, "ncclGetVersion", api.getVersion, missing);
    bind(handle, "ncclGetErrorString", api.getErrorString, missing);
    bind(handle, "ncclAllReduce", api.allReduce, missing);
    bind(handle, "ncclAllGather", api.allGather, missing);
    bind(handle, "ncclReduceScatter", api.reduceScatter, missing);
    bind(handle, "ncclBroadcast", api.broadcast, missing);
    bind(handle, "ncclSend", api.send, missing);
    bind(handle, "ncclRecv", api.recv, missing);
    bind(handle, "ncclGroupStart", api.groupStart, missing);
    bind(handle, "ncclGroupEnd", api.groupEnd, missing);
    bind(handle, "ncclCommCount", api.commCount, missing);
    if (!missing.empty())
    {
        setLastError("the NCCL found at " + tried + " lacks " + missing + " (needs NCCL >= 2.7)");
        return false;
    }
    Dl_info info{};
    api.path = dladdr(reinterpret_cast<void*>(api.getVersion), &info) && info.dli_fname
        ? info.dli_fname
        : tried;
    if (api.getVersion(&api.version) != ncclSuccess)
    {
        setLastError("ncclGetVersion failed in " + api.path);
        return false;
    }
    gApi = api;
    gResolved = true;
    return true;
}

} // namespace

bool setNcclLibrary(char const* path)
{
    std::lock_guard<std::mutex> lock(gMutex);
    gExplicitPath = path ? path : "";
    gResolved = false;
    gApi = NcclApi{};
    return gExplicitPath.empty() || resolveLocked();
}

NcclApi const* ncclApi()
{
    std::lock_guard<std::mutex> lock(gMutex);
    if (!gResolved && !resolveLocked())
    {
        return nullptr;
    }
    return &gApi;
}

} // namespace torchtrt_dist
