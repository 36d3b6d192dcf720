// main() of every host test (host_test.h): load the library as TensorRT does, check its
// exports, hand it to the test file's runTests(), report the failures.
#include "host_test.h"

#include <dlfcn.h>

#include <cstring>

namespace hosttest
{
int gFailures = 0;

char const* const kNames[5]
    = {"TrtDistAllReduce", "TrtDistAllGather", "TrtDistReduceScatter", "TrtDistAllToAll", "TrtDistBroadcast"};
std::vector<std::vector<std::string>> const kExpectedFields = {{"group", "type_id", "reduce_op"},
    {"group", "type_id"}, {"group", "type_id", "reduce_op"}, {"group", "type_id"}, {"group", "type_id", "root"}};

PluginFieldCollection const* Fields::forCreator(IPluginCreatorV3One* creator)
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
} // namespace hosttest

int main(int argc, char** argv)
{
    using namespace hosttest;
    if (argc < 2)
    {
        std::fprintf(stderr, "usage: %s <libtorchtrt_dist_plugins.so> [<libnccl_recorder.so> [<libnccl.so.2>]]\n",
            argv[0]);
        return 2;
    }
    Library lib;
    lib.handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib.handle == nullptr)
    {
        std::fprintf(stderr, "cannot dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    lib.getCreators = reinterpret_cast<GetCreators>(dlsym(lib.handle, "getCreators"));
    lib.lastError = reinterpret_cast<LastError>(dlsym(lib.handle, "ttd_last_error"));
    lib.reg = reinterpret_cast<Register>(dlsym(lib.handle, "ttd_register_communicator"));
    lib.unreg = reinterpret_cast<Unregister>(dlsym(lib.handle, "ttd_unregister_communicator"));
    lib.find = reinterpret_cast<Find>(dlsym(lib.handle, "ttd_find_communicator"));
    lib.count = reinterpret_cast<Count>(dlsym(lib.handle, "ttd_communicator_count"));
    lib.runPlugin = reinterpret_cast<RunPlugin>(dlsym(lib.handle, "ttd_run_plugin"));
    if (!lib.getCreators || !lib.lastError || !lib.reg || !lib.unreg || !lib.find || !lib.count || !lib.runPlugin)
    {
        std::fprintf(stderr, "missing exports\n");
        return 1;
    }
    int32_t nb = 0;
    IPluginCreatorInterface* const* creators = lib.getCreators(nb);
    if (nb != 5)
    {
        std::fprintf(stderr, "getCreators returned %d creators, not 5\n", nb);
        return 1;
    }
    for (int32_t i = 0; i < nb; ++i)
    {
        InterfaceInfo const info = creators[i]->getInterfaceInfo();
        if (std::strcmp(info.kind, "PLUGIN CREATOR_V3ONE") != 0 || info.major != 1)
        {
            std::fprintf(stderr, "creator %d is a %s v%d, not a PLUGIN CREATOR_V3ONE v1\n", i, info.kind, info.major);
            return 1;
        }
        lib.v3.push_back(static_cast<IPluginCreatorV3One*>(creators[i]));
    }
    for (int i = 2; i < argc; ++i)
        lib.args.push_back(argv[i]);

    runTests(lib);
    std::printf("%s: %d failure(s)\n", gFailures ? "FAILED" : "OK", gFailures);
    return gFailures ? 1 : 0;
}
