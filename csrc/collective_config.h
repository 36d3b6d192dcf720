// What one collective plugin does: the op, its group, dtype, reduce op and root, parsed and
// validated from TensorRT plugin fields. Pure: no TensorRT runtime call, no NCCL call.
#pragma once

#include "registry.h"

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>

namespace torchtrt_dist
{

enum class CollectiveOp : int32_t
{
    kALL_REDUCE = 0,
    kALL_GATHER = 1,
    kREDUCE_SCATTER = 2,
    kALL_TO_ALL = 3,
    kBROADCAST = 4,
};
constexpr int32_t kNB_OPS = 5;

// Reduce ops numbered as ncclRedOp_t numbers them (ncclSum 0 ... ncclAvg 4).
enum class ReduceOp : int32_t
{
    kSUM = 0,
    kPROD = 1,
    kMAX = 2,
    kMIN = 3,
    kAVG = 4,
};

constexpr char const* kPLUGIN_NAMESPACE = "torch_tensorrt_dist";
constexpr char const* kPLUGIN_VERSION = "1";

char const* pluginName(CollectiveOp op); // "TrtDistAllReduce", ...
bool reduces(CollectiveOp op);
bool rooted(CollectiveOp op);

struct CollectiveConfig
{
    CollectiveOp op{CollectiveOp::kALL_REDUCE};
    GroupRanks group;
    nvinfer1::DataType type{nvinfer1::DataType::kFLOAT};
    ReduceOp reduceOp{ReduceOp::kSUM}; // read only by all_reduce / reduce_scatter
    int32_t root{0};                   // rank within the group; read only by broadcast
};

// Parses `fields` for `op`; on failure returns false and writes why into `error`.
// Fields: group INT32[] (ordered global ranks), type_id INT32 (nvinfer1::DataType), and
// reduce_op INT32 for the reducing ops, root INT32 for broadcast. Unknown fields are errors.
bool parseFields(CollectiveOp op, nvinfer1::PluginFieldCollection const* fields,
    CollectiveConfig& config, std::string& error);

// Whether NCCL can carry `type` for `op` (and reduce it with `reduceOp`); why not in `error`.
bool supportsType(CollectiveConfig const& config, std::string& error);

size_t elementSize(nvinfer1::DataType type); // 0 for types this library does not move

} // namespace torchtrt_dist
