// Host test, shapes and formats: output shapes through a test IExprBuilder, output types,
// supportsFormatCombination, and configurePlugin / onShapeChange refusing a dim 0 that does
// not split over the group.
#include "host_test.h"

#include <deque>
#include <memory>

namespace hosttest
{
namespace
{
// ---- a test IExprBuilder: constant dimensions, evaluated eagerly --------------------------------
class ConstExprImpl : public apiv::VDimensionExpr
{
public:
    explicit ConstExprImpl(int64_t value)
        : mValue(value)
    {
    }
    bool isConstant() const override { return true; }
    int64_t getConstantValue() const override { return mValue; }
    bool isSizeTensor() const override { return false; }

private:
    int64_t mValue;
};

class ConstExpr : public IDimensionExpr
{
public:
    explicit ConstExpr(int64_t value)
        : mOwned(value)
    {
        mImpl = &mOwned;
    }

private:
    ConstExprImpl mOwned;
};

class TestExprBuilderImpl : public apiv::VExprBuilder
{
public:
    IDimensionExpr const* constant(int64_t value) override { return &mExprs.emplace_back(value); }
    IDimensionExpr const* operation(DimensionOperation op, IDimensionExpr const& a, IDimensionExpr const& b) override
    {
        int64_t const x = a.getConstantValue(), y = b.getConstantValue();
        switch (op)
        {
        case DimensionOperation::kSUM: return constant(x + y);
        case DimensionOperation::kPROD: return constant(x * y);
        case DimensionOperation::kFLOOR_DIV: return constant(x / y);
        case DimensionOperation::kCEIL_DIV: return constant((x + y - 1) / y);
        default: return nullptr;
        }
    }
    IDimensionExpr const* declareSizeTensor(int32_t, IDimensionExpr const&, IDimensionExpr const&) override
    {
        return nullptr;
    }

private:
    std::deque<ConstExpr> mExprs;
};

class TestExprBuilder : public IExprBuilder
{
public:
    TestExprBuilder() { mImpl = &mOwned; }

private:
    TestExprBuilderImpl mOwned;
};
} // namespace

void runTests(Library const& lib)
{
    int64_t const expectedDim0[] = {8, 32, 2, 8, 8}; // input dim 0 is 8, group of 4
    for (int32_t i = 0; i < 5; ++i)
    {
        Fields fields;
        fields.reduceOp = 2; // max
        std::unique_ptr<IPluginV3> plugin(
            lib.v3[i]->createPlugin("layer", fields.forCreator(lib.v3[i]), TensorRTPhase::kBUILD));
        CHECK(plugin != nullptr, std::string("create ") + kNames[i] + ": " + lib.lastError());
        if (!plugin)
            continue;
        auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));

        // output shapes
        TestExprBuilder exprs;
        DimsExprs in{};
        in.nbDims = 2;
        in.d[0] = exprs.constant(8);
        in.d[1] = exprs.constant(5);
        DimsExprs out{};
        CHECK(build->getOutputShapes(&in, 1, nullptr, 0, &out, 1, exprs) == 0, "getOutputShapes");
        CHECK(out.nbDims == 2 && out.d[0]->getConstantValue() == expectedDim0[i] && out.d[1]->getConstantValue() == 5,
            std::string("output shape of ") + kNames[i]);
        DataType outType = DataType::kFLOAT;
        DataType const inType = DataType::kHALF;
        CHECK(build->getOutputDataTypes(&outType, 1, &inType, 1) == 0 && outType == DataType::kHALF, "output type");

        // formats: linear, the declared type only
        DynamicPluginTensorDesc io[2] = {tensorDesc(DataType::kHALF, TensorFormat::kLINEAR, {8, 5}),
            tensorDesc(DataType::kHALF, TensorFormat::kLINEAR, {8, 5})};
        CHECK(build->supportsFormatCombination(0, io, 1, 1), "fp16 linear input");
        CHECK(build->supportsFormatCombination(1, io, 1, 1), "fp16 linear output");
        io[1] = tensorDesc(DataType::kFLOAT, TensorFormat::kLINEAR, {8, 5});
        CHECK(!build->supportsFormatCombination(1, io, 1, 1), "fp32 output refused for an fp16 plugin");
        io[0] = tensorDesc(DataType::kHALF, TensorFormat::kCHW2, {8, 5});
        CHECK(!build->supportsFormatCombination(0, io, 1, 1), "non-linear format refused");
        CHECK(!build->supportsFormatCombination(2, io, 1, 1), "position 2 refused");
    }

    // configurePlugin / onShapeChange reject dims that do not split over the group
    {
        Fields fields;
        std::unique_ptr<IPluginV3> rs(
            lib.v3[2]->createPlugin("rs", fields.forCreator(lib.v3[2]), TensorRTPhase::kRUNTIME));
        auto* build = static_cast<IPluginV3OneBuild*>(rs->getCapabilityInterface(PluginCapabilityType::kBUILD));
        auto* runtime = static_cast<IPluginV3OneRuntime*>(rs->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
        DynamicPluginTensorDesc good = tensorDesc(DataType::kHALF, TensorFormat::kLINEAR, {8, 3});
        DynamicPluginTensorDesc bad = tensorDesc(DataType::kHALF, TensorFormat::kLINEAR, {6, 3});
        DynamicPluginTensorDesc dynamic = tensorDesc(DataType::kHALF, TensorFormat::kLINEAR, {-1, 3});
        CHECK(build->configurePlugin(&good, 1, &good, 1) == 0, "configure 8 over 4");
        CHECK(build->configurePlugin(&dynamic, 1, &dynamic, 1) == 0, "configure a dynamic dim 0");
        CHECK(build->configurePlugin(&bad, 1, &bad, 1) != 0, "configure 6 over 4 fails");
        CHECK(std::string(lib.lastError()).find("not divisible") != std::string::npos, "divisibility message");
        CHECK(runtime->onShapeChange(&bad.desc, 1, &bad.desc, 1) != 0, "onShapeChange 6 over 4 fails");
        DynamicPluginTensorDesc wrongType = tensorDesc(DataType::kFLOAT, TensorFormat::kLINEAR, {8, 3});
        CHECK(build->configurePlugin(&wrongType, 1, &wrongType, 1) != 0, "configure with another type fails");
    }
}
} // namespace hosttest
