#include "collective_config.h"

#include <cstring>
#include <set>

namespace torchtrt_dist
{
using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

char const* pluginName(CollectiveOp op)
{
    switch (op)
    {
    case CollectiveOp::kALL_REDUCE: return "TrtDistAllReduce";
    case CollectiveOp::kALL_GATHER: return "TrtDistAllGather";
    case CollectiveOp::kREDUCE_SCATTER: return "TrtDistReduceScatter";
    case CollectiveOp::kALL_TO_ALL: return "TrtDistAllToAll";
    case CollectiveOp::kBROADCAST: return "TrtDistBroadcast";
    }
    return "TrtDistUnknown";
}

bool reduces(CollectiveOp op)
{
    return op == CollectiveOp::kALL_REDUCE || op == CollectiveOp::kREDUCE_SCATTER;
}

bool rooted(CollectiveOp op)
{
    return op == CollectiveOp::kBROADCAST;
}

size_t elementSize(DataType type)
{
    switch (type)
    {
    case DataType::kFLOAT:
    case DataType::kINT32: return 4;
    case DataType::kHALF:
    case DataType::kBF16: return 2;
    case DataType::kINT8:
    case DataType::kUINT8:
    case DataType::kFP8: return 1;
    case DataType::kINT64: return 8;
    default: return 0;
    }
}

namespace
{
bool readScalar(PluginField const& field, int32_t& value, std::string& error)
{
    if (field.type != PluginFieldType::kINT32 || field.length != 1 || field.data == nullptr)
    {
        error = std::string("field '") + field.name + "' must be one INT32";
        return false;
    }
    std::memcpy(&value, field.data, sizeof(value));
    return true;
}

bool readGroup(PluginField const& field, GroupRanks& ranks, std::string& error)
{
    if (field.type != PluginFieldType::kINT32 || field.length < 1 || field.data == nullptr)
    {
        error = "field 'group' must be a non-empty INT32 array of global ranks";
        return false;
    }
    ranks.resize(static_cast<size_t>(field.length));
    std::memcpy(ranks.data(), field.data, ranks.size() * sizeof(int32_t));
    std::set<int32_t> seen;
    for (int32_t const rank : ranks)
    {
        if (rank < 0 || !seen.insert(rank).second)
        {
            error = "field 'group' " + describeGroup(ranks) +
                " must hold distinct non-negative global ranks";
            return false;
        }
    }
    return true;
}
} // namespace

bool supportsType(CollectiveConfig const& config, std::string& error)
{
    if (elementSize(config.type) == 0)
    {
        error = "type_id " + std::to_string(static_cast<int32_t>(config.type)) +
            " is not one of float32, float16, bfloat16, int8, uint8, int32, int64, fp8";
        return false;
    }
    if (!reduces(config.op))
    {
        return true;
    }
    bool const floating = config.type == DataType::kFLOAT || config.type == DataType::kHALF
        || config.type == DataType::kBF16 || config.type == DataType::kFP8;
    if (config.reduceOp == ReduceOp::kAVG && !floating)
    {
        error = "reduce_op avg on an integer type would round; cast to a floating type first";
        return false;
    }
    return true;
}

bool parseFields(CollectiveOp op, nvinfer1::PluginFieldCollection const* fields,
    CollectiveConfig& config, std::string& error)
{
    std::string const prefix = std::string(pluginName(op)) + ": ";
    config = CollectiveConfig{};
    config.op = op;
    bool haveGroup = false, haveType = false, haveReduce = false, haveRoot = false;
    int32_t const count = fields ? fields->nbFields : 0;
    for (int32_t i = 0; i < count; ++i)
    {
        PluginField const& field = fields->fields[i];
        std::string const name = field.name ? field.name : "";
        int32_t value = 0;
        if (name == "group")
        {
            haveGroup = readGroup(field, config.group, error);
            if (!haveGroup)
            {
                error = prefix + error;
                return false;
            }
        }
        else if (name == "type_id")
        {
            if (!readScalar(field, value, error))
            {
                error = prefix + error;
                return false;
            }
            config.type = static_cast<DataType>(value);
            haveType = true;
        }
        else if (name == "reduce_op" && reduces(op))
        {
            if (!readScalar(field, value, error))
            {
                error = prefix + error;
                return false;
            }
            if (value < 0 || value > static_cast<int32_t>(ReduceOp::kAVG))
            {
                error = prefix + "reduce_op " + std::to_string(value)
                    + " is not sum 0, prod 1, max 2, min 3 or avg 4";
                return false;
            }
            config.reduceOp = static_cast<ReduceOp>(value);
            haveReduce = true;
        }
        else if (name == "root" && rooted(op))
        {
            if (!readScalar(field, value, error))
            {
                error = prefix + error;
                return false;
            }
            config.root = value;
            haveRoot = true;
        }
        else
        {
            error = prefix + "unknown field '" + name + "'";
            return false;
        }
    }
    char const* missing = !haveGroup ? "group"
        : !haveType                  ? "type_id"
        : reduces(op) && !haveReduce ? "reduce_op"
        : rooted(op) && !haveRoot    ? "root"
                                     : nullptr;
    if (missing != nullptr)
    {
        error = prefix + "missing field '" + missing + "'";
        return false;
    }
    if (rooted(op) && (config.root < 0 || config.root >= static_cast<int32_t>(config.group.size())))
    {
        error = prefix + "root " + std::to_string(config.root) + " is not a rank of the group "
            + describeGroup(config.group) + " (it is a rank within the group)";
        return false;
    }
    if (!supportsType(config, error))
    {
        error = prefix + error;
        return false;
    }
    return true;
}

} // namespace torchtrt_dist
