// Host test, creators and fields: the entry points TensorRT's loadLibrary looks for, each
// creator's name, version, namespace and field list, plugin creation and the plugin's core
// interface, and every invalid-field error.
#include "host_test.h"

#include <dlfcn.h>

#include <cstring>
#include <memory>

namespace hosttest
{
void runTests(Library const& lib)
{
    CHECK(dlsym(lib.handle, "getCreators") != nullptr, "getCreators is exported");
    CHECK(dlsym(lib.handle, "setLoggerFinder") != nullptr, "setLoggerFinder is exported");
    CHECK(dlsym(lib.handle, "getPluginCreators") == nullptr, "no IPluginV2 entry point");

    // ---- creators -------------------------------------------------------------------------
    for (int32_t i = 0; i < 5; ++i)
    {
        IPluginCreatorV3One* creator = lib.v3[i];
        InterfaceInfo const info = creator->getInterfaceInfo();
        CHECK(std::strcmp(info.kind, "PLUGIN CREATOR_V3ONE") == 0 && info.major == 1, "creator kind V3One");
        CHECK(std::strcmp(creator->getPluginName(), kNames[i]) == 0, std::string("creator name ") + kNames[i]);
        CHECK(std::strcmp(creator->getPluginVersion(), "1") == 0, "version 1");
        CHECK(std::strcmp(creator->getPluginNamespace(), "torch_tensorrt_dist") == 0, "namespace");
        CHECK(fieldNames(creator->getFieldNames()) == kExpectedFields[i], std::string("fields of ") + kNames[i]);
    }

    // ---- creation and the core interface ---------------------------------------------------
    for (int32_t i = 0; i < 5; ++i)
    {
        Fields fields;
        fields.reduceOp = 2; // max
        std::unique_ptr<IPluginV3> plugin(
            lib.v3[i]->createPlugin("layer", fields.forCreator(lib.v3[i]), TensorRTPhase::kBUILD));
        CHECK(plugin != nullptr, std::string("create ") + kNames[i] + ": " + lib.lastError());
        if (!plugin)
            continue;
        auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
        auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
        CHECK(std::strcmp(core->getPluginName(), kNames[i]) == 0, "core name");
        CHECK(std::strcmp(core->getPluginNamespace(), "torch_tensorrt_dist") == 0, "core namespace");
        CHECK(build->getNbOutputs() == 1, "one output");
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
        fields.forCreator(lib.v3[b.creator]);
        b.edit(fields);
        if (b.valueEdit)
            fields.forCreator(lib.v3[b.creator]);
        fields.fc = PluginFieldCollection{static_cast<int32_t>(fields.list.size()), fields.list.data()};
        std::unique_ptr<IPluginV3> plugin(lib.v3[b.creator]->createPlugin("bad", &fields.fc, TensorRTPhase::kBUILD));
        CHECK(plugin == nullptr, std::string("refused: ") + b.expect);
        CHECK(std::string(lib.lastError()).find(b.expect) != std::string::npos,
            std::string("error text has '") + b.expect + "', got: " + lib.lastError());
    }
}
} // namespace hosttest
