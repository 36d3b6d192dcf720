// Host test, enqueue and registry: a build-phase enqueue is inert; the communicator registry;
// a runtime enqueue without a communicator fails naming the group; through the recording
// stand-in for libnccl.so.2 (argv[2], csrc/tests/nccl_recorder.cpp), how enqueue drives NCCL
// for every op; and ncclGetVersion of a real libnccl.so.2 (argv[3]).
#include "host_test.h"

#include <dlfcn.h>

#include <memory>

namespace hosttest
{
namespace
{
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

void checkNcclCalls(Library const& lib, char const* recorderPath)
{
    Register reg = lib.reg;
    Unregister unreg = lib.unreg;
    RunPlugin runPlugin = lib.runPlugin;
    LastError lastError = lib.lastError;
    auto setNccl = reinterpret_cast<SetNccl>(dlsym(lib.handle, "ttd_set_nccl_library"));
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

void runTests(Library const& lib)
{
    Register reg = lib.reg;
    Unregister unreg = lib.unreg;
    Find find = lib.find;
    Count count = lib.count;
    RunPlugin runPlugin = lib.runPlugin;
    LastError lastError = lib.lastError;

    // a build-phase plugin never calls NCCL (and needs no communicator)
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
        PluginTensorDesc desc = tensorDesc(DataType::kHALF, TensorFormat::kLINEAR, {8, 5}).desc;
        void const* inputs[1] = {nullptr};
        void* outputs[1] = {nullptr};
        CHECK(runtime->enqueue(&desc, &desc, inputs, outputs, nullptr, nullptr) == 0, "build-phase enqueue is inert");
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
    auto setNccl = reinterpret_cast<SetNccl>(dlsym(lib.handle, "ttd_set_nccl_library"));
    auto ncclVersion = reinterpret_cast<NcclVersion>(dlsym(lib.handle, "ttd_nccl_version"));
    CHECK(setNccl && ncclVersion, "NCCL exports");
    if (setNccl && ncclVersion)
    {
        CHECK(setNccl("/nonexistent/libnccl.so.2") != 0, "a missing NCCL is refused");
        CHECK(std::string(lastError()).find("cannot open NCCL: tried /nonexistent/libnccl.so.2") != std::string::npos,
            std::string("missing NCCL message, got: ") + lastError());
        if (!lib.args.empty())
        {
            checkNcclCalls(lib, lib.args[0]);
        }
        if (lib.args.size() > 1)
        {
            CHECK(setNccl(lib.args[1]) == 0, std::string("use ") + lib.args[1] + ": " + lastError());
            int32_t const version = ncclVersion();
            CHECK(version >= 20700, "ncclGetVersion >= 2.7.0, got " + std::to_string(version));
            std::printf("NCCL %d from %s\n", version, lib.args[1]);
        }
        else
        {
            std::printf("no libnccl.so.2 given: ncclGetVersion not checked\n");
        }
    }
}
} // namespace hosttest
