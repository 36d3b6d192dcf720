// The library's exported symbols: TensorRT's dynamic-loading entry points (getCreators,
// setLoggerFinder; what IPluginRegistry::loadLibrary and trtexec --dynamicPlugins look up) and
// a small C API for Python (ctypes) and the tests. Everything else is hidden.
#include "collective_plugin.h"
#include "errors.h"
#include "nccl_api.h"
#include "registry.h"

#include <atomic>
#include <memory>

#define TTD_EXPORT extern "C" __attribute__((visibility("default")))

namespace
{
// Kept, never called: ILogger's layout differs between TensorRT 10 and 11, and this library may
// be built against either's headers and loaded by the other. Errors go to ttd_last_error/stderr.
std::atomic<nvinfer1::ILoggerFinder*> gLoggerFinder{nullptr};

torchtrt_dist::GroupRanks toRanks(int32_t const* ranks, int32_t n)
{
    return ranks && n > 0 ? torchtrt_dist::GroupRanks(ranks, ranks + n) : torchtrt_dist::GroupRanks{};
}
} // namespace

TTD_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    gLoggerFinder.store(finder);
}

TTD_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    return torchtrt_dist::allCreators(nbCreators);
}

//! Version of this C API (bumped when a signature changes).
TTD_EXPORT int32_t ttd_abi_version()
{
    return 1;
}

TTD_EXPORT char const* ttd_last_error()
{
    return torchtrt_dist::lastError().c_str();
}

//! 0 on success; -1 (see ttd_last_error) for an empty group or a null communicator.
TTD_EXPORT int32_t ttd_register_communicator(int32_t const* ranks, int32_t n, void* comm)
{
    if (!torchtrt_dist::registerCommunicator(toRanks(ranks, n), comm))
    {
        torchtrt_dist::setLastError("register_communicator needs a non-empty group and a non-null ncclComm_t", false);
        return -1;
    }
    return 0;
}

//! 1 if an entry was removed, 0 if the group had none.
TTD_EXPORT int32_t ttd_unregister_communicator(int32_t const* ranks, int32_t n)
{
    return torchtrt_dist::unregisterCommunicator(toRanks(ranks, n)) ? 1 : 0;
}

TTD_EXPORT void* ttd_find_communicator(int32_t const* ranks, int32_t n)
{
    return torchtrt_dist::findCommunicator(toRanks(ranks, n));
}

TTD_EXPORT int32_t ttd_communicator_count()
{
    return torchtrt_dist::communicatorCount();
}

TTD_EXPORT void ttd_clear_communicators()
{
    torchtrt_dist::clearCommunicators();
}

//! Use the NCCL at `path` (null: the one already loaded). 0 on success, -1 otherwise.
TTD_EXPORT int32_t ttd_set_nccl_library(char const* path)
{
    return torchtrt_dist::setNcclLibrary(path) ? 0 : -1;
}

//! ncclGetVersion of the resolved NCCL (e.g. 23007), or -1 (see ttd_last_error).
TTD_EXPORT int32_t ttd_nccl_version()
{
    torchtrt_dist::NcclApi const* api = torchtrt_dist::ncclApi();
    return api ? api->version : -1;
}

//! File the NCCL symbols were resolved from ("" before resolution or on failure).
TTD_EXPORT char const* ttd_nccl_path()
{
    torchtrt_dist::NcclApi const* api = torchtrt_dist::ncclApi();
    return api ? api->path.c_str() : "";
}

//! Creates the runtime plugin for `op` (CollectiveOp number) through its creator, exactly as
//! TensorRT does when it deserializes an engine, and runs its onShapeChange + enqueue on device
//! pointers `input`/`output` (input dims `dims`) on `stream`. Returns enqueue's status (0: ok).
//! For tests on machines without TensorRT; engines call enqueue themselves.
TTD_EXPORT int32_t ttd_run_plugin(int32_t op, int32_t const* ranks, int32_t n, int32_t typeId, int32_t reduceOp,
    int32_t root, int64_t const* dims, int32_t nbDims, void const* input, void* output, void* stream)
{
    using namespace nvinfer1;
    int32_t count = 0;
    IPluginCreatorInterface* const* creators = torchtrt_dist::allCreators(count);
    if (op < 0 || op >= count || nbDims < 1 || nbDims > Dims::MAX_DIMS)
    {
        torchtrt_dist::setLastError("ttd_run_plugin: op must be 0..4 and the input rank 1..8", false);
        return -1;
    }
    auto* creator = static_cast<IPluginCreatorV3One*>(creators[op]);
    std::vector<PluginField> fields{{"group", ranks, PluginFieldType::kINT32, n},
        {"type_id", &typeId, PluginFieldType::kINT32, 1}};
    if (torchtrt_dist::reduces(static_cast<torchtrt_dist::CollectiveOp>(op)))
    {
        fields.emplace_back("reduce_op", &reduceOp, PluginFieldType::kINT32, 1);
    }
    if (torchtrt_dist::rooted(static_cast<torchtrt_dist::CollectiveOp>(op)))
    {
        fields.emplace_back("root", &root, PluginFieldType::kINT32, 1);
    }
    PluginFieldCollection fc{static_cast<int32_t>(fields.size()), fields.data()};
    std::unique_ptr<IPluginV3> plugin(creator->createPlugin("ttd_run_plugin", &fc, TensorRTPhase::kRUNTIME));
    if (!plugin)
    {
        return -1;
    }
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    PluginTensorDesc desc{};
    desc.dims.nbDims = nbDims;
    for (int32_t i = 0; i < nbDims; ++i)
    {
        desc.dims.d[i] = dims[i];
    }
    desc.type = static_cast<DataType>(typeId);
    desc.format = TensorFormat::kLINEAR;
    desc.scale = 1.0F;
    int32_t const shaped = runtime->onShapeChange(&desc, 1, &desc, 1);
    if (shaped != 0)
    {
        return shaped;
    }
    void* outputs[1] = {output};
    void const* inputs[1] = {input};
    return runtime->enqueue(&desc, &desc, inputs, outputs, nullptr, static_cast<cudaStream_t>(stream));
}
