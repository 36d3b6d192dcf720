// Shared by the host tests of the plugin library (csrc/tests/*_test.cpp). Each test is its own
// executable, run by ctest with the library's path as argv[1] (then the recording NCCL stand-in
// and a real libnccl.so.2, for enqueue_test): host_test_main.cpp loads the library the way
// TensorRT's IPluginRegistry::loadLibrary does (dlopen + getCreators) and calls runTests().
// No GPU, no TensorRT library and no NCCL call are needed.
#pragma once

#include <NvInferRuntime.h>

#include <cstdio>
#include <string>
#include <vector>

namespace hosttest
{
using namespace nvinfer1;

extern int gFailures;

#define CHECK(cond, what)                                                                                              \
    do                                                                                                                 \
    {                                                                                                                  \
        if (!(cond))                                                                                                   \
        {                                                                                                              \
            std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, std::string(what).c_str());                 \
            ++hosttest::gFailures;                                                                                     \
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

// The loaded library: its handle, its exports, its five creators, and the other arguments.
struct Library
{
    void* handle = nullptr;
    GetCreators getCreators = nullptr;
    LastError lastError = nullptr;
    Register reg = nullptr;
    Unregister unreg = nullptr;
    Find find = nullptr;
    Count count = nullptr;
    RunPlugin runPlugin = nullptr;
    std::vector<IPluginCreatorV3One*> v3; // in the order of kNames
    std::vector<char const*> args;        // argv[2:]: the NCCL recorder, a real libnccl.so.2
};

// The creators, in getCreators order, and the fields each lists.
extern char const* const kNames[5];
extern std::vector<std::vector<std::string>> const kExpectedFields;

// Field values for a creator, in the order its getFieldNames lists them.
struct Fields
{
    std::vector<int32_t> group{0, 2, 4, 6};
    int32_t typeId = static_cast<int32_t>(DataType::kHALF);
    int32_t reduceOp = 0;
    int32_t root = 1;
    std::vector<PluginField> list;
    PluginFieldCollection fc{};

    PluginFieldCollection const* forCreator(IPluginCreatorV3One* creator);
};

std::vector<std::string> fieldNames(PluginFieldCollection const* fc);
DynamicPluginTensorDesc tensorDesc(DataType type, TensorFormat format, std::vector<int64_t> dims);

// Defined by each test file: its checks (failures counted through CHECK).
void runTests(Library const& lib);
} // namespace hosttest
