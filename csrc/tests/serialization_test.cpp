// Host test, serialization: the fields TensorRT serializes (getFieldsToSerialize) recreate an
// equal runtime plugin for every creator, and clone makes a distinct copy.
#include "host_test.h"

#include <cstring>
#include <memory>

namespace hosttest
{
void runTests(Library const& lib)
{
    for (int32_t i = 0; i < 5; ++i)
    {
        Fields fields;
        fields.reduceOp = 2; // max
        std::unique_ptr<IPluginV3> plugin(
            lib.v3[i]->createPlugin("layer", fields.forCreator(lib.v3[i]), TensorRTPhase::kBUILD));
        CHECK(plugin != nullptr, std::string("create ") + kNames[i] + ": " + lib.lastError());
        if (!plugin)
            continue;
        auto* runtime
            = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));

        // round trip: the fields TensorRT serializes recreate an equal runtime plugin
        PluginFieldCollection const* saved = runtime->getFieldsToSerialize();
        CHECK(fieldNames(saved) == kExpectedFields[i], std::string("serialized fields of ") + kNames[i]);
        std::unique_ptr<IPluginV3> again(lib.v3[i]->createPlugin("layer", saved, TensorRTPhase::kRUNTIME));
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
    }
}
} // namespace hosttest
