// Host test of the plugin library, run by ctest with the library's path as argv[1]: loads it
// the way TensorRT's IPluginRegistry::loadLibrary does (dlopen + getCreators), then checks the
// creators, their fields, plugin creation and the invalid-field errors, serialization round
// trips, output shapes through a test IExprBuilder, format support, the communicator registry,
// and that enqueue without a communicator fails with an error naming the group.
// No GPU, no TensorRT library and no NCCL call are needed.
#include <NvInferRuntime.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace
{
int gFailures = 0;

#define CHECK(cond, what)                                                                                              \
    do                                                                                                                 \
    {                                                                                                                  \
        if (!(cond))                                                                                                   \
        {                                                                                                              \
            std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, std::string(what).c_str());                 \
            ++gFailures;                                                                                               \
        }                                                                                                              \
    } while (0)

using GetCreators = IPluginCreatorInterface* const* (*) (int32_t&);
using LastError = char const* (*) ();
using Register = int32_t (*)(int32_t const*, int32_t, void*);
using Unregister = int32_t (*)(int32_t const*, int32_t);
using Find = void* (*) (int32_t const*, int32_t);
using Count = int32_t (*)();
using SetNccl = int32_t (*)(char const*);
using NcclVersion = int32_t (*)();
using RunPlugin = int32_t (*)(int32_t, int32_t const*, int32_t, int32_t, int32_t, int32_t, int64_t const*, int32_t,
    void const*, void*, void*);

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

// ---- helpers --------------------------------------------------------------------------------
struct Fields
{
    std::vector<int32_t> group{0, 2, 4, 6};
    int32_t typeId = static_cast<int32_t>(DataType::kHALF);
    int32_t reduceOp = 0;
    int32_t root = 1;
    std::vector<PluginField> list;
    PluginFieldCollection fc{};

    PluginFieldCollection const* forCreator(IPluginCreatorV3One* creator)
    {
        list.clear();
        PluginFieldCollection const* names = creator->getFieldNames();
        for (int32_t i = 0; i < names->nbFields; ++i)
        {
            std::string const name = names->fields[i].name;
            if (name == "group")
                list.emplace_back("group", group.data(), PluginFieldType::kINT32, static_cast<int32_t>(group.size()));
            else if (name == "type_id")
                list.emplace_back("type_id", &typeId, PluginFieldType::kINT32, 1);
            else if (name == "reduce_op")
                list.emplace_back("reduce_op", &reduceOp, PluginFieldType::kINT32, 1);
            else if (name == "root")
                list.emplace_back("root", &root, PluginFieldType::kINT32, 1);
        }
        fc = PluginFieldCollection{static_cast<int32_t>(list.size()), list.data()};
        return &fc;
    }
};

std::vector<std::string> fieldNames(PluginFieldCollection const* fc)
{
    std::vector<std::string> names;
    for (int32_t i = 0; i < fc->nbFields; ++i)
        names.emplace_back(fc->fields[i].name);
    return names;
}

DynamicPluginTensorDesc tensorDesc(DataType type, TensorFormat format, std::vector<int64_t> dims)
{
    DynamicPluginTensorDesc desc{};
    desc.desc.type = type;
    desc.desc.format = format;
    desc.desc.dims.nbDims = static_cast<int32_t>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i)
        desc.desc.dims.d[i] = dims[i];
    return desc;
}

// ---- how enqueue drives NCCL, through the recording stand-in (csrc/tests/nccl_recorder.cpp) ----
using RecCount = int (*)();
using RecCall = int (*)(int, char*, void const**, void**, size_t*, int*, int*, int*);
using RecReset = void (*)(int);

struct Recorded
{
    std::string fn;
    void const* send;
    void* recv;
    size_t count;
    int type;
    int op;
    int peer;
};

void checkNcclCalls(void* lib, char const* recorderPath, Register reg, Unregister unreg, RunPlugin runPlugin,
    LastError lastError)
{
    auto setNccl = reinterpret_cast<int32_t (*)(char const*)>(dlsym(lib, "ttd_set_nccl_library"));
    void* rec = dlopen(recorderPath, RTLD_NOW | RTLD_LOCAL); // the handle the library opens too
    auto recCount = rec ? reinterpret_cast<RecCount>(dlsym(rec, "recorder_call_count")) : nullptr;
    auto recCall = rec ? reinterpret_cast<RecCall>(dlsym(rec, "recorder_call")) : nullptr;
    auto recReset = rec ? reinterpret_cast<RecReset>(dlsym(rec, "recorder_reset")) : nullptr;
    CHECK(recCount && recCall && recReset, "recorder exports");
    if (!recCount || !recCall || !recReset)
        return;
    CHECK(setNccl(recorderPath) == 0, std::string("use the recorder: ") + lastError());
    auto calls = [&]() {
        std::vector<Recorded> out;
        for (int i = 0; i < recCount(); ++i)
        {
            char fn[16] = {};
            Recorded r{};
            recCall(i, fn, &r.send, &r.recv, &r.count, &r.type, &r.op, &r.peer);
            r.fn = fn;
            out.push_back(r);
        }
        return out;
    };
    int nranks = 4; // the stand-in communicator: a pointer to the rank count
    int32_t const group[] = {0, 2, 4, 6};
    CHECK(reg(group, 4, &nranks) == 0, "register the stand-in communicator");
    int64_t const dims[] = {8, 3}; // 24 elements
    alignas(8) static char input[24 * 8];
    alignas(8) static char output[96 * 8];
    auto run = [&](int32_t op, DataType type, int32_t reduceOp, int32_t root) {
        recReset(23007);
        return runPlugin(op, group, 4, static_cast<int32_t>(type), reduceOp, root, dims, 2, input, output, nullptr);
    };

    CHECK(run(0, DataType::kHALF, 2, 0) == 0, std::string("all_reduce: ") + lastError());
    auto c = calls();
    CHECK(c.size() == 1 && c[0].fn == "allReduce" && c[0].count == 24 && c[0].type == 6 && c[0].op == 2
            && c[0].send == input && c[0].recv == output,
        "all_reduce fp16 max -> ncclAllReduce(in, out, 24, ncclFloat16, ncclMax)");

    CHECK(run(1, DataType::kBF16, 0, 0) == 0, "all_gather");
    c = calls();
    CHECK(c.size() == 1 && c[0].fn == "allGather" && c[0].count == 24 && c[0].type == 9,
        "all_gather bf16 -> ncclAllGather(sendcount 24, ncclBfloat16)");

    CHECK(run(2, DataType::kINT32, 3, 0) == 0, "reduce_scatter");
    c = calls();
    CHECK(c.size() == 1 && c[0].fn == "reduceScatter" && c[0].count == 6 && c[0].type == 2 && c[0].op == 3,
        "reduce_scatter int32 min over 4 -> ncclReduceScatter(recvcount 6, ncclInt32, ncclMin)");

    CHECK(run(4, DataType::kINT64, 0, 3) == 0, "broadcast");
    c = calls();
    CHECK(c.size() == 1 && c[0].fn == "broadcast" && c[0].count == 24 && c[0].type == 4 && c[0].peer == 3,
        "broadcast int64 root 3 -> ncclBroadcast(24, ncclInt64, root 3)");

    CHECK(run(3, DataType::kFLOAT, 0, 0) == 0, "all_to_all");
    c = calls();
    bool a2a = c.size() == 10 && c.front().fn == "groupStart" && c.back().fn == "groupEnd";
    for (int peer = 0; a2a && peer < 4; ++peer)
    {
        Recorded const& s = c[static_cast<size_t>(1 + 2 * peer)];
        Recorded const& r = c[static_cast<size_t>(2 + 2 * peer)];
        a2a = s.fn == "send" && r.fn == "recv" && s.peer == peer && r.peer == peer && s.count == 6 && r.count == 6
            && s.type == 7 && s.send == input + peer * 24 && r.recv == output + peer * 24;
    }
    CHECK(a2a, "all_to_all fp32 over 4 -> one NCCL group of send/recv of 6 floats per peer at peer * 24 bytes");

    int const types[][2] = {{static_cast<int>(DataType::kINT8), 0}, {static_cast<int>(DataType::kUINT8), 1},
        {static_cast<int>(DataType::kFP8), 10}};
    for (auto const& pair : types)
    {
        CHECK(run(1, static_cast<DataType>(pair[0]), 0, 0) == 0 && calls().size() == 1 && calls()[0].type == pair[1],
            "NCCL type of type_id " + std::to_string(pair[0]));
    }
    recReset(22300); // NCCL 2.23: no fp8 (the version is read when NCCL is resolved)
    CHECK(setNccl(recorderPath) == 0, "re-resolve the recorder as NCCL 2.23");
    CHECK(runPlugin(1, group, 4, static_cast<int32_t>(DataType::kFP8), 0, 0, dims, 2, input, output, nullptr) == 3
            && std::string(lastError()).find("fp8 needs NCCL >= 2.24") != std::string::npos && calls().empty(),
        "fp8 on NCCL 2.23 refused before any NCCL call");
    recReset(23007);
    CHECK(setNccl(recorderPath) == 0, "re-resolve the recorder as NCCL 2.30");

    nranks = 2; // a communicator of another size registered for this group
    CHECK(run(0, DataType::kFLOAT, 0, 0) == 4 && calls().empty(), "a 2-rank communicator for a 4-rank group fails");
    CHECK(std::string(lastError()).find("has 2 ranks") != std::string::npos, "wrong-size message");

    int64_t const odd[] = {6, 3};
    recReset(23007);
    CHECK(runPlugin(2, group, 4, 0, 0, 0, odd, 2, input, output, nullptr) != 0 && calls().empty(),
        "reduce_scatter of 6 rows over 4 ranks fails before NCCL");
    CHECK(unreg(group, 4) == 1, "unregister the stand-in communicator");
}

} // namespace

int main(int argc, char** argv)
{
    if (argc < 2)
    {
        std::fprintf(stderr,
            "usage: plugin_host_test <libtorchtrt_dist_plugins.so> [<libnccl_recorder.so> [<libnccl.so.2>]]\n");
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr)
    {
        std::fprintf(stderr, "cannot dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    auto getCreators = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
    CHECK(getCreators != nullptr, "getCreators is exported");
    CHECK(dlsym(lib, "setLoggerFinder") != nullptr, "setLoggerFinder is exported");
    CHECK(dlsym(lib, "getPluginCreators") == nullptr, "no IPluginV2 entry point");
    auto lastError = reinterpret_cast<LastError>(dlsym(lib, "ttd_last_error"));
    auto reg = reinterpret_cast<Register>(dlsym(lib, "ttd_register_communicator"));
    auto unreg = reinterpret_cast<Unregister>(dlsym(lib, "ttd_unregister_communicator"));
    auto find = reinterpret_cast<Find>(dlsym(lib, "ttd_find_communicator"));
    auto count = reinterpret_cast<Count>(dlsym(lib, "ttd_communicator_count"));
    auto runPlugin = reinterpret_cast<RunPlugin>(dlsym(lib, "ttd_run_plugin"));
    if (!getCreators || !lastError || !reg || !unreg || !find || !count || !runPlugin)
    {
        std::fprintf(stderr, "missing exports\n");
        return 1;
    }

    // ---- creators -------------------------------------------------------------------------
    int32_t nb = 0;
    IPluginCreatorInterface* const* creators = getCreators(nb);
    CHECK(nb == 5, "five creators");
    char const* const names[] = {"TrtDistAllReduce", "TrtDistAllGather", "TrtDistReduceScatter", "TrtDistAllToAll",
        "TrtDistBroadcast"};
    std::vector<std::vector<std::string>> const expectedFields = {{"group", "type_id", "reduce_op"},
        {"group", "type_id"}, {"group", "type_id", "reduce_op"}, {"group", "type_id"}, {"group", "type_id", "root"}};
    std::vector<IPluginCreatorV3One*> v3(5, nullptr);
    for (int32_t i = 0; i < nb && i < 5; ++i)
    {
        InterfaceInfo const info = creators[i]->getInterfaceInfo();
        CHECK(std::strcmp(info.kind, "PLUGIN CREATOR_V3ONE") == 0 && info.major == 1, "creator kind V3One");
        v3[i] = static_cast<IPluginCreatorV3One*>(creators[i]);
        CHECK(std::strcmp(v3[i]->getPluginName(), names[i]) == 0, std::string("creator name ") + names[i]);
        CHECK(std::strcmp(v3[i]->getPluginVersion(), "1") == 0, "version 1");
        CHECK(std::strcmp(v3[i]->getPluginNamespace(), "torch_tensorrt_dist") == 0, "namespace");
        CHECK(fieldNames(v3[i]->getFieldNames()) == expectedFields[i], std::string("fields of ") + names[i]);
    }

    // ---- creation, core interface, serialization round trip, shapes, formats --------------
    int64_t const expectedDim0[] = {8, 32, 2, 8, 8}; // input dim 0 is 8, group of 4
    for (int32_t i = 0; i < 5; ++i)
    {
        Fields fields;
        fields.reduceOp = 2; // max
        std::unique_ptr<IPluginV3> plugin(
            v3[i]->createPlugin("layer", fields.forCreator(v3[i]), TensorRTPhase::kBUILD));
        CHECK(plugin != nullptr, std::string("create ") + names[i] + ": " + lastError());
        if (!plugin)
            continue;
        auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
        auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
        auto* runtime
            = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
        CHECK(std::strcmp(core->getPluginName(), names[i]) == 0, "core name");
        CHECK(std::strcmp(core->getPluginNamespace(), "torch_tensorrt_dist") == 0, "core namespace");
        CHECK(build->getNbOutputs() == 1, "one output");

        // round trip: the fields TensorRT serializes recreate an equal runtime plugin
        PluginFieldCollection const* saved = runtime->getFieldsToSerialize();
        CHECK(fieldNames(saved) == expectedFields[i], std::string("serialized fields of ") + names[i]);
        std::unique_ptr<IPluginV3> again(v3[i]->createPlugin("layer", saved, TensorRTPhase::kRUNTIME));
        CHECK(again != nullptr, "recreate from serialized fields");
        if (again)
        {
            auto* againRt
                = static_cast<IPluginV3OneRuntime*>(again->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
            PluginFieldCollection const* resaved = againRt->getFieldsToSerialize();
            CHECK(resaved->nbFields == saved->nbFields, "same field count");
            for (int32_t f = 0; f < saved->nbFields && f < resaved->nbFields; ++f)
            {
                CHECK(saved->fields[f].length == resaved->fields[f].length, "same field length");
                CHECK(std::memcmp(saved->fields[f].data, resaved->fields[f].data,
                          static_cast<size_t>(saved->fields[f].length) * sizeof(int32_t))
                        == 0,
                    std::string("same field ") + saved->fields[f].name);
            }
            int32_t const* group = static_cast<int32_t const*>(resaved->fields[0].data);
            CHECK(resaved->fields[0].length == 4 && group[1] == 2 && group[3] == 6, "group survives");
        }
        std::unique_ptr<IPluginV3> copy(plugin->clone());
        CHECK(copy != nullptr && copy.get() != plugin.get(), "clone");

        // output shapes
        TestExprBuilder exprs;
        DimsExprs in{};
        in.nbDims = 2;
        in.d[0] = exprs.constant(8);
        in.d[1] = exprs.constant(5);
        DimsExprs out{};
        CHECK(build->getOutputShapes(&in, 1, nullptr, 0, &out, 1, exprs) == 0, "getOutputShapes");
        CHECK(out.nbDims == 2 && out.d[0]->getConstantValue() == expectedDim0[i] && out.d[1]->getConstantValue() == 5,
            std::string("output shape of ") + names[i]);
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

        // a build-phase plugin never calls NCCL (and needs no communicator)
        PluginTensorDesc desc = tensorDesc(DataType::kHALF, TensorFormat::kLINEAR, {8, 5}).desc;
        void const* inputs[1] = {nullptr};
        void* outputs[1] = {nullptr};
        CHECK(runtime->enqueue(&desc, &desc, inputs, outputs, nullptr, nullptr) == 0, "build-phase enqueue is inert");
    }

    // configurePlugin / onShapeChange reject dims that do not split over the group
    {
        Fields fields;
        std::unique_ptr<IPluginV3> rs(v3[2]->createPlugin("rs", fields.forCreator(v3[2]), TensorRTPhase::kRUNTIME));
        auto* build = static_cast<IPluginV3OneBuild*>(rs->getCapabilityInterface(PluginCapabilityType::kBUILD));
        auto* runtime = static_cast<IPluginV3OneRuntime*>(rs->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
        DynamicPluginTensorDesc good = tensorDesc(DataType::kHALF, TensorFormat::kLINEAR, {8, 3});
        DynamicPluginTensorDesc bad = tensorDesc(DataType::kHALF, TensorFormat::kLINEAR, {6, 3});
        DynamicPluginTensorDesc dynamic = tensorDesc(DataType::kHALF, TensorFormat::kLINEAR, {-1, 3});
        CHECK(build->configurePlugin(&good, 1, &good, 1) == 0, "configure 8 over 4");
        CHECK(build->configurePlugin(&dynamic, 1, &dynamic, 1) == 0, "configure a dynamic dim 0");
        CHECK(build->configurePlugin(&bad, 1, &bad, 1) != 0, "configure 6 over 4 fails");
        CHECK(std::string(lastError()).find("not divisible") != std::string::npos, "divisibility message");
        CHECK(runtime->onShapeChange(&bad.desc, 1, &bad.desc, 1) != 0, "onShapeChange 6 over 4 fails");
        DynamicPluginTensorDesc wrongType = tensorDesc(DataType::kFLOAT, TensorFormat::kLINEAR, {8, 3});
        CHECK(build->configurePlugin(&wrongType, 1, &wrongType, 1) != 0, "configure with another type fails");
    }

    // ---- invalid fields -------------------------------------------------------------------
    struct Bad
    {
        int32_t creator;
        char const* expect;
        bool valueEdit; // edits a value: the field list is rebuilt from the values
        void (*edit)(Fields&);
    };
    Bad const bad[] = {
        {0, "missing field 'group'", false, [](Fields& f) { f.list.erase(f.list.begin()); }},
        {0, "missing field 'reduce_op'", false, [](Fields& f) { f.list.pop_back(); }},
        {4, "missing field 'root'", false, [](Fields& f) { f.list.pop_back(); }},
        {0, "distinct non-negative", true, [](Fields& f) { f.group[2] = 2; }},
        {1, "distinct non-negative", true, [](Fields& f) { f.group[0] = -1; }},
        {0, "is not sum 0", true, [](Fields& f) { f.reduceOp = 9; }},
        {0, "would round", true, [](Fields& f) {
             f.typeId = static_cast<int32_t>(DataType::kINT32);
             f.reduceOp = 4;
         }},
        {1, "type_id 4", true, [](Fields& f) { f.typeId = static_cast<int32_t>(DataType::kBOOL); }},
        {4, "root 4 is not a rank", true, [](Fields& f) { f.root = 4; }},
        {1, "unknown field 'reduce_op'", false, [](Fields& f) {
             static int32_t zero = 0;
             f.list.emplace_back("reduce_op", &zero, PluginFieldType::kINT32, 1);
         }},
        {0, "must be one INT32", false, [](Fields& f) { f.list[1].type = PluginFieldType::kINT8; }},
    };
    for (Bad const& b : bad)
    {
        Fields fields;
        fields.forCreator(v3[b.creator]);
        b.edit(fields);
        if (b.valueEdit)
            fields.forCreator(v3[b.creator]);
        fields.fc = PluginFieldCollection{static_cast<int32_t>(fields.list.size()), fields.list.data()};
        std::unique_ptr<IPluginV3> plugin(v3[b.creator]->createPlugin("bad", &fields.fc, TensorRTPhase::kBUILD));
        CHECK(plugin == nullptr, std::string("refused: ") + b.expect);
        CHECK(std::string(lastError()).find(b.expect) != std::string::npos,
            std::string("error text has '") + b.expect + "', got: " + lastError());
    }

    // ---- registry -------------------------------------------------------------------------
    int32_t const g1[] = {0, 2, 4, 6};
    int32_t const g2[] = {6, 4, 2, 0}; // another order is another group (another rank order)
    int32_t const base = count();
    int dummyA = 0, dummyB = 0;
    CHECK(reg(g1, 4, &dummyA) == 0, "register g1");
    CHECK(reg(g2, 4, &dummyB) == 0, "register g2");
    CHECK(count() == base + 2, "two entries");
    CHECK(find(g1, 4) == &dummyA && find(g2, 4) == &dummyB, "lookup by ordered ranks");
    CHECK(reg(g1, 4, nullptr) != 0, "null communicator refused");
    CHECK(reg(g1, 0, &dummyA) != 0, "empty group refused");
    CHECK(unreg(g2, 4) == 1 && unreg(g2, 4) == 0 && find(g2, 4) == nullptr, "unregister g2");
    CHECK(unreg(g1, 4) == 1 && count() == base, "unregister g1");

    // ---- enqueue without a communicator fails, naming the group ----------------------------
    int32_t const group[] = {3, 5};
    int64_t const dims[] = {4, 2};
    int32_t const status = runPlugin(0, group, 2, static_cast<int32_t>(DataType::kFLOAT), 0, 0, dims, 2,
        reinterpret_cast<void const*>(0x10), reinterpret_cast<void*>(0x20), nullptr);
    CHECK(status != 0, "enqueue without a communicator returns non-zero");
    CHECK(std::string(lastError()).find("no NCCL communicator is registered for group [3, 5]") != std::string::npos,
        std::string("error names the group, got: ") + lastError());

    // ---- NCCL resolved at run time from explicit paths: the recording stand-in (argv[2]), then
    // the real libnccl.so.2 (argv[3]): ncclGetVersion needs no GPU ----------------------------
    auto setNccl = reinterpret_cast<SetNccl>(dlsym(lib, "ttd_set_nccl_library"));
    auto ncclVersion = reinterpret_cast<NcclVersion>(dlsym(lib, "ttd_nccl_version"));
    CHECK(setNccl && ncclVersion, "NCCL exports");
    if (setNccl && ncclVersion)
    {
        CHECK(setNccl("/nonexistent/libnccl.so.2") != 0, "a missing NCCL is refused");
        CHECK(std::string(lastError()).find("cannot open NCCL: tried /nonexistent/libnccl.so.2") != std::string::npos,
            std::string("missing NCCL message, got: ") + lastError());
        if (argc > 2)
        {
            checkNcclCalls(lib, argv[2], reg, unreg, runPlugin, lastError);
        }
        if (argc > 3)
        {
            CHECK(setNccl(argv[3]) == 0, std::string("use ") + argv[3] + ": " + lastError());
            int32_t const version = ncclVersion();
            CHECK(version >= 20700, "ncclGetVersion >= 2.7.0, got " + std::to_string(version));
            std::printf("NCCL %d from %s\n", version, argv[3]);
        }
        else
        {
            std::printf("no libnccl.so.2 given: ncclGetVersion not checked\n");
        }
    }

    std::printf("%s: %d failure(s)\n", gFailures ? "FAILED" : "OK", gFailures);
    return gFailures ? 1 : 0;
}
