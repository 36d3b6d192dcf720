// One TensorRT IPluginV3 class for every collective (the op is a member), and one creator per
// op so that each creator lists exactly the fields its op takes.
#pragma once

#include "collective_config.h"

#include <NvInferRuntime.h>

#include <string>
#include <vector>

namespace torchtrt_dist
{

class CollectivePlugin : public nvinfer1::IPluginV3,
                         public nvinfer1::IPluginV3OneCore,
                         public nvinfer1::IPluginV3OneBuild,
                         public nvinfer1::IPluginV3OneRuntime
{
public:
    CollectivePlugin(CollectiveConfig config, nvinfer1::TensorRTPhase phase);
    CollectivePlugin(CollectivePlugin const& other);
    CollectivePlugin& operator=(CollectivePlugin const&) = delete;
    ~CollectivePlugin() override = default;

    CollectiveConfig const& config() const noexcept { return mConfig; }
    nvinfer1::TensorRTPhase phase() const noexcept { return mPhase; }

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
        nvinfer1::DimsExprs const* shapeInputs, int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs,
        int32_t nbOutputs, nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut,
        int32_t nbInputs, int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    bool checkDim0(int64_t dim0, std::string& error) const;

    CollectiveConfig mConfig;
    nvinfer1::TensorRTPhase mPhase;
    int32_t mTypeId{0};
    int32_t mReduceOp{0};
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

class CollectiveCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    explicit CollectiveCreator(CollectiveOp op);

    nvinfer1::IPluginV3* createPlugin(nvinfer1::AsciiChar const* name,
        nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::AsciiChar const* getPluginName() const noexcept override;
    nvinfer1::AsciiChar const* getPluginVersion() const noexcept override;
    nvinfer1::AsciiChar const* getPluginNamespace() const noexcept override;

private:
    CollectiveOp mOp;
    std::vector<nvinfer1::PluginField> mFieldNames;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

// The five creators, in CollectiveOp order (what getCreators hands TensorRT).
nvinfer1::IPluginCreatorInterface* const* allCreators(int32_t& count);

// Runs one collective on `comm` (pure NCCL; what enqueue calls once it has the communicator).
int32_t runCollective(CollectiveConfig const& config, void* comm, void const* input, void* output,
    int64_t count, cudaStream_t stream);

} // namespace torchtrt_dist
