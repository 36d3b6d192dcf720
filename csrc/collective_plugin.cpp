#include "collective_plugin.h"

#include "errors.h"
#include "nccl_api.h"

#include <cstdio>
#include <mutex>
#include <new>

namespace torchtrt_dist
{
using namespace nvinfer1;

namespace
{
int64_t volume(Dims const& dims)
{
    int64_t n = 1;
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        n *= dims.d[i];
    }
    return n;
}

ncclDataType_t ncclType(DataType type)
{
    switch (type)
    {
    case DataType::kFLOAT: return ncclFloat32;
    case DataType::kHALF: return ncclFloat16;
    case DataType::kBF16: return ncclBfloat16;
    case DataType::kINT8: return ncclInt8;
    case DataType::kUINT8: return ncclUint8;
    case DataType::kINT32: return ncclInt32;
    case DataType::kINT64: return ncclInt64;
    case DataType::kFP8: return static_cast<ncclDataType_t>(10); // ncclFloat8e4m3, NCCL >= 2.24
    default: return ncclNumTypes;
    }
}

std::string opLabel(CollectiveConfig const& config)
{
    return std::string(pluginName(config.op)) + " over ranks " + describeGroup(config.group);
}
} // namespace

CollectivePlugin::CollectivePlugin(CollectiveConfig config, TensorRTPhase phase)
    : mConfig(std::move(config))
    , mPhase(phase)
{
    mTypeId = static_cast<int32_t>(mConfig.type);
    mReduceOp = static_cast<int32_t>(mConfig.reduceOp);
    mFields.emplace_back("group", mConfig.group.data(), PluginFieldType::kINT32,
        static_cast<int32_t>(mConfig.group.size()));
    mFields.emplace_back("type_id", &mTypeId, PluginFieldType::kINT32, 1);
    if (reduces(mConfig.op))
    {
        mFields.emplace_back("reduce_op", &mReduceOp, PluginFieldType::kINT32, 1);
    }
    if (rooted(mConfig.op))
    {
        mFields.emplace_back("root", &mConfig.root, PluginFieldType::kINT32, 1);
    }
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
}

CollectivePlugin::CollectivePlugin(CollectivePlugin const& other)
    : CollectivePlugin(other.mConfig, other.mPhase)
{
}

IPluginCapability* CollectivePlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* CollectivePlugin::clone() noexcept
{
    return new (std::nothrow) CollectivePlugin(*this);
}

char const* CollectivePlugin::getPluginName() const noexcept
{
    return pluginName(mConfig.op);
}

char const* CollectivePlugin::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

char const* CollectivePlugin::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

bool CollectivePlugin::checkDim0(int64_t dim0, std::string& error) const
{
    int64_t const n = static_cast<int64_t>(mConfig.group.size());
    bool const splits = mConfig.op == CollectiveOp::kREDUCE_SCATTER || mConfig.op == CollectiveOp::kALL_TO_ALL;
    if (splits && dim0 >= 0 && dim0 % n != 0)
    {
        error = opLabel(mConfig) + ": dim 0 (" + std::to_string(dim0) + ") is not divisible by the group size "
            + std::to_string(n);
        return false;
    }
    return true;
}

int32_t CollectivePlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const*, int32_t nbOutputs) noexcept
{
    std::string error;
    if (nbInputs != 1 || nbOutputs != 1)
    {
        setLastError(opLabel(mConfig) + ": takes one input and one output");
        return 1;
    }
    if (in[0].desc.type != mConfig.type)
    {
        setLastError(opLabel(mConfig) + ": the input's type differs from type_id");
        return 1;
    }
    if (in[0].desc.dims.nbDims < 1 || !checkDim0(in[0].desc.dims.d[0], error))
    {
        setLastError(error.empty() ? opLabel(mConfig) + ": needs an input of rank >= 1" : error);
        return 1;
    }
    return 0;
}

int32_t CollectivePlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbOutputs != 1 || nbInputs != 1)
    {
        return 1;
    }
    outputTypes[0] = inputTypes[0];
    return 0;
}

int32_t CollectivePlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const*, int32_t,
    DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& exprBuilder) noexcept
{
    if (nbInputs != 1 || nbOutputs != 1 || inputs[0].nbDims < 1)
    {
        setLastError(opLabel(mConfig) + ": needs one input of rank >= 1 and one output");
        return 1;
    }
    outputs[0] = inputs[0];
    auto const* n = exprBuilder.constant(static_cast<int64_t>(mConfig.group.size()));
    if (mConfig.op == CollectiveOp::kALL_GATHER)
    {
        outputs[0].d[0] = exprBuilder.operation(DimensionOperation::kPROD, *inputs[0].d[0], *n);
    }
    else if (mConfig.op == CollectiveOp::kREDUCE_SCATTER)
    {
        outputs[0].d[0] = exprBuilder.operation(DimensionOperation::kFLOOR_DIV, *inputs[0].d[0], *n);
    }
    return 0;
}

bool CollectivePlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (nbInputs != 1 || nbOutputs != 1 || pos < 0 || pos > 1)
    {
        return false;
    }
    PluginTensorDesc const& desc = inOut[pos].desc;
    return desc.format == TensorFormat::kLINEAR && desc.type == mConfig.type;
}

int32_t CollectivePlugin::getNbOutputs() const noexcept
{
    return 1;
}

int32_t CollectivePlugin::onShapeChange(PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const*,
    int32_t nbOutputs) noexcept
{
    std::string error;
    if (nbInputs != 1 || nbOutputs != 1 || in[0].dims.nbDims < 1)
    {
        setLastError(opLabel(mConfig) + ": needs one input of rank >= 1 and one output");
        return 1;
    }
    if (!checkDim0(in[0].dims.d[0], error))
    {
        setLastError(error);
        return 1;
    }
    return 0;
}

int32_t CollectivePlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const*,
    void const* const* inputs, void* const* outputs, void*, cudaStream_t stream) noexcept
{
    if (mPhase == TensorRTPhase::kBUILD)
    {
        // The builder may run one rank's plugin alone to time it; a collective there would
        // wait for peers that are not running it. Build-phase plugins never call NCCL. An
        // engine must be serialized and deserialized (runtime plugins) before it runs: say so
        // once, in case one is ever run with its build-phase plugins.
        static std::once_flag said;
        std::call_once(said, [] {
            std::fprintf(stderr,
                "torch_tensorrt_dist plugins: a build-phase plugin skipped its collective (expected "
                "while TensorRT times layers; an engine that runs must be deserialized first)\n");
        });
        return 0;
    }
    void* comm = findCommunicator(mConfig.group);
    if (comm == nullptr)
    {
        setLastError(opLabel(mConfig) + ": no NCCL communicator is registered for group "
            + describeGroup(mConfig.group)
            + "; call torch_tensorrt_dist.conversion.register_communicator(group) on every rank of the "
              "group before the engine runs");
        return 1;
    }
    std::string error;
    if (inputDesc[0].dims.nbDims < 1 || !checkDim0(inputDesc[0].dims.d[0], error))
    {
        setLastError(error.empty() ? opLabel(mConfig) + ": needs an input of rank >= 1" : error);
        return 1;
    }
    return runCollective(mConfig, comm, inputs[0], outputs[0], volume(inputDesc[0].dims), stream);
}

int32_t runCollective(CollectiveConfig const& config, void* commPtr, void const* input, void* output, int64_t count,
    cudaStream_t stream)
{
    NcclApi const* nccl = ncclApi();
    if (nccl == nullptr)
    {
        return 2; // the last error says why
    }
    auto const comm = static_cast<ncclComm_t>(commPtr);
    ncclDataType_t const type = ncclType(config.type);
    if (type == ncclNumTypes || (config.type == DataType::kFP8 && nccl->version < 22400))
    {
        setLastError(opLabel(config) + ": NCCL " + std::to_string(nccl->version) + " at " + nccl->path
            + " cannot carry type_id " + std::to_string(static_cast<int32_t>(config.type))
            + " (fp8 needs NCCL >= 2.24)");
        return 3;
    }
    int nranks = 0;
    if (nccl->commCount(comm, &nranks) != ncclSuccess || nranks != static_cast<int>(config.group.size()))
    {
        setLastError(opLabel(config) + ": the communicator registered for this group has " + std::to_string(nranks)
            + " ranks; register the communicator of this very group");
        return 4;
    }
    auto const n = static_cast<size_t>(nranks);
    auto const elements = static_cast<size_t>(count);
    auto const redOp = static_cast<ncclRedOp_t>(config.reduceOp);
    ncclResult_t result = ncclSuccess;
    switch (config.op)
    {
    case CollectiveOp::kALL_REDUCE:
        result = nccl->allReduce(input, output, elements, type, redOp, comm, stream);
        break;
    case CollectiveOp::kALL_GATHER: result = nccl->allGather(input, output, elements, type, comm, stream); break;
    case CollectiveOp::kREDUCE_SCATTER:
        result = nccl->reduceScatter(input, output, elements / n, type, redOp, comm, stream);
        break;
    case CollectiveOp::kBROADCAST:
        result = nccl->broadcast(input, output, elements, type, config.root, comm, stream);
        break;
    case CollectiveOp::kALL_TO_ALL:
    {
        size_t const chunk = elements / n;
        size_t const bytes = chunk * elementSize(config.type);
        result = nccl->groupStart();
        for (size_t peer = 0; peer < n && result == ncclSuccess; ++peer)
        {
            result = nccl->send(static_cast<char const*>(input) + peer * bytes, chunk, type, static_cast<int>(peer),
                comm, stream);
            if (result == ncclSuccess)
            {
                result = nccl->recv(static_cast<char*>(output) + peer * bytes, chunk, type, static_cast<int>(peer),
                    comm, stream);
            }
        }
        ncclResult_t const ended = nccl->groupEnd();
        result = result == ncclSuccess ? ended : result;
        break;
    }
    }
    if (result != ncclSuccess)
    {
        setLastError(opLabel(config) + ": NCCL failed: " + nccl->getErrorString(result));
        return 5;
    }
    return 0;
}

IPluginV3* CollectivePlugin::attachToContext(IPluginResourceContext*) noexcept
{
    return clone();
}

PluginFieldCollection const* CollectivePlugin::getFieldsToSerialize() noexcept
{
    return &mFieldCollection;
}

CollectiveCreator::CollectiveCreator(CollectiveOp op)
    : mOp(op)
{
    mFieldNames.emplace_back("group", nullptr, PluginFieldType::kINT32, 0);
    mFieldNames.emplace_back("type_id", nullptr, PluginFieldType::kINT32, 1);
    if (reduces(op))
    {
        mFieldNames.emplace_back("reduce_op", nullptr, PluginFieldType::kINT32, 1);
    }
    if (rooted(op))
    {
        mFieldNames.emplace_back("root", nullptr, PluginFieldType::kINT32, 1);
    }
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFieldCollection.fields = mFieldNames.data();
}

IPluginV3* CollectiveCreator::createPlugin(AsciiChar const* name, PluginFieldCollection const* fc,
    TensorRTPhase phase) noexcept
{
    CollectiveConfig config;
    std::string error;
    if (!parseFields(mOp, fc, config, error))
    {
        setLastError(error + (name ? std::string(" (layer ") + name + ")" : std::string()));
        return nullptr;
    }
    return new (std::nothrow) CollectivePlugin(std::move(config), phase);
}

PluginFieldCollection const* CollectiveCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

AsciiChar const* CollectiveCreator::getPluginName() const noexcept
{
    return pluginName(mOp);
}

AsciiChar const* CollectiveCreator::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

AsciiChar const* CollectiveCreator::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

IPluginCreatorInterface* const* allCreators(int32_t& count)
{
    static CollectiveCreator allReduce(CollectiveOp::kALL_REDUCE);
    static CollectiveCreator allGather(CollectiveOp::kALL_GATHER);
    static CollectiveCreator reduceScatter(CollectiveOp::kREDUCE_SCATTER);
    static CollectiveCreator allToAll(CollectiveOp::kALL_TO_ALL);
    static CollectiveCreator broadcast(CollectiveOp::kBROADCAST);
    static IPluginCreatorInterface* const creators[kNB_OPS]
        = {&allReduce, &allGather, &reduceScatter, &allToAll, &broadcast};
    count = kNB_OPS;
    return creators;
}

} // namespace torchtrt_dist
