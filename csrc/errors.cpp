#include "errors.h"

#include <cstdio>

namespace torchtrt_dist
{
namespace
{
thread_local std::string gLastError;
}

void setLastError(std::string const& message, bool print)
{
    gLastError = message;
    if (print)
    {
        std::fprintf(stderr, "[torch_tensorrt_dist plugins] error: %s\n", message.c_str());
    }
}

std::string const& lastError()
{
    return gLastError;
}

void clearLastError()
{
    gLastError.clear();
}

} // namespace torchtrt_dist
